"""The hybrid fusion's constant (issue 41 item 5), on hits made by hand: no server, no model.

Reciprocal rank fusion scores a hit ``w / (RRF_K + rank)`` per ranker. Measured on SciFact
abstracts through Sluice's own search (BENCHMARKS.md, "Retrieval quality on a BEIR dataset"), a
small constant ranks documents better than the customary 60: a ranker's first places count more
against hits both rankers only half agree on. This pins that property down."""

from __future__ import annotations

from sluice.ops.search import SearchHit, _fuse
from sluice.storage.lexical import LexicalHit


def _dense(cid: str, document: int) -> SearchHit:
    return SearchHit(
        filename=f"{document}.txt",
        page=1,
        score=0.5,
        text=cid,
        job_id=document,
        document_id=document,
        chunk_id=cid,
        pipeline_version="v",
        matched=["dense"],
        similarity=0.5,
    )


def _lexical(cid: str, document: int) -> LexicalHit:
    return LexicalHit(
        chunk_id=cid,
        document_id=document,
        job_id=document,
        position=0,
        page=1,
        text=cid,
        filename=f"{document}.txt",
        media_type="text/plain",
        score=3.0,
        strict=False,  # a sentence typed: no chunk holds every word (the loose match)
    )


def test_a_first_place_outweighs_middling_agreement():
    """A: the dense ranker's first, the lexical ranker's tenth; B: fifth in both. A comes first
    (with the customary 60, B did: 1/61 + 1/70 < 2/65)."""
    dense = [_dense("A", 1)] + [_dense(f"d{i}", 10 + i) for i in range(2, 5)] + [_dense("B", 2)]
    lexical = (
        [_lexical(f"l{i}", 20 + i) for i in range(1, 5)]
        + [_lexical("B", 2)]
        + [_lexical(f"m{i}", 30 + i) for i in range(6, 10)]
        + [_lexical("A", 1)]
    )
    order = [h.chunk_id for h in _fuse(None, dense, lexical, required=False)]  # type: ignore[arg-type]
    assert order.index("A") < order.index("B")
    assert order[0] == "A"
