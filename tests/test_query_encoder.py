"""The query encoder: the real model exported once to ONNX gives the model's own vectors, and a cold
`sluice search` then answers without loading sentence-transformers (real model; slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sluice.pipeline.running import query_encoder
from sluice.pipeline.running.embed import model_path

pytestmark = pytest.mark.slow

TEXTS = [
    "Harbour pilots board ships at dawn",
    "invoice INV-2024-0042 for the billing service",
    "日本語の文章です",
    "word " * 600,
    "x",
]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return Path(model_path("all-MiniLM-L6-v2"))


def test_the_export_encodes_exactly_as_the_model_does(model_dir, tmp_path):
    from sentence_transformers import SentenceTransformer

    assert (
        query_encoder.load(model_dir, tmp_path, model_id="m", dim=384) is None
    )  # nothing exported yet
    onnx_file = query_encoder.export(model_dir, tmp_path)
    assert onnx_file is not None and onnx_file.exists()
    assert query_encoder.export(model_dir, tmp_path) == onnx_file  # once: a second call finds it
    fast = query_encoder.load(model_dir, tmp_path, model_id="m", dim=384)
    reference = SentenceTransformer(str(model_dir), device="cpu").encode(
        TEXTS, normalize_embeddings=True
    )
    got = fast.encode(TEXTS)
    assert got.shape == (len(TEXTS), 384) and got.dtype == np.float32
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert (got * reference).sum(axis=1).min() >= 0.9999


def test_a_model_that_is_not_mean_pooled_is_not_exported(model_dir, tmp_path):
    other = tmp_path / "model"
    other.mkdir()
    (other / "modules.json").write_text(
        json.dumps([{"type": "sentence_transformers.models.Transformer"}])
    )
    assert not query_encoder.exportable(other) and query_encoder.export(other, tmp_path) is None
    assert query_encoder.exportable(model_dir)


def test_a_cold_cli_search_uses_the_export_and_never_loads_sentence_transformers(
    make_ctx, sluice_env, model_dir
):
    from sluice.ops.ingest import ingest_bytes
    from sluice.pipeline.running.runner import run_job

    ctx = make_ctx(SLUICE_EMBEDDER="sentence-transformers", SLUICE_EMBED_PRECISION="fp32")
    r = ingest_bytes(
        ctx,
        b"The lighthouse keeper logs every passing ship in a leather book. " * 20,
        dataset="default",
        filename="keeper.txt",
    )
    assert run_job(r.job_id, ctx=ctx).result == "succeeded"
    query_encoder.export(model_dir, ctx.settings.data_dir)  # what a worker does once at start
    probe = (
        "import sys, json\nfrom sluice.cli import main\n"
        "code = main(['search', 'who records the ships', '--json'])\n"
        "print(json.dumps({'code': code, 'st': 'sentence_transformers' in sys.modules,"
        " 'transformers': 'transformers' in sys.modules}))"
    )
    env = {
        **sluice_env,
        "SLUICE_EMBEDDER": "sentence-transformers",
        "SLUICE_EMBED_PRECISION": "fp32",
    }
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    *hits, verdict = done.stdout.strip().splitlines()
    state = json.loads(verdict)
    assert state == {"code": 0, "st": False, "transformers": False}
    assert json.loads("\n".join(hits))[0]["filename"] == "keeper.txt"


# Run in a fresh interpreter: the model thread is held as it starts importing transformers (from
# inside torch's own import) until the export's child process has started, so the two overlap every
# time instead of now and then.
RACE_PROBE = """
import json, logging, pathlib, sys, threading, time
logging.basicConfig()

def export_thread_inside_export():
    return worker._exporter._child is not None

class HoldTheModelThread:
    held = False

    def find_spec(self, name, path=None, target=None):
        if name == "transformers" and threading.current_thread().name == "sluice-model":
            deadline = time.monotonic() + 60
            while not export_thread_inside_export() and time.monotonic() < deadline:
                time.sleep(0.01)
            HoldTheModelThread.held = True
        return None

from sluice.worker import hooks as worker
sys.meta_path.insert(0, HoldTheModelThread())
for t in worker.start_model_threads():
    t.join(300)
found = [str(p) for p in pathlib.Path(sys.argv[1]).rglob("*.onnx")]
print(json.dumps({"held": HoldTheModelThread.held, "exported": found}))
"""


def test_the_worker_builds_the_export_in_its_own_threads_at_start(model_dir, tmp_path):
    """The worker loads the model and exports the encoder at once, the export in a child process:
    nothing races (every start used to log "cannot import name 'AutoModel'" when both imported
    transformers in the worker's own threads)."""
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "SLUICE_EMBEDDER": "sentence-transformers",
        "SLUICE_DATA_DIR": str(tmp_path),
    }
    done = subprocess.run(
        [sys.executable, "-c", RACE_PROBE, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "could not export" not in done.stderr and "could not load" not in done.stderr
    state = json.loads(done.stdout.strip().splitlines()[-1])
    assert state["held"]  # the window was forced open
    want = query_encoder.export_path(model_dir, tmp_path).name
    assert [Path(p).name for p in state["exported"]] == [want]


def test_loading_the_model_draws_no_progress_bar(capfd):
    """A cold `sluice search` without the export loads the model: its output has no bar in it."""
    from sluice.pipeline.running.embed import SentenceTransformerEmbedder

    capfd.readouterr()
    SentenceTransformerEmbedder("all-MiniLM-L6-v2", precision="fp32", threads=1)
    out = capfd.readouterr()
    assert "Loading weights" not in out.err + out.out
