"""``sluice search``: the best chunks of every dataset (or the one named), as the console searches.

A cold ``sluice search`` is the command most often typed and waited for, so this module imports
only what searching uses: the search itself, the job database and the query encoder (the model's
ONNX export when the worker has made it, sluice.pipeline.running.query_encoder). The operations the
other commands run (queues, parsing, the console's reads) are never imported on this path, nor the
ORM: the search reads in plain SQL through an engine opened without the schema check
(sluice.storage.db.open_engine, ``reading``).
"""

from __future__ import annotations

import sys
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import text

from sluice.cli.output import print_json, table
from sluice.errors import VectorStoreUnavailable
from sluice.ops.metadata import CLI_RULE, FilterError, parse_cli_where
from sluice.ops.search import (
    DENSE_WEIGHT,
    BadQuery,
    Reader,
    RerankUnavailable,
    SearchHit,
    UnknownDataset,
    query_vector,
)
from sluice.ops.search import search as run_search
from sluice.settings import Settings, get_settings
from sluice.storage.db import SchemaOutOfDate, open_engine, reading
from sluice.storage.lexical import parse_query

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from sluice.pipeline.running.embed import Embedder
    from sluice.pipeline.running.rerank import Reranker
    from sluice.storage.vectors import VectorStore


class ColdContext:
    """What a search reads through in a process that has no Context (sluice.pipeline.running
    .context, which imports the ORM with every table): the job database opened without the schema
    check (``reading`` makes it when a statement finds something missing), Chroma over HTTP and the
    query encoder's ONNX export."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    @cached_property
    def engine(self) -> Engine:
        return open_engine(self.settings.resolved_database_url)

    @cached_property
    def vectors(self) -> VectorStore:
        from sluice.storage.vectors import VectorStore

        return VectorStore.from_settings(self.settings)

    @cached_property
    def reranker(self) -> Reranker | None:
        """The reranker the settings name, or None (most searches: none is set)."""
        s = self.settings
        if not s.rerank_model:
            return None
        from sluice.pipeline.running.rerank import load_reranker

        return load_reranker(s.rerank_model, s.rerank_depth, s.torch_threads)

    @cached_property
    def query_encoder(self) -> Embedder:
        """The export when the worker has made it, else what a Context encodes with."""
        from sluice.pipeline.running import query_encoder
        from sluice.pipeline.running.embed import model_identity, model_path

        s = self.settings
        if s.embedder == "sentence-transformers":
            model_id, dim = model_identity(s.embedder, s.embed_model)
            fast = query_encoder.load(
                Path(model_path(s.embed_model)), s.data_dir, model_id=model_id, dim=dim
            )
            if fast is not None:
                return fast
        from sluice.pipeline.running.context import get_context

        return get_context().query_encoder


def search_context() -> Reader:
    """The process's Context when it has one (tests, a console or API process), else a ColdContext:
    importing sluice.pipeline.running.context only to learn there is none would cost the ORM."""
    module = sys.modules.get("sluice.pipeline.running.context")
    installed = getattr(module, "_context", None) if module is not None else None
    return installed if installed is not None else ColdContext(get_settings())


_NAMES = text("SELECT name FROM dataset WHERE deleting_at IS NULL ORDER BY name")


def dataset_names(ctx: Reader) -> list[str]:
    """Every dataset's name, as the console lists them (not those being deleted)."""
    with ctx.engine.connect() as conn:
        return [row[0] for row in conn.execute(_NAMES)]


def _given(value, default):
    return default if value is None else value


def search_datasets(ctx: Reader, names: list[str], args) -> list[SearchHit]:
    """The best ``args.k`` chunks over ``names``, merged by score; the query is encoded once."""
    where = parse_cli_where(args.where) if getattr(args, "where", None) else None
    several = len(names) > 1 and args.mode in ("hybrid", "dense")
    vector = (
        query_vector(ctx, args.query) if several and not parse_query(args.query).empty else None
    )
    hits = [
        h
        for name in names
        for h in run_search(
            ctx,
            query=args.query,
            dataset=name,
            k=args.k,
            mode=args.mode,
            filename=args.file,
            pages=args.pages,
            media_type=args.media_type,
            where=where,
            vector=vector,
            min_score=getattr(args, "min_score", None),
            max_chunks_per_document=getattr(args, "max_chunks_per_document", None),
            dense_weight=_given(getattr(args, "dense_weight", None), DENSE_WEIGHT),
            rerank=getattr(args, "rerank", None),
        )
    ]
    return sorted(hits, key=lambda h: -h.score)[: args.k]


def search(args) -> int:
    ctx = search_context()

    def answer() -> tuple[list[str], list[SearchHit]]:
        names = [args.dataset] if args.dataset else dataset_names(ctx)
        return names, search_datasets(ctx, names, args)

    try:
        names, hits = reading(ctx.engine, answer)
    except (UnknownDataset, BadQuery, RerankUnavailable) as exc:
        print(f"sluice: {exc}", file=sys.stderr)
        return 1
    except (SchemaOutOfDate, VectorStoreUnavailable) as exc:
        print(f"sluice: {exc.message}\n{exc.hint}", file=sys.stderr)
        return 1
    except FilterError as exc:
        print(f"sluice: {exc} ({CLI_RULE})", file=sys.stderr)
        return 2
    if args.json:
        print_json([h.to_dict() for h in hits])
        return 0
    print(f"searched {len(names)} dataset(s): {', '.join(names)}")
    rows = [
        {
            "score": f"{h.score:.3f}",
            "filename": h.filename,
            "page": h.page,
            "matched": "+".join(h.matched),
            "text": ((f"[{h.heading}] " if h.heading else "") + h.snippet)[:160],
        }
        for h in hits
    ]
    table(
        rows,
        [
            ("score", "SCORE"),
            ("filename", "FILE"),
            ("page", "PAGE"),
            ("matched", "BY"),
            ("text", "TEXT"),
        ],
        empty="no matches" + (f" in dataset {args.dataset!r}" if args.dataset else ""),
    )
    return 0
