"""A hit's parent section (Dify's and RAGFlow's parent-child retrieval): with a dataset's
``context_size`` set, small chunks are what search matches, and each hit also carries ``context``,
the text of its own section around it (its neighbouring chunks under the same heading path, joined
where they overlap) up to that many characters. Read from the word index at search time, so the
setting changes no chunk and needs no reindex."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from sluice.pipeline.running.chunk import heading_of
from sluice.storage import lexical

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

REACH = 16  # neighbouring chunks read on each side of a hit, at most
MAX_CONTEXT = 20_000  # characters a context may be set to
MIN_OVERLAP = 8  # characters two chunks must share to be joined as overlapping (else: a new line)


def join(a: str, b: str) -> str:
    """Two neighbouring chunks as one text: the longest end of ``a`` that ``b`` starts with (the
    chunks' overlap) is kept once."""
    for n in range(min(len(a), len(b)), MIN_OVERLAP - 1, -1):
        if a.endswith(b[:n]):
            return a + b[n:]
    return f"{a}\n{b}"


def section(own: int, rows: Sequence[tuple[int, str]], size: int) -> str:
    """The text of the chunk at ``own`` among its neighbours ``rows`` (position, text), grown a
    chunk at a time on either side while the neighbour is of the same section and the whole stays
    within ``size`` characters (the chunk itself always whole)."""
    by_position = dict(rows)
    path, body = heading_of(by_position[own])
    parts = {own: body}
    length, left, right = len(body), own - 1, own + 1
    grown = True
    while grown:
        grown = False
        for side in (right, left):
            value = by_position.get(side)
            if value is None:
                continue
            their_path, their_body = heading_of(value)
            if their_path != path or length + len(their_body) > size:
                continue
            parts[side] = their_body
            length += len(their_body)
            grown = True
            if side == right:
                right += 1
            else:
                left -= 1
    text = ""
    for position in sorted(parts):
        text = parts[position] if not text else join(text, parts[position])
    return text


def contexts(
    engine: Engine, dataset_id: int, chunk_ids: Sequence[str], size: int
) -> dict[str, str]:
    """Each chunk id's section text around it, at most ``size`` characters (with its own text)."""
    found = lexical.neighbours(engine, dataset_id, chunk_ids, REACH)
    return {cid: section(own, rows, size) for cid, (own, rows) in found.items()}
