"""What one process needs to run jobs: settings, database, blobs, vectors, cache and the embedder.

A Context is built once per process (``get_context``) from the settings; tests build their own.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy.engine import Engine

from sluice.files import private_dir
from sluice.pipeline.running import query_encoder
from sluice.pipeline.running.chunk import CHUNKER_VERSION
from sluice.pipeline.running.embed import (
    Embedder,
    load_embedder,
    model_identity,
    model_path,
    resolve_precision,
)
from sluice.pipeline.running.rerank import Reranker, load_reranker
from sluice.settings import Settings, get_settings
from sluice.storage import dataset_settings
from sluice.storage.blobs import BlobStore, LocalBlobStore
from sluice.storage.db import get_engine, instance_id
from sluice.storage.models import Dataset
from sluice.storage.vectors import VectorStore

if TYPE_CHECKING:  # imported where used: a search needs neither the cache nor the object store
    from sluice.storage.cache import EmbeddingCache


def pipeline_version(settings: Settings, precision: str | None = None) -> str:
    """Changes whenever chunking, the model or its precision changes, and with it every chunk id.

    bf16 and fp32 vectors differ (slightly), so a fleet with workers of both never writes them
    under one version. fp32 adds nothing to the spec: versions made before precision counted stay.
    """
    model_id, dim = model_identity(settings.embedder, settings.embed_model)
    spec = {
        "chunker": CHUNKER_VERSION,
        "size": settings.chunk_size,
        "overlap": settings.chunk_overlap,
        "model": model_id,
        "dim": dim,
    }
    if precision is None:
        precision = (
            "fp32" if settings.embedder == "hash" else resolve_precision(settings.embed_precision)
        )
    if precision != "fp32":
        spec["precision"] = precision
    # OCR changes the text of scanned pages. Only what differs from the defaults enters the spec, so
    # versions made before OCR counted stay what they were.
    if settings.ocr_mode != "auto":
        spec["ocr"] = settings.ocr_mode
    if settings.ocr_language != "eng":
        spec["ocr_language"] = settings.ocr_language
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]
    return f"v{digest}"


@dataclass
class Context:
    settings: Settings
    embedder_override: Embedder | None = None
    worker_id: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")

    def __post_init__(self) -> None:
        private_dir(self.settings.data_dir)  # 0700: job database, blobs and server files live here

    @cached_property
    def engine(self) -> Engine:
        return get_engine(self.settings.resolved_database_url)

    @cached_property
    def blobs(self) -> BlobStore:
        """The blob store of SLUICE_BLOB_STORE: this host's directory, or the object store."""
        if self.settings.blob_store == "s3":
            from sluice.storage.s3_blobs import S3BlobStore

            return S3BlobStore.from_settings(self.settings)
        return LocalBlobStore(self.settings.blob_dir)

    @cached_property
    def vectors(self) -> VectorStore:
        return VectorStore.from_settings(self.settings)

    @property
    def embedder(self) -> Embedder:
        if self.embedder_override is not None:
            return self.embedder_override
        s = self.settings
        return load_embedder(s.embedder, s.embed_model, s.embed_precision, s.torch_threads)

    @cached_property
    def reranker(self) -> Reranker | None:
        """The reranker the settings name (SLUICE_RERANK_MODEL), loaded once; None: none."""
        s = self.settings
        return load_reranker(s.rerank_model, s.rerank_depth, s.torch_threads)

    @cached_property
    def query_encoder(self) -> Embedder:
        """What encodes a search query: the model's ONNX export when the worker has made it (a cold
        process answers in well under a second), else the embedder itself."""
        s = self.settings
        if self.embedder_override is None and s.embedder == "sentence-transformers":
            model_id, dim = model_identity(s.embedder, s.embed_model)
            fast = query_encoder.load(
                Path(model_path(s.embed_model)), s.data_dir, model_id=model_id, dim=dim
            )
            if fast is not None:
                return fast
        return self.embedder

    @cached_property
    def instance_id(self) -> str:
        """The id made with this job database; every queue message carries it."""
        return instance_id(self.engine)

    @cached_property
    def pipeline_version(self) -> str:
        return pipeline_version(self.settings, self.precision)

    def settings_for(self, dataset: Dataset) -> Settings:
        """This process's settings with the dataset's own parse settings in place."""
        return dataset_settings.effective(self.settings, dataset.parse_settings)

    def version_for(self, dataset: Dataset) -> str:
        """The pipeline version of the dataset's documents: the process's, unless the dataset sets
        its own chunking or OCR."""
        if not dataset_settings.overrides_of(dataset.parse_settings):
            return self.pipeline_version
        return pipeline_version(self.settings_for(dataset), self.precision)

    @cached_property
    def precision(self) -> str:
        if self.embedder_override is not None:
            return self.embedder_override.precision
        return (
            "fp32"
            if self.settings.embedder == "hash"
            else resolve_precision(self.settings.embed_precision)
        )

    @cached_property
    def cache(self) -> EmbeddingCache:
        """The embeddings' cache (redis, numpy): imported here, as only embedding uses it."""
        from sluice.storage.cache import EmbeddingCache

        model_id, dim = model_identity(self.settings.embedder, self.settings.embed_model)
        if self.embedder_override is not None:
            model_id, dim = self.embedder_override.model_id, self.embedder_override.dim
        namespace = f"{model_id}:{self.precision}:{self.pipeline_version}"
        return EmbeddingCache(
            self.settings.cache_redis_url,
            password=self.settings.redis_password("cache"),
            namespace=namespace,
            dim=dim,
            ttl_seconds=self.settings.embed_cache_ttl_seconds,
        )


_context: Context | None = None
_lock = threading.Lock()


def get_context() -> Context:
    global _context
    with _lock:
        if _context is None:
            _context = Context(get_settings())
        return _context


def set_context(ctx: Context | None) -> None:
    """Install a process-wide context (tests, and the consumer at start)."""
    global _context
    with _lock:
        _context = ctx
