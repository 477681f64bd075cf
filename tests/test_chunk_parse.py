"""Chunking is deterministic with overlap and records pages; types come from the bytes."""

import pymupdf
import pytest

from sluice.errors import PermanentError, UserActionError
from sluice.pipeline.parsing.parse import (
    MARKDOWN,
    PDF,
    TEXT,
    decode_text,
    open_document,
    sniff_type,
)
from sluice.pipeline.running.chunk import chunk_pages, split_text


def test_split_is_deterministic_bounded_and_overlapping():
    text = " ".join(f"word{i}" for i in range(2000))
    a = split_text(text, size=200, overlap=40)
    assert a == split_text(text, size=200, overlap=40)
    assert all(len(c) <= 200 for c in a)
    for left, right in zip(a, a[1:], strict=False):
        assert right.split()[0] in left  # the next chunk starts inside the previous one
    words = set(text.split())
    assert set(" ".join(a).split()) == words  # nothing lost


def test_chunks_never_span_pages_and_record_them():
    pages = [(1, "alpha " * 300), (2, ""), (3, "omega " * 10)]
    chunks = list(chunk_pages(pages, size=400, overlap=50))
    assert [c.position for c in chunks] == list(range(len(chunks)))
    assert {c.page for c in chunks} == {1, 3}
    assert chunks[-1].page == 3 and chunks[-1].text.startswith("omega")


def test_pdf_is_read_page_by_page(tmp_path):
    doc = pymupdf.open()
    for i in range(3):
        doc.new_page().insert_text((72, 72), f"Page number {i + 1} speaks of subject {i + 1}.")
    path = tmp_path / "three.pdf"
    doc.save(path)
    parsed = open_document(path, media_type=PDF, max_pages=10)
    pages = list(parsed.pages())
    assert [n for n, _ in pages] == [1, 2, 3]
    assert "subject 2" in pages[1][1]


@pytest.mark.parametrize(
    "head,name,expected",
    [
        (b"%PDF-1.4 rest", "x.bin", PDF),
        (b"plain words\n", "notes.txt", TEXT),
        (b"# Title\n", "readme.md", MARKDOWN),
        ("caf\u00e9 cr\u00e8me".encode("utf-16"), "u16.txt", TEXT),
    ],
)
def test_sniff_type(head, name, expected):
    assert sniff_type(head, name) == expected


def test_sniff_refuses_mislabelled_and_empty():
    with pytest.raises(UserActionError, match="image/png"):
        sniff_type(b"\x89PNG\r\n\x1a\n" + b"\x00" * 64, "report.pdf")
    with pytest.raises(PermanentError, match="empty"):
        sniff_type(b"", "empty.txt")


def test_decode_text_handles_legacy_encodings():
    assert decode_text("Grüße aus Köln".encode("cp1252")) == "Grüße aus Köln"
    assert decode_text(b"\xef\xbb\xbfbom text") == "bom text"
