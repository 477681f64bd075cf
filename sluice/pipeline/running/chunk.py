"""Deterministic chunking with overlap; every chunk records its page.

The same text and settings always give the same chunks in the same order, so chunk ids derived
from position are stable across runs. Chunks never span pages.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

CHUNKER_VERSION = "recursive-v2"  # v2: chunks without meaningful text are dropped
SEPARATORS = ("\n\n", "\n", ". ", "? ", "! ", "; ", ", ", " ")

_SPACES = re.compile(r"[ \t\u00a0]+")
_BLANKS = re.compile(r"\n\s*\n+")
# A text whose only words are a page number: "7", "- 7 -", "Page 7", "7 / 12", "vii".
PAGE_NUMBER = re.compile(
    r"^\W*(?:(?:page|p\.|seite|pagina|página|стр\.?)\s*)?(?:\d{1,5}|[ivxlcdm]{1,7})"
    r"(?:\s*(?:of|/|de|von|из)\s*(?:\d{1,5}|[ivxlcdm]{1,7}))?\W*$",
    re.IGNORECASE,
)
MIN_MEANINGFUL = (
    3  # letters or digits a text needs to be worth a chunk (one CJK character is a word)
)


def meaningful(text: str) -> bool:
    """True when a text holds something worth indexing: more than a page number or punctuation.
    A one-character chunk matches unrelated searches; it is never made."""
    if sum(1 for ch in text if ch.isalnum()) < MIN_MEANINGFUL:
        return False
    return not PAGE_NUMBER.match(text.strip())


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
        if piece and meaningful(piece):
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
