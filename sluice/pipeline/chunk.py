"""Deterministic chunking with overlap; every chunk records its page.

The same text and settings always give the same chunks in the same order, so chunk ids derived
from position are stable across runs. Chunks never span pages.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

CHUNKER_VERSION = "recursive-v1"
SEPARATORS = ("\n\n", "\n", ". ", "? ", "! ", "; ", ", ", " ")

_SPACES = re.compile(r"[ \t\u00a0]+")
_BLANKS = re.compile(r"\n\s*\n+")


@dataclass(frozen=True)
class Chunk:
    position: int
    page: int
    text: str


def normalise(text: str) -> str:
    text = _SPACES.sub(" ", text)
    text = _BLANKS.sub("\n\n", text)
    return "\n".join(line.strip() for line in text.split("\n")).strip()


def split_text(text: str, *, size: int, overlap: int) -> list[str]:
    """Split at the strongest separator in the second half of each window, with overlap."""
    text = normalise(text)
    if not text:
        return []
    chunks: list[str] = []
    n = len(text)
    start = 0
    while start < n:
        end = min(start + size, n)
        if end < n:
            floor = start + size // 2
            for sep in SEPARATORS:
                cut = text.rfind(sep, floor, end)
                if cut != -1:
                    end = cut + len(sep)
                    break
        piece = text[start:end].strip()
        if piece:
            chunks.append(piece)
        if end >= n:
            break
        nxt = max(start + 1, end - overlap)
        if overlap:
            space = text.find(" ", nxt, end)  # start the overlap at a word boundary
            if space != -1:
                nxt = space + 1
        start = nxt
    return chunks


def chunk_pages(pages: Iterable[tuple[int, str]], *, size: int, overlap: int) -> Iterator[Chunk]:
    """Chunks of a stream of (page, text), numbered in order."""
    position = 0
    for page, text in pages:
        for piece in split_text(text, size=size, overlap=overlap):
            yield Chunk(position, page, piece)
            position += 1
