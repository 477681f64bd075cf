"""Encoding one search query fast from a cold process: the same model, exported once to ONNX.

Loading sentence-transformers costs a cold ``sluice search`` several seconds before the first
result (importing transformers alone takes most of it). For the one short text a search encodes,
the worker exports the model once to ONNX (``export``) into the data directory, and a search runs
it with onnxruntime and the model's own fast tokenizer: the same tokens, the same mean pooling and
normalisation as the model's sentence-transformers modules, in a fraction of a second.

Only models made of Transformer, mean Pooling and Normalize modules (all-MiniLM-L6-v2 is one) are
exported; for any other, and until the export exists, search uses the full embedder.

A worker exports in a child process of its own (``Exporter``; ``python -m`` this module), at the
lowest CPU priority: a stop ends the child at once, where an export in a thread of the worker held
its stop for seconds and could abort it (a thread inside torch at the interpreter's teardown).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from sluice import faults
from sluice.pipeline.running.embed import import_lock

if TYPE_CHECKING:  # imported by the encoder when it runs (onnxruntime needs it then anyway)
    import numpy as np

log = logging.getLogger(__name__)

EXPORT_VERSION = 2  # bump when the export or the pooling here changes (2: weights beside the graph)
_lock = threading.Lock()


def _modules(model_dir: Path) -> list[str]:
    try:
        return [
            m["type"].rsplit(".", 1)[-1]
            for m in json.loads((model_dir / "modules.json").read_text())
        ]
    except (OSError, ValueError, KeyError):
        return []


def exportable(model_dir: Path) -> bool:
    """True for a Transformer + mean Pooling (+ Normalize) model with a fast tokenizer."""
    if (
        _modules(model_dir)[:2] != ["Transformer", "Pooling"]
        or not (model_dir / "tokenizer.json").exists()
    ):
        return False
    try:
        pooling = json.loads((model_dir / "1_Pooling" / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(pooling.get("pooling_mode_mean_tokens")) and not any(
        pooling.get(k) for k in ("pooling_mode_cls_token", "pooling_mode_max_tokens")
    )


def export_path(model_dir: Path, data_dir: Path) -> Path:
    """Where the export of this model lives: named after the model's weights, so a changed model
    never finds a stale export."""
    weights = next(
        (
            model_dir / n
            for n in ("model.safetensors", "pytorch_model.bin")
            if (model_dir / n).exists()
        ),
        model_dir / "config.json",
    )
    stat = weights.stat()
    key = hashlib.sha256(
        f"{model_dir.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:{EXPORT_VERSION}".encode()
    )
    return data_dir / "models" / f"query-encoder-{key.hexdigest()[:16]}.onnx"


def export(model_dir: Path, data_dir: Path) -> Path | None:
    """Export the model's transformer to ONNX once (needs torch, transformers and onnx); returns the
    file, or None when the model cannot be exported. Safe to call from several processes."""
    if not exportable(model_dir):
        return None
    out = export_path(model_dir, data_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    with _lock, _across_processes(out):
        if out.exists():
            return out
        for stale in out.parent.glob(f"{out.stem}.*.tmp*"):  # of an exporter that was stopped
            stale.unlink(missing_ok=True)
        faults.hit("query_export")
        with import_lock:  # never beside another thread's import of transformers (see embed)
            import torch
            import torch.onnx
            from transformers import AutoModel
            from transformers.utils import logging as transformers_logging

            transformers_logging.disable_progress_bar()  # no "Loading weights" bar in the log
            model = AutoModel.from_pretrained(str(model_dir)).eval()

        class Hidden(
            torch.nn.Module
        ):  # keyword arguments: forward's positional order differs by version
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, input_ids, attention_mask, token_type_ids):
                return self.inner(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    token_type_ids=token_type_ids,
                ).last_hidden_state

        sample = torch.ones((1, 8), dtype=torch.long)
        axes = {0: "batch", 1: "tokens"}
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        with torch.no_grad():
            torch.onnx.export(
                Hidden(model),
                (sample, sample, torch.zeros_like(sample)),
                str(tmp),
                input_names=["input_ids", "attention_mask", "token_type_ids"],
                output_names=["hidden"],
                opset_version=17,
                dynamo=False,
                dynamic_axes={
                    "input_ids": axes,
                    "attention_mask": axes,
                    "token_type_ids": axes,
                    "hidden": axes,
                },
            )
        _weights_beside(tmp, out)
        os.replace(tmp, out)
        log.info("exported the query encoder to %s", out)
        return out


class Exporter:
    """``export`` in a child process at the lowest CPU priority, which ``stop`` ends at once (the
    export is made again by the next start: nothing half-made is ever used)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._child: subprocess.Popen[bytes] | None = None
        self._stopped = False

    def run(self, model_dir: Path, data_dir: Path) -> int | None:
        """Export and wait; the child's exit code (None: stopped before it started)."""
        with self._lock:
            if self._stopped:
                return None
            self._child = subprocess.Popen(
                [sys.executable, "-m", __name__, str(model_dir), str(data_dir)],
                stdin=subprocess.DEVNULL,
            )
        return self._child.wait()

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            child = self._child
        if child is not None and child.poll() is None:
            child.kill()
            child.wait()


def weights_path(onnx_file: Path) -> Path:
    """The file of the export's weights, beside its graph."""
    return onnx_file.with_name(f"{onnx_file.name}.data")


def _weights_beside(graph: Path, out: Path) -> None:
    """Move the weights out of the exported graph into ``weights_path(out)``: onnxruntime maps that
    file into memory instead of parsing 90 MB of protobuf, which took a cold session's start from
    0.26 s to 0.05 s of CPU (measured beside each other at load 6). Written before the graph is put
    in place, under the export's lock, so a reader that finds the graph finds all its weights."""
    import onnx

    weights = weights_path(out)
    weights.unlink(missing_ok=True)  # onnx appends to a file that is there
    model = onnx.load(str(graph))
    onnx.save_model(
        model,
        str(graph),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=weights.name,
        size_threshold=1024,
    )


@contextmanager
def _across_processes(out: Path) -> Iterator[None]:
    """One exporter at a time for ``out``, whichever process it runs in (the weights' file has one
    name, so two exports at once would write into each other's)."""
    import fcntl

    with open(out.with_name(f"{out.name}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class OnnxQueryEncoder:
    """Encodes texts with the exported transformer, mean pooling over real tokens, unit length."""

    def __init__(self, model_dir: Path, onnx_file: Path, *, model_id: str, dim: int) -> None:
        import onnxruntime
        from tokenizers import Tokenizer

        self.model_id, self.dim, self.precision = model_id, dim, "fp32"
        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        try:
            limit = json.loads((model_dir / "sentence_bert_config.json").read_text())[
                "max_seq_length"
            ]
        except (OSError, ValueError, KeyError):
            limit = 256
        self.tokenizer.enable_truncation(max_length=int(limit))
        self.tokenizer.enable_padding()
        # A session for a few short texts: building it is most of the encoder's cold start. The
        # basic graph rewrites (constant folding, redundant nodes) keep the same operators; the
        # fusions of the higher levels and the pre-packing of the weights for the GEMM kernels
        # cost more at start than they save on one query (measured at load 4: a median of 0.37 s
        # against 0.20 s to the session; the hidden states equal to 2e-6, and
        # tests/test_query_encoder.py holds the vectors to the model's own).
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.add_session_config_entry("session.disable_prepacking", "1")
        self.session = onnxruntime.InferenceSession(
            str(onnx_file), options, providers=["CPUExecutionProvider"]
        )

    def encode(self, texts: list[str]) -> np.ndarray:
        import numpy as np

        batch = self.tokenizer.encode_batch(list(texts))
        ids = np.array([e.ids for e in batch], dtype=np.int64)
        mask = np.array([e.attention_mask for e in batch], dtype=np.int64)
        types = np.array([e.type_ids for e in batch], dtype=np.int64)
        hidden = self.session.run(
            ["hidden"], {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        )[0]
        weights = mask[:, :, None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        return (
            pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
        ).astype(np.float32)


def load(model_dir: Path, data_dir: Path, *, model_id: str, dim: int) -> OnnxQueryEncoder | None:
    """The fast encoder when its export exists, else None (the caller uses the full embedder)."""
    if not exportable(model_dir):
        return None
    path = export_path(model_dir, data_dir)
    if not path.exists():
        return None
    try:
        return OnnxQueryEncoder(model_dir, path, model_id=model_id, dim=dim)
    except Exception as exc:  # a damaged export: search still works through the full embedder
        log.warning("query encoder at %s unusable (%s); using the full model", path, exc)
        return None


def main(argv: list[str]) -> int:
    """``python -m sluice.pipeline.running.query_encoder MODEL_DIR DATA_DIR``: the export, at the
    lowest CPU priority (it must not take the cores from the worker's first jobs)."""
    global log
    log = logging.getLogger("sluice.pipeline.running.query_encoder")  # not __main__
    logging.basicConfig(
        level=logging.INFO, format="[%(asctime)s] %(levelname)s:%(name)s:%(message)s"
    )
    try:
        os.setpriority(os.PRIO_PROCESS, 0, 19)
    except (AttributeError, OSError):  # pragma: no cover - elsewhere it runs at normal priority
        pass
    try:
        export(Path(argv[0]), Path(argv[1]))
    except Exception as exc:  # search keeps working through the full model
        log.warning("could not export the query encoder: %s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
