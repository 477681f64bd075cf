"""What a dataset's vector index can actually return, and a rebuild when it returns too little.

The id audit (``audit``) checks what the collection holds; it cannot see a chunk that is there but
that no query reaches. Chroma's HNSW graph can hold such chunks (chroma-core/chroma#7758, 1.5.9:
after deletes and re-adds; measured here also in a fresh collection made with Chroma's default
graph settings). So the audit also asks the index:

- **self check**: a sample of chunks, each queried with its own stored vector: a chunk not among
  the ``k`` nearest of its own vector is *unreachable*;
- **recall**: sample queries (the normalised midpoint of two sampled vectors) answered by the index
  and by exact search over every stored vector; recall@k is the share of the exact top ``k`` the
  index returned (a tie with the k-th exact similarity counts as found).

A chunk its own ``k`` nearest miss is probed deeper, walks of ``DEEP`` candidates one after the
other: found by one, it is *hard to reach*, the approximation every HNSW graph makes (1 in 1,000
sampled at 300,000 chunks, found first at 1,000 in one store and at 3,000 in another); a rebuild
makes a graph of the same kind, so only a graph built with weaker settings than ``vectors.HNSW`` is
rebuilt for it. Not found even by the deepest (or by a walk of the whole collection), it is
unreachable: no path of the graph leads to it, the graph is damaged (chroma#7758's chunk was not
found among 3,999 of 4,000).

Below the threshold (any unreachable chunk, or recall under ``RECALL_THRESHOLD``), repair rebuilds
the collection without a gap for search: a new collection is built beside the old one with the
same ids, vectors, texts and metadata (and ``vectors.HNSW``'s graph settings), the dataset is
switched to it in one write, jobs that were writing to the old one are given time to finish, what
they added meanwhile is copied over, and the old collection is dropped.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import asdict, dataclass, field

import numpy as np
from sqlalchemy import update
from sqlmodel import Session, col, select

from sluice.pipeline.running.context import Context
from sluice.storage.db import matched, stored
from sluice.storage.models import Dataset, Job, JobStatus

log = logging.getLogger(__name__)

SAMPLE = 1000  # chunks queried with their own vector (10 requests of 100)
QUERIES = 200  # sample queries compared with exact search (20 left a healthy index 0.865-0.985)
K = 10
# Below this a graph is taken for damaged and rebuilt: an alarm, not the quality target. Healthy at
# k=10: 0.94-0.99 with ef_search 100 (clustered test data 0.945; 100,000 hash-embedded chunks
# 0.950), 0.9975 with vectors.HNSW's 400 on those chunks, in force once Chroma loads it.
RECALL_THRESHOLD = 0.90
EXACT_LIMIT = 50_000  # beyond this many chunks the exact search is skipped (self check only)
QUERY_BATCH = 100
WINDOW = 100  # ids per sampled window of a large collection
COPY_PAGE = 1000
TIE = 1e-5
DEEP = (1_000, 10_000, 100_000)  # walks that find a hard chunk (each only for those still missed)
PROBES = 100  # chunks probed that deep in one audit (beyond them a miss counts as unreachable)


@dataclass
class RecallAudit:
    collection: str = ""
    chunks: int = 0
    sampled: int = 0
    unreachable: int = 0
    unreachable_ids: list[str] = field(default_factory=list)
    hard_to_reach: int = 0  # missed by the k nearest, found by a deeper walk
    # The graph was built with fewer neighbours or a shallower construction than vectors.HNSW: a
    # rebuild would make a better one (known only when a chunk was hard to reach).
    weaker_graph: bool = False
    queries: int = 0
    k: int = K
    recall: float | None = None  # None: not measured (empty, or too large for exact search)
    threshold: float = RECALL_THRESHOLD
    seconds: float = 0.0

    @property
    def healthy(self) -> bool:
        return (
            self.unreachable == 0
            and not (self.hard_to_reach and self.weaker_graph)
            and (self.recall is None or self.recall >= self.threshold)
        )

    def to_dict(self) -> dict:
        return {**asdict(self), "healthy": self.healthy}

    def describe(self) -> str:
        if not self.sampled:
            return "vector index: empty"
        text = (
            f"vector index: {self.sampled - self.unreachable:,}/{self.sampled:,} sampled chunks "
            f"found by their own vector"
        )
        if self.unreachable:
            text += (
                f" ({self.unreachable:,} unreachable, e.g. {', '.join(self.unreachable_ids[:3])})"
            )
        if self.hard_to_reach:
            text += f"; {self.hard_to_reach:,} found only by a deeper walk" + (
                " (a graph built with weaker settings: a rebuild makes a better one)"
                if self.weaker_graph
                else " (hard to reach: a rebuild would not help)"
            )
        if self.recall is not None:
            text += (
                f"; recall@{self.k} {self.recall:.3f} over {self.queries} queries against exact "
                f"search (threshold {self.threshold:.2f})"
            )
        elif self.chunks > EXACT_LIMIT:
            text += f"; recall not measured (over {EXACT_LIMIT:,} chunks)"
        return text


def _normalised(rows: np.ndarray) -> np.ndarray:
    rows = np.asarray(rows, dtype=np.float32)
    return rows / np.clip(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12, None)


def _sample_ids(ctx: Context, collection: str, n: int, rng: np.random.Generator):
    """About ``n`` ids, and how many there are: all of them in a small collection, else windows
    of ``WINDOW`` ids at random offsets (a few requests, never a walk of the whole collection)."""
    total = ctx.vectors.count(collection)
    if total <= n:
        ids = [
            cid for page in ctx.vectors.iter_pages(collection, include=[]) for cid in page["ids"]
        ]
        return ids, max(total, len(ids))  # jobs may have written since the count
    starts = sorted({int(x) for x in rng.integers(0, total - WINDOW + 1, size=-(-n // WINDOW))})
    chosen: list[str] = []
    for start in starts:
        got = ctx.vectors.window(collection, offset=start, limit=WINDOW)
        chosen.extend(cid for cid in got if cid not in chosen[-WINDOW:])
    return list(dict.fromkeys(chosen)), total


def _embeddings(ctx: Context, collection: str, ids: list[str]) -> tuple[list[str], np.ndarray]:
    out_ids: list[str] = []
    rows: list[np.ndarray] = []
    for start in range(0, len(ids), COPY_PAGE):
        got = ctx.vectors.get(collection, ids[start : start + COPY_PAGE], include=["embeddings"])
        out_ids.extend(got["ids"])
        rows.extend(np.asarray(e, dtype=np.float32) for e in got["embeddings"])
    return out_ids, _normalised(np.stack(rows)) if rows else np.zeros((0, 0), np.float32)


def _answers(ctx: Context, collection: str, queries: np.ndarray, n: int):
    """Per query, the index's answer as (id, cosine distance), nearest first."""
    rows: list[list[tuple[str, float]]] = []
    for start in range(0, len(queries), QUERY_BATCH):
        rows.extend(ctx.vectors.query_ids(collection, queries[start : start + QUERY_BATCH], n=n))
    return rows


def _reached(cid: str, row: list[tuple[str, float]]) -> bool:
    """Its own vector found the chunk, or found only chunks exactly as near (duplicates of it)."""
    return any(i == cid for i, _ in row) or (bool(row) and all(d <= TIE for _, d in row))


def _found_deep(
    ctx: Context, collection: str, ids: list[str], vectors: np.ndarray, total: int
) -> set[str]:
    """Of chunks their own ``k`` nearest missed, those a deeper walk finds (``DEEP``, each walk
    for those the one before missed; none deeper than the collection)."""
    found: set[str] = set()
    left = list(range(len(ids)))
    for depth in DEEP if left else ():
        n = min(depth, total)
        batch = max(1, 10_000 // n)  # answers of at most about 10,000 ids a request
        for start in range(0, len(left), batch):
            part = left[start : start + batch]
            rows = ctx.vectors.query_ids(collection, vectors[part], n=n)
            found.update(ids[i] for i, row in zip(part, rows, strict=True) if _reached(ids[i], row))
        left = [i for i in left if ids[i] not in found]
        if not left or n >= total:
            break
    return found


def _exact(ctx: Context, collection: str, queries: np.ndarray, k: int):
    """Exact top-k over every stored vector: per query, a dict id -> similarity, and the k-th
    similarity (walked in pages: memory bounded by the queries, not the collection)."""
    best_sim = np.full((len(queries), 0), -np.inf, dtype=np.float32)
    best_ids = np.empty((len(queries), 0), dtype=object)
    for page in ctx.vectors.iter_pages(collection, include=["embeddings"], page_size=COPY_PAGE):
        sims = queries @ _normalised(np.asarray(page["embeddings"])).T
        ids = np.array(page["ids"], dtype=object)
        all_sim = np.concatenate([best_sim, sims], axis=1)
        all_ids = np.concatenate([best_ids, np.broadcast_to(ids, sims.shape)], axis=1)
        top = np.argsort(-all_sim, axis=1)[:, :k]
        best_sim = np.take_along_axis(all_sim, top, axis=1)
        best_ids = np.take_along_axis(all_ids, top, axis=1)
    return best_ids, best_sim


def audit_recall(
    ctx: Context,
    collection: str,
    *,
    sample: int = SAMPLE,
    queries: int = QUERIES,
    k: int = K,
    seed: int = 0,
) -> RecallAudit:
    """Ask the index what it returns for sampled chunks' own vectors and for sample queries."""
    started = time.monotonic()
    rng = np.random.default_rng(seed)
    ids, total = _sample_ids(ctx, collection, sample, rng)
    result = RecallAudit(collection=collection, chunks=total, k=k)
    ids, vectors = _embeddings(ctx, collection, ids)
    if not ids:
        return result
    n = min(k, total)
    answers = _answers(ctx, collection, vectors, n)
    missed = [
        i for i, (cid, row) in enumerate(zip(ids, answers, strict=True)) if not _reached(cid, row)
    ]
    deep = _found_deep(
        ctx, collection, [ids[i] for i in missed[:PROBES]], vectors[missed[:PROBES]], total
    )
    unreachable = [ids[i] for i in missed if ids[i] not in deep]
    result.sampled, result.unreachable = len(ids), len(unreachable)
    result.unreachable_ids = unreachable[:20]
    result.hard_to_reach = len(deep)
    result.weaker_graph = bool(deep) and ctx.vectors.weaker_graph(collection)
    if queries and len(ids) >= 2 and total <= EXACT_LIMIT:
        pairs = rng.integers(0, len(ids), size=(queries, 2))
        q = _normalised(vectors[pairs[:, 0]] + vectors[pairs[:, 1]])
        exact_ids, exact_sim = _exact(ctx, collection, q, n)
        scores = []
        for row, want, sims, query in zip(
            _answers(ctx, collection, q, n), exact_ids, exact_sim, q, strict=True
        ):
            got = {i for i, _ in row}
            found = sum(1 for cid in want if cid in got)
            if found < len(want):  # an equally near chunk returned instead counts as found
                _, vec = _embeddings(ctx, collection, [c for c in got if c not in set(want)])
                found += int(np.sum(vec @ query >= sims[-1] - TIE)) if len(vec) else 0
            scores.append(min(1.0, found / max(1, len(want))))
        result.queries, result.recall = len(scores), round(float(np.mean(scores)), 4)
    result.seconds = round(time.monotonic() - started, 3)
    return result


# --- the rebuild ---------------------------------------------------------------------------------


@dataclass
class Rebuild:
    old: str
    new: str
    copied: int = 0
    late: int = 0  # chunks jobs added to the old collection while it was copied

    def describe(self) -> str:
        return (
            f"rebuilt the vector index: {self.copied + self.late:,} chunk(s) copied from "
            f"{self.old} into {self.new} (built beside, switched, old one dropped)"
        )


def _copy(ctx: Context, source: str, target: str, skip: set[str] | None = None) -> int:
    copied = 0
    for page in ctx.vectors.iter_pages(
        source, include=["embeddings", "documents", "metadatas"], page_size=COPY_PAGE
    ):
        keep = [i for i, cid in enumerate(page["ids"]) if skip is None or cid not in skip]
        if not keep:
            continue
        ctx.vectors.add(
            target,
            ids=[page["ids"][i] for i in keep],
            embeddings=np.asarray(page["embeddings"], dtype=np.float32)[keep],
            documents=[page["documents"][i] or "" for i in keep],
            metadatas=[page["metadatas"][i] or {} for i in keep],
        )
        copied += len(keep)
    return copied


def _writers(ctx: Context, dataset_id: int) -> set[tuple[int, int]]:
    with Session(ctx.engine) as session:
        rows = session.exec(
            select(Job.id, Job.lease).where(
                Job.dataset_id == dataset_id, Job.status == JobStatus.running
            )
        ).all()
    return {(int(a), int(b)) for a, b in rows}


def rebuild(ctx: Context, dataset_id: int, *, wait_seconds: float | None = None) -> Rebuild:
    """Build the dataset's collection again beside the old one, switch, then drop the old one."""
    with Session(ctx.engine) as session:
        old = stored(session, Dataset, dataset_id).collection
    new = f"sluice-{uuid.uuid4().hex[:16]}"
    done = Rebuild(old, new)
    try:
        done.copied = _copy(ctx, old, new)
        with Session(ctx.engine) as session:
            switched = matched(
                session,
                update(Dataset)
                .where(col(Dataset.id) == dataset_id, col(Dataset.collection) == old)
                .values(collection=new)
                .execution_options(synchronize_session=False),
            )
            session.commit()
        if switched != 1:
            raise RuntimeError(f"the dataset's collection changed from {old} during the rebuild")
    except BaseException:
        ctx.vectors.drop_collection(new)
        raise
    log.info("dataset %s now searches %s (was %s)", dataset_id, new, old)
    # Jobs that were running may still write to the old collection: give them their time.
    writers = _writers(ctx, dataset_id)
    deadline = time.monotonic() + (
        wait_seconds if wait_seconds is not None else 3 * ctx.settings.lease_seconds
    )
    while writers & _writers(ctx, dataset_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    if writers:
        have = {cid for page in ctx.vectors.iter_pages(new, include=[]) for cid in page["ids"]}
        done.late = _copy(ctx, old, new, skip=have)
    ctx.vectors.drop_collection(old)
    return done


def check_index(
    ctx: Context,
    ds: Dataset,
    *,
    repair: bool,
    actions: list[str],
    errors: list[str],
    sample: int = SAMPLE,
) -> tuple[Dataset, RecallAudit]:
    """Audit what the dataset's index returns; with ``repair``, rebuild it when it falls below the
    threshold and audit the new one. Returns the dataset as it is now, and the (last) audit."""
    found = audit_recall(ctx, ds.collection, sample=sample)
    if found.healthy or not repair:
        return ds, found
    try:
        done = rebuild(ctx, ds.id)
    except Exception as exc:
        errors.append(f"{ds.name}: rebuilding the vector index failed: {exc}")
        return ds, found
    actions.append(f"[{ds.name}] {done.describe()}; before: {found.describe()}")
    with Session(ctx.engine, expire_on_commit=False) as session:
        ds = stored(session, Dataset, ds.id)
    return ds, audit_recall(ctx, ds.collection, sample=sample)
