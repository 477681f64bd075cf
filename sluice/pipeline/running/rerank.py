"""Rerankers: a second look at a search's best candidates by a model that reads the query and each
chunk together (a cross-encoder), scoring each 0 to 1. Off by default (``SLUICE_RERANK_MODEL``):
no cross-encoder ships in the package registries, so one is named by its local folder, loaded
offline; ``overlap`` is a deterministic stand-in that needs no model, for tests and benchmarks."""

from __future__ import annotations

import re
import threading
from functools import lru_cache
from typing import Protocol

WORD = re.compile(r"\w+")


class Reranker(Protocol):
    name: str
    depth: int  # how many of a search's best candidates it rescores

    def score(self, query: str, texts: list[str]) -> list[float]:
        """Each text's relevance to the query, 0 to 1 (larger is better)."""
        ...


class OverlapReranker:
    """The share of the query's words a text holds (each word once): a stand-in with the
    reranker's shape whose order a test can predict."""

    name = "overlap"

    def __init__(self, depth: int) -> None:
        self.depth = depth

    def score(self, query: str, texts: list[str]) -> list[float]:
        wanted = {w.casefold() for w in WORD.findall(query)}
        if not wanted:
            return [0.0] * len(texts)
        return [len(wanted & {w.casefold() for w in WORD.findall(t)}) / len(wanted) for t in texts]


class CrossEncoderReranker:
    """A sentence-transformers CrossEncoder from a local folder (never downloaded), its logits
    through a sigmoid so that every score is 0 to 1. One call at a time per model."""

    def __init__(self, path: str, depth: int, threads: int = 0) -> None:
        import torch
        from sentence_transformers import CrossEncoder

        if threads:
            torch.set_num_threads(threads)
        self.name = path
        self.depth = depth
        self._sigmoid = torch.nn.Sigmoid()
        self._model = CrossEncoder(path, device="cpu", local_files_only=True)
        self._lock = threading.Lock()

    def score(self, query: str, texts: list[str]) -> list[float]:
        if not texts:
            return []
        with self._lock:
            raw = self._model.predict(
                [(query, t) for t in texts],
                activation_fn=self._sigmoid,
                show_progress_bar=False,
                convert_to_numpy=True,
            )
        return [float(x) for x in raw]


@lru_cache(maxsize=4)
def load_reranker(model: str, depth: int, threads: int = 0) -> Reranker | None:
    """The reranker the settings name, loaded once per process (None: none)."""
    if not model:
        return None
    if model == "overlap":
        return OverlapReranker(depth)
    return CrossEncoderReranker(model, depth, threads)
