"""Files from the wild: each ends in the right class, with the right text, in the right order.

Every file here is generated on the spot (tests/support/pdfmaker.py) to reproduce one symptom seen
on real-world PDFs.
"""

import re

import pytest

from sluice.errors import PermanentError, UserActionError
from sluice.pipeline.parsing.parse import PDF, open_document, sniff_type
from sluice.pipeline.running.chunk import split_text
from sluice.storage.models import JobStatus
from tests.support import pdfmaker
from tests.support.helpers import collection, events
from tests.support.helpers import run_file as run

WORDS = " ".join(
    f"Sentence {i} tells how the lighthouse keeper logged the storm." for i in range(30)
)


def read(tmp_path, data: bytes, name="file.pdf"):
    path = tmp_path / name
    path.write_bytes(data)
    parsed = open_document(path, media_type=PDF, max_pages=100)
    try:
        return parsed, list(parsed.pages())
    finally:
        parsed.close()


# 1. unreadable files are permanent at once; a broken page is skipped and recorded


@pytest.mark.parametrize("make", [pdfmaker.page_tree_cycle, pdfmaker.invalid_page_count])
def test_unreadable_structure_is_permanent(tmp_path, make):
    with pytest.raises(PermanentError) as err:
        read(tmp_path, make())
    assert err.value.code == "unreadable_pdf"


def test_unreadable_structure_fails_once_as_permanent_in_a_job(ctx):
    for make in (pdfmaker.page_tree_cycle, pdfmaker.invalid_page_count):
        j = run(ctx, make(), f"{make.__name__}.pdf")
        assert (j.status, j.error_kind.value, j.attempt) == (JobStatus.failed, "permanent", 1), (
            j.error_message
        )
        assert "retries" not in j.fix_hint


def test_a_broken_page_is_skipped_and_the_rest_indexed(tmp_path, ctx):
    parsed, pages = read(tmp_path, pdfmaker.one_broken_page())
    assert "lighthouses" in pages[0][1]
    assert [n for n, _ in pages] == [1, 2] and pages[1][1] == ""
    assert any("page 2" in w for w in parsed.warnings), parsed.warnings

    j = run(ctx, pdfmaker.one_broken_page(), "mixed.pdf")
    assert j.status == JobStatus.succeeded and j.chunk_count == 1
    assert any("page 2" in e.message for e in events(ctx, j.id) if e.kind == "warning")


# 2. a repaired file whose pages all read is not "truncated"; the repair is a warning


@pytest.mark.parametrize("variant", sorted(pdfmaker.repaired_variants()))
def test_damaged_ends_that_lose_nothing_are_read_with_a_warning(tmp_path, variant):
    parsed, pages = read(tmp_path, pdfmaker.repaired_variants()[variant])
    assert [("observatory" in text) for _, text in pages] == [True, True, True]


def test_repair_is_surfaced_on_the_job(ctx):
    j = run(ctx, pdfmaker.repaired_variants()["nul_padding"], "padded.pdf")
    assert j.status == JobStatus.succeeded
    assert any("repair" in e.message for e in events(ctx, j.id) if e.kind == "warning")


def test_a_file_cut_in_half_is_still_truncated(tmp_path):
    with pytest.raises(PermanentError) as err:
        read(tmp_path, pdfmaker.cut_in_half())
    assert err.value.code == "truncated_pdf" and "of 3 are lost" in err.value.message


# 3. a PDF without its header is still a PDF


def test_pdf_without_header_is_sniffed_as_pdf_and_indexed_as_text(ctx, tmp_path):
    data = pdfmaker.without_header()
    assert not data.startswith(b"%PDF")
    assert sniff_type(data[:8192], "lost-header.pdf") == PDF
    assert sniff_type(data[:8192], "lost-header.txt") == PDF
    j = run(ctx, data, "lost-header.pdf")
    assert j.status == JobStatus.succeeded
    texts = [
        d
        for page in ctx.vectors.iter_pages(
            collection(ctx), where={"job_id": j.id}, include=["documents"]
        )
        for d in page["documents"]
    ]
    assert texts and all("glaciers" in t and " obj" not in t for t in texts)


def test_plain_text_that_mentions_pdf_words_stays_text():
    text = b"Notes on PDF: an object looks like 1 0 obj and the table is called xref.\n"
    assert sniff_type(text, "notes.txt") != PDF


# 4. successes that hold nothing


def test_xfa_placeholder_is_a_user_action_not_a_success(tmp_path, ctx):
    with pytest.raises(UserActionError) as err:
        read(tmp_path, pdfmaker.xfa_form())
    assert err.value.code == "xfa_form" and "flatten" in err.value.hint.lower()
    j = run(ctx, pdfmaker.xfa_form(), "form.pdf")
    assert j.status == JobStatus.failed and j.error_code == "xfa_form" and j.attempt == 1


def test_pages_holding_only_a_page_number_are_skipped(tmp_path):
    parsed, pages = read(tmp_path, pdfmaker.page_numbers_only(WORDS))
    assert "lighthouse" in pages[0][1]
    assert [text for _, text in pages[1:]] == ["", "", ""]
    assert any("2, 3, 4" in w or "2-4" in w for w in parsed.warnings), parsed.warnings


@pytest.mark.parametrize("text", ["7", " 12 ", "- 3 -", "ii", "Page 4", "4 / 12", "..."])
def test_chunks_below_the_minimum_of_meaningful_text_are_never_made(text):
    assert split_text(text, size=800, overlap=100) == []


def test_short_real_text_still_makes_a_chunk():
    assert split_text("Hello World", size=800, overlap=100) == ["Hello World"]
    assert split_text("東京駅", size=800, overlap=100) == ["東京駅"]


def test_drawings_only_and_blank_files_are_not_sent_to_ocr(ctx):
    drawn = run(ctx, pdfmaker.drawings_only(), "drawing.pdf")
    assert drawn.status == JobStatus.failed and drawn.error_code == "no_text_drawings_only"
    assert "OCR" not in drawn.error_message and "ocrmypdf" not in drawn.fix_hint
    empty = run(ctx, pdfmaker.blank(), "blank.pdf")
    assert empty.status == JobStatus.failed and empty.error_code == "blank_pages"
    assert "ocrmypdf" not in empty.fix_hint
    scanned = run(ctx, pdfmaker.image_only(), "scan.pdf")
    assert scanned.error_code == "no_text_even_by_ocr"  # a picture: OCR ran (tests/test_ocr.py)


# 5. reading order


def _order(text: str, sentences: list[str]) -> list[int]:
    flat = re.sub(r"\s+", " ", text)
    return [flat.find(s) for s in sentences]


def test_two_column_form_reads_column_by_column(tmp_path):
    _, pages = read(tmp_path, pdfmaker.two_column_form())
    text = pages[0][1]
    left = _order(text, pdfmaker.SENTENCES_LEFT)
    right = _order(text, pdfmaker.SENTENCES_RIGHT)
    assert -1 not in left + right, text[:400]
    assert left == sorted(left) and right == sorted(right)
    assert max(left) < min(right)  # the whole left column before the right one
    assert text.index("Harbour survey form") < min(left) and text.index("Page footer") > max(right)


VERTICAL = [
    "吾輩は猫である。名前はまだ無い。",
    "どこで生れたかとんと見当がつかぬ。",
    "何でも薄暗いじめじめした所で泣いていた。",
]


def test_vertical_japanese_reads_in_columns_right_to_left(tmp_path):
    _, pages = read(tmp_path, pdfmaker.vertical_japanese(VERTICAL))
    lines = [line for line in pages[0][1].split("\n") if line.strip()]
    assert lines == VERTICAL


# 7. messages


def test_failure_names_the_file_not_the_blob_and_keeps_the_page_count(ctx):
    j = run(ctx, pdfmaker.xfa_form(), "tax-form-2024.pdf")
    assert "blobs" not in j.error_message and str(ctx.settings.blob_dir) not in (
        j.error_message or ""
    )
    assert j.page_count == 1

    garbage = b"%PDF-1.7\n" + bytes(range(256)) * 40
    j = run(ctx, garbage, "scrambled.pdf")
    assert j.status == JobStatus.failed and j.error_kind.value == "permanent"
    assert "blobs" not in j.error_message and "scrambled.pdf" in j.error_message


def test_text_in_lost_fonts_is_not_indexed_as_garbage(tmp_path, ctx):
    with pytest.raises(UserActionError) as err:
        read(tmp_path, pdfmaker.fonts_lost(damaged_end=False))
    assert err.value.code == "undecodable_text" and "OCR" in err.value.hint
    with pytest.raises(PermanentError) as err:
        read(tmp_path, pdfmaker.fonts_lost(damaged_end=True))
    assert err.value.code == "truncated_pdf"


def test_a_text_file_without_meaningful_text_is_not_a_success(ctx):
    j = run(ctx, b"  7\n\n - \n", "page-seven.txt")
    assert (j.status, j.error_code, j.attempt) == (JobStatus.failed, "no_text", 1)
