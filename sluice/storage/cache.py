"""The cache Redis namespace: embeddings keyed by model, precision, pipeline version, dataset and
text hash. Per dataset, so that what a job or a preview of one dataset reports as cached never
depends on what another dataset embedded.

The cache only saves time. When its Redis is down or flushed, lookups miss and writes are dropped;
no job and no queue message depends on it.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence

import numpy as np
import redis

log = logging.getLogger(__name__)

PREFIX = "sluice:emb"


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class EmbeddingCache:
    def __init__(
        self,
        url: str,
        *,
        namespace: str,
        dim: int,
        ttl_seconds: int,
        password: str | None = None,
    ) -> None:
        """``namespace`` carries model, precision and pipeline version: change any, miss them all.
        ``password`` is sent unless the URL carries one."""
        self.client = redis.Redis.from_url(
            url, password=password, socket_timeout=2, socket_connect_timeout=2
        )
        self.namespace = namespace
        self.dim = dim
        self.ttl = ttl_seconds
        self._warned = False

    def key(self, text: str, *, dataset_id: int) -> str:
        return f"{PREFIX}:{self.namespace}:d{int(dataset_id)}:{text_hash(text)}"

    def get_many(self, texts: Sequence[str], *, dataset_id: int) -> list[np.ndarray | None]:
        if not texts:
            return []
        try:
            raw = self.client.mget([self.key(t, dataset_id=dataset_id) for t in texts])
        except redis.RedisError as exc:
            self._warn(exc)
            return [None] * len(texts)
        out: list[np.ndarray | None] = []
        for value in raw:
            if not isinstance(value, bytes) or len(value) != self.dim * 4:  # None: a miss
                out.append(None)
            else:
                out.append(np.frombuffer(value, dtype=np.float32))
        return out

    def put_many(self, texts: Sequence[str], vectors: np.ndarray, *, dataset_id: int) -> None:
        if not texts:
            return
        try:
            pipe = self.client.pipeline(transaction=False)
            for text, vec in zip(texts, vectors, strict=True):
                value = np.asarray(vec, dtype=np.float32).tobytes()
                pipe.set(self.key(text, dataset_id=dataset_id), value, ex=self.ttl)
            pipe.execute()
        except redis.RedisError as exc:
            self._warn(exc)

    def contains_many(self, texts: Sequence[str], *, dataset_id: int) -> int:
        """How many of these texts are cached (for retry and reindex previews)."""
        if not texts:
            return 0
        try:
            pipe = self.client.pipeline(transaction=False)
            for t in texts:
                pipe.exists(self.key(t, dataset_id=dataset_id))
            return sum(int(x) for x in pipe.execute())
        except redis.RedisError as exc:
            self._warn(exc)
            return 0

    def _warn(self, exc: Exception) -> None:
        if not self._warned:
            log.warning("embedding cache unavailable, computing without it: %s", exc)
            self._warned = True
