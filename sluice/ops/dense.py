"""The dense ranker of a search (sluice.ops.search): a dataset's best chunks for a query vector,
of each document's active job, in the filter's documents and pages, chunks switched off left out.

The filter decides how (see the figures by ``EXACT_MAX``): a few chunks are compared exactly here,
a broad share is screened here from an unfiltered query's ids, any other filter goes to Chroma as
a ``where``. The exact path answers what exact search over the stored vectors ranks; the other two
are approximate as the index is (recall@10 against exact search: 0.98 at 1-5% shares on text
queries, 0.9995-1.0 by the recall audit's measure, at 100,000 chunks; BENCHMARKS.md).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from sqlalchemy import JSON, bindparam, column, text
from sqlalchemy.engine import Engine

from sluice.errors import VectorStoreUnavailable
from sluice.ops import metadata as meta
from sluice.storage import id_lists, lexical
from sluice.storage.lexical import Filters
from sluice.storage.vectors import Hit, chunk_prefix, read_failure

if TYPE_CHECKING:
    from sluice.storage.vectors import VectorStore

log = logging.getLogger(__name__)
T = TypeVar("T")


class Reader(Protocol):
    """What the dense ranker reads through (a search's reader, sluice.ops.search.Reader)."""

    @property
    def engine(self) -> Engine: ...

    @property
    def vectors(self) -> VectorStore: ...


class Searched(Protocol):
    """The dataset searched (sluice.ops.search.Searched)."""

    @property
    def id(self) -> int: ...

    @property
    def name(self) -> str: ...

    @property
    def collection(self) -> str: ...


DENSE_DEPTH = (
    20  # candidates the dense ranker gives it, at least (Chroma returns texts and metadata)
)


def active_jobs(
    ctx: Reader, document_ids: set[int], conditions: meta.Where = ()
) -> dict[int, int | None]:
    """document id -> the job whose chunks search serves, for the live, switched-on documents among
    these that the metadata filter allows (read with the active job, in one statement)."""
    if not document_ids:
        return {}
    with ctx.engine.connect() as conn:
        rows = conn.execute(_ACTIVE_JOBS, {"ids": sorted(document_ids)}).all()
    return {did: job for did, job, m in rows if meta.matches(conditions, m)}


_ACTIVE_JOBS = (
    text(
        "SELECT id, active_job_id, metadata FROM document WHERE id IN :ids AND deleted_at IS NULL "
        "AND disabled_at IS NULL"
    )
    .bindparams(bindparam("ids", expanding=True))
    .columns(column("id"), column("active_job_id"), column("metadata", JSON))
)


def document_ids(ctx: Reader, ds: Searched, filters: Filters) -> list[int] | None:
    """Documents the file name, media type and metadata filters allow (None: no such filter)."""
    if filters.document_ids is not None and not (filters.filename or filters.media_type):
        return list(filters.document_ids)
    if not (filters.filename or filters.media_type):
        return None
    sql = "SELECT id FROM document WHERE dataset_id = :d AND deleted_at IS NULL"
    params: dict[str, Any] = {"d": ds.id}
    if filters.filename:  # as ILIKE: the same lower-case match on both databases
        sql += " AND LOWER(filename) LIKE :fn"
        params["fn"] = f"%{filters.filename.lower()}%"
    if filters.media_type:
        sql += " AND media_type = :mt"
        params["mt"] = filters.media_type
    if filters.document_ids is not None:
        pg = ctx.engine.dialect.name == "postgresql"
        sql += " AND " + id_lists.sql("id", "ids", filters.document_ids, params, pg=pg)
    with ctx.engine.connect() as conn:
        return [row[0] for row in conn.execute(text(sql), params)]


def _job_of(hit) -> int | None:
    """The job a vector belongs to (None for a vector no Sluice job wrote)."""
    job = hit.metadata.get("job_id")
    return int(job) if job is not None else None


def vector_read(ds: Searched, read: Callable[[], T]) -> T:
    """``read()`` of the vector store; a failure on the way there (``read_failure``) is
    ``VectorStoreUnavailable`` (503 with Retry-After in the API), in the same words for every front
    end, and the log says what failed."""
    try:
        return read()
    except Exception as exc:
        why = read_failure(exc)
        if why is None:
            raise
        log.warning("search of %r: the vector store failed (%s): %r", ds.name, why, exc)
        raise VectorStoreUnavailable(
            f"the vector store did not answer the search ({why}); nothing is wrong with the request"
        ) from exc


# How the dense ranker applies a filter of documents, by the chunks it allows (their active jobs'
# chunk counts, from the job database); measured at 100,000 chunks (BENCHMARKS.md, "Filtered
# dense search without Chroma's filter"). Chroma's filtered query reads every allowed id from its
# metadata store and walks its graph until enough turn up: 55 to 90 ms whatever the share, more as
# the collection grows. Instead:
# - at most EXACT_MAX chunks: their stored vectors compared here exactly (100 chunks 32 ms; 300
#   98 ms, their JSON the cost);
# - a share of the dataset large enough that the nearest ``k / share * SCREEN_FACTOR`` chunks, at
#   most SCREEN_MAX, hold ``k`` allowed ones: those ids alone asked unfiltered (Chroma reads a hit's
#   metadata and text record by record: 400 with them 38 ms, without 7 ms; 2,000 without 19 ms,
#   4,000 31 ms, 8,000 50 ms; under a load of 6, 10,000 105 ms against the filter's 171 ms),
#   screened here by the chunk id's document (the id starts with its active job's prefix), the
#   ones kept read in full; too few kept, Chroma's filtered query after all;
# - in between, Chroma's filtered query.
EXACT_MAX = 200  # at most this many allowed chunks are compared exactly here
# A screened query asks k / share * SCREEN_FACTOR ids, at least SCREEN_MIN: a deeper walk ranks
# the best better. Recall@10 against exact search of 5-word queries (the sampled chunks of the
# recall audit are easier: 0.997 and more at 1,000 deep) at a tenth allowed: 0.92 asked 200
# deep, 0.978 at 1,000, 0.993 at 2,000, 0.995 at 4,000; at a hundredth, 0.968 at 2,000, 0.985 at
# 4,000, 0.995 at 8,000.
SCREEN_FACTOR = 4.0
SCREEN_MIN = 2000
SCREEN_MAX = 10_000  # ids of the deepest screened query (still cheaper than Chroma's filter)
CHROMA_IN_MAX = 10_000  # document ids in one Chroma ``$in`` (its server refuses 65,000)


@dataclass(frozen=True)
class Allowed:
    """The documents a filter allows that serve chunks now: each active job's chunk-id prefix (its
    document's id), and how many chunks they serve of all the dataset serves (``total``, read only
    when the choice needs it)."""

    prefixes: dict[str, int]
    chunks: int
    total: int = 0

    @property
    def documents(self) -> list[int]:
        return sorted(set(self.prefixes.values()))


def _allowed(ctx: Reader, ds: Searched, doc_ids: list[int]) -> Allowed:
    """What the filter's documents serve (one statement; a second, the dataset's total, when
    they serve more than EXACT_MAX)."""
    pg = ctx.engine.dialect.name == "postgresql"
    params: dict[str, Any] = {"d": ds.id}
    among = id_lists.sql("d.id", "ids", doc_ids, params, pg=pg)
    with ctx.engine.connect() as conn:
        rows = conn.execute(text(_SERVING.format(among=among)), params).all()
        chunks = sum(int(n or 0) for *_, n in rows)
        total = conn.execute(_SERVED_TOTAL, {"d": ds.id}).scalar() if chunks > EXACT_MAX else 0
    prefixes = {chunk_prefix(sha, version): did for did, sha, version, _ in rows}
    return Allowed(prefixes, chunks, int(total or 0))


_SERVING = (
    "SELECT d.id, d.sha256, j.pipeline_version, j.chunk_count FROM document d "
    "JOIN job j ON j.id = d.active_job_id WHERE {among} AND d.dataset_id = :d "
    "AND d.deleted_at IS NULL AND d.disabled_at IS NULL"
)
# The dataset's served chunks, as the job database keeps them (sluice.storage.tallies: folded and
# not yet), for the allowed share: a row or a few, where a sum over the documents grows with them.
_SERVED_TOTAL = text(
    "SELECT SUM(chunks) FROM (SELECT chunks FROM tally WHERE what = 'dataset' AND dataset_id = :d "
    "UNION ALL SELECT chunks FROM tally_delta WHERE what = 'dataset' AND dataset_id = :d) AS kept"
)


def best(
    ctx: Reader, ds: Searched, vector, k: int, filters: Filters, conditions: meta.Where = ()
) -> list[Hit]:
    """The dense ranker's best ``k`` chunks of active jobs that the filters allow: a few
    documents' chunks compared exactly here, a broad filter's screened here from an unfiltered
    query, any other filter handed to Chroma (a ``where``)."""
    if vector is None:
        return []
    disabled = lexical.disabled_ids(ctx.engine, ds.id)
    doc_ids = document_ids(ctx, ds, filters)
    allowed = None if doc_ids is None else _allowed(ctx, ds, doc_ids)
    if allowed is not None and not allowed.prefixes:
        return []
    pages = [
        {"page": {op: v}}
        for op, v in (("$gte", filters.page_from), ("$lte", filters.page_to))
        if v is not None
    ]
    wheres = [_where(pages)]
    if allowed is not None:  # a Chroma where per CHROMA_IN_MAX documents, their best merged
        docs = allowed.documents
        wheres = [
            _where([{"document_id": {"$in": docs[i : i + CHROMA_IN_MAX]}}, *pages])
            for i in range(0, len(docs), CHROMA_IN_MAX)
        ]
        found = None
        if allowed.chunks <= EXACT_MAX:
            documents = set(docs)
            where = wheres[0] or {}
            found = _exact(ctx, ds, vector, k, documents, where, filters, conditions, disabled)
        elif not pages:
            found = _screened(ctx, ds, vector, k, allowed, conditions, disabled)
        if found is not None:
            return found
    return _queried(ctx, ds, vector, k, wheres, conditions, disabled)


def _where(clauses: list[dict]) -> dict | None:
    return None if not clauses else clauses[0] if len(clauses) == 1 else {"$and": clauses}


def _queried(
    ctx: Reader,
    ds: Searched,
    vector,
    k: int,
    wheres: list[dict | None],
    conditions: meta.Where,
    disabled: set[str],
) -> list[Hit]:
    """The best ``k`` served chunks of Chroma's query under each of ``wheres`` (parts of one
    filter: their best merged), asked deeper until ``k`` are kept or the store has no more."""
    n = max(DENSE_DEPTH, k * 2)  # room for chunks of inactive jobs; asks for more when they crowd
    requeried = False
    while True:
        parts = [
            vector_read(ds, partial(ctx.vectors.query, ds.collection, vector, n=n, where=where))
            for where in wheres
        ]
        answered = sorted((h for part in parts for h in part), key=lambda h: -h.score)
        hits = [h for h in answered if _job_of(h) is not None and h.id not in disabled]
        kept, switched = _served(ctx, hits, conditions)
        vanished = sum(part.vanished for part in parts)
        if (switched or vanished > 0) and not requeried:
            requeried = True
            continue
        # enough, or all the store holds (a query deeper than the collection answers all of it:
        # the store is never counted, which cost more than the query, 15 ms at 100,000 chunks)
        if len(kept) >= k or all(len(part) + part.vanished < n for part in parts):
            return kept[:k]
        n *= 4


def _screened(
    ctx: Reader,
    ds: Searched,
    vector,
    k: int,
    allowed: Allowed,
    conditions: meta.Where,
    disabled: set[str],
) -> list[Hit] | None:
    """The best ``k`` allowed chunks among the nearest ``k / share * SCREEN_FACTOR`` of all (at
    least SCREEN_MIN), their ids screened here (disabled ones and other documents' left out) and
    the kept read in full; None when that is deeper than SCREEN_MAX, when fewer than ``k`` are
    kept and the store holds more, or when a document switched versions meanwhile (the caller
    then has Chroma filter)."""
    share = allowed.chunks / allowed.total if allowed.total else 1.0
    depth = max(SCREEN_MIN, math.ceil(k / share * SCREEN_FACTOR))
    if depth > SCREEN_MAX:
        return None
    documents = set(allowed.prefixes.values())
    for again in (False, True):
        nearest = vector_read(ds, partial(ctx.vectors.nearest, ds.collection, vector, n=depth))
        chosen = [
            (cid, sim)
            for cid, sim in nearest
            if cid not in disabled and cid[: cid.rfind("-") + 1] in allowed.prefixes
        ]
        kept, switched, vanished = _read_best(ctx, ds, chosen, k, documents, None, conditions)
        if switched:  # a document's active job changed since its prefix was read: Chroma filters
            return None
        if again or not vanished:  # chunks deleted meanwhile left holes: one more query
            return kept[:k] if len(kept) >= k or len(nearest) < depth else None
    return None


def _served(ctx: Reader, hits: list[Hit], conditions: meta.Where) -> tuple[list[Hit], bool]:
    """The hits of each document's active job, and whether a document's active job is another
    than its hits' (it switched between the query and this read)."""
    active = active_jobs(ctx, {_document_of(h) for h in hits}, conditions)
    kept = [h for h in hits if active.get(_document_of(h)) == _job_of(h)]
    # A document whose active job switched between the query and this read lost all its hits; its
    # new chunks were complete before the switch, so one more query finds them. Chunks deleted
    # while the query ran (a superseded version) left holes: the same one more query.
    switched = any(active.get(_document_of(h)) not in (None, _job_of(h)) for h in hits)
    return kept, switched


def _document_of(hit: Hit) -> int:
    return int(hit.metadata.get("document_id", -1))


def _in_pages(m: dict, filters: Filters) -> bool:
    page = int(m.get("page", 0))
    return (filters.page_from is None or page >= filters.page_from) and (
        filters.page_to is None or page <= filters.page_to
    )


def _read_hits(ctx: Reader, ds: Searched, scored: list[tuple[str, float]]) -> tuple[list[Hit], int]:
    """The chunks of these (id, similarity) pairs read in full, in their order, and how many were
    deleted since their ids were found (left out)."""
    if not scored:
        return [], 0
    ids = [c for c, _ in scored]
    got = vector_read(ds, partial(ctx.vectors.get, ds.collection, ids, ["metadatas", "documents"]))
    read = {
        cid: (m, doc)
        for cid, m, doc in zip(
            got.get("ids") or [],
            got.get("metadatas") or [],
            got.get("documents") or [],
            strict=False,
        )
        if m is not None
    }
    hits = [
        Hit(id=cid, score=sim, text=read[cid][1] or "", metadata=dict(read[cid][0]))
        for cid, sim in scored
        if cid in read
    ]
    return hits, len(scored) - len(hits)


def _exact(
    ctx: Reader,
    ds: Searched,
    vector,
    k: int,
    documents: set[int],
    where: dict,
    filters: Filters,
    conditions: meta.Where,
    disabled: set[str],
) -> list[Hit] | None:
    """The best ``k`` chunks of a few documents (``where`` selects them, pages too), their stored
    vectors compared with the query exactly (cosine, as the index ranks); None when the store
    holds many more of their chunks than they serve (old versions not yet removed: the caller
    then has Chroma filter)."""
    import numpy as np

    for again in (False, True):
        ids, rows = vector_read(
            ds, partial(ctx.vectors.vectors_where, ds.collection, where, limit=2 * EXACT_MAX)
        )
        if len(ids) >= 2 * EXACT_MAX:
            return None
        q = np.asarray(vector, dtype=np.float32)
        norms = np.linalg.norm(rows, axis=1) * max(float(np.linalg.norm(q)), 1e-12)
        sims = (rows @ q) / np.clip(norms, 1e-12, None) if len(ids) else np.zeros(0)
        order = [i for i in np.argsort(-sims, kind="stable") if ids[i] not in disabled]
        scored = [(ids[i], float(sims[i])) for i in order]
        kept, switched, vanished = _read_best(ctx, ds, scored, k, documents, filters, conditions)
        if again or not (switched or vanished):
            return kept[:k]
    return None


def _read_best(
    ctx: Reader,
    ds: Searched,
    scored: list[tuple[str, float]],
    k: int,
    documents: set[int],
    filters: Filters | None,
    conditions: meta.Where,
) -> tuple[list[Hit], int, int]:
    """Of these (id, similarity) pairs, best first, the first ``k`` that are served chunks of
    ``documents`` (in ``filters``' pages), read in full a few at a time; and how many hits were
    of a document whose active job switched meanwhile, and how many vanished."""
    kept: list[Hit] = []
    switched = vanished = 0
    step = max(DENSE_DEPTH, k * 2)
    for start in range(0, len(scored), step):  # best first, until k are kept
        hits, gone = _read_hits(ctx, ds, scored[start : start + step])
        hits = [
            h
            for h in hits
            if _job_of(h) is not None
            and _document_of(h) in documents
            and (filters is None or _in_pages(h.metadata, filters))
        ]
        more, moved = _served(ctx, hits, conditions)
        kept += more
        vanished += gone
        switched += moved
        if len(kept) >= k:
            break
    return kept, switched, vanished
