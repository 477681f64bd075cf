"""Hit testing (Dify's name): one query against one dataset, with what each ranker made of every
hit (dense rank and cosine similarity, lexical rank and score, the fused rank and score), and the
operator's last queries (sluice.storage.hit_tests) to run again. The ranking is search's own
(sluice.ops.search); nothing here changes it."""

from __future__ import annotations

from dataclasses import dataclass

from sqlmodel import Session

from sluice.ops.access import Operator
from sluice.ops.search import SearchHit, search
from sluice.pipeline.running.context import get_context
from sluice.storage import hit_tests
from sluice.storage.hit_tests import HitTestQuery


@dataclass
class HitTest:
    dataset: str
    query: str
    mode: str
    k: int
    hits: list[SearchHit]

    def rows(self) -> list[dict]:
        """One row per hit, best first, each ranker's view beside the fused one."""
        return [
            {
                "rank": i,
                "file": h.filename,
                "where": h.where or f"page {h.page}",
                "found by": " and ".join(h.matched),
                "score": h.score,
                "dense rank": h.dense_rank,
                "similarity": h.similarity,
                "distance": None if h.similarity is None else round(1 - h.similarity, 4),
                "lexical rank": h.lexical_rank,
                "lexical score": h.lexical_score,
                "text": h.text,
            }
            for i, h in enumerate(self.hits, start=1)
        ]


def run(who: Operator, *, dataset: str, query: str, mode: str, k: int, **controls) -> HitTest:
    """Search as the Search page does and add the query to ``who``'s history (UnknownDataset,
    BadQuery as search raises them; a query that raised is not kept). ``controls``: search's
    ``where``, ``min_score``, ``max_chunks_per_document`` and ``dense_weight`` (the history keeps
    the query, its mode and k)."""
    ctx = get_context()
    hits = search(ctx, query=query, dataset=dataset, k=k, mode=mode, **controls)
    with Session(ctx.engine) as session:
        hit_tests.record(
            session=session,
            operator=who.name,
            dataset=dataset,
            query=query,
            mode=mode,
            k=k,
            hits=len(hits),
        )
    return HitTest(dataset, query, mode, k, hits)


def history(who: Operator) -> list[HitTestQuery]:
    """``who``'s last queries, newest first."""
    with Session(get_context().engine, expire_on_commit=False) as session:
        return hit_tests.recent(session=session, operator=who.name)
