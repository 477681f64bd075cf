"""OCR of pages without a usable text layer: scans of known text are found by a phrase from them;
pictures without text end as "no text found, even by OCR"; pages with text are not sent to OCR."""

import difflib
import shutil

import pymupdf
import pytest

from sluice.errors import UserActionError
from sluice.ops.search import search
from sluice.pipeline.parsing import ocr
from sluice.pipeline.parsing.parse import PDF, OcrOptions, open_document
from sluice.storage.models import JobStatus
from tests.support import pdfmaker
from tests.support.helpers import collection, events
from tests.support.helpers import run_file as run

pytestmark = pytest.mark.skipif(
    shutil.which("tesseract") is None, reason="needs Debian's tesseract-ocr: `make ocr`"
)


def read(tmp_path, data: bytes, **options):
    path = tmp_path / "file.pdf"
    path.write_bytes(data)
    seen: list[tuple[int, int]] = []
    parsed = open_document(path, media_type=PDF, max_pages=100, ocr=OcrOptions(**options))
    parsed.on_ocr = lambda page, total: seen.append((page, total))
    try:
        return parsed, list(parsed.pages()), seen
    finally:
        parsed.close()


def _accuracy(truth: str, got: str) -> float:
    a, b = " ".join(truth.split()), " ".join(got.split())
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def test_character_accuracy_on_a_150_dpi_scan_of_known_text(tmp_path):
    parsed, pages, seen = read(tmp_path, pdfmaker.scanned(dpi=150), dpi=150)
    assert sorted({n for n, _ in seen}) == [1, 2] and parsed.ocr_pages == [1, 2]
    for (_, text), truth in zip(pages, pdfmaker.SCANNED_TEXT, strict=True):
        assert _accuracy(truth, text) >= 0.95, text


def test_a_cheap_scanners_turned_and_speckled_page_reads_at_150_dpi(tmp_path):
    # turned 0.8 degrees, 2% of pixels flipped: Tesseract alone read 86% of this page's characters
    data = pdfmaker.scanned([pdfmaker.CHEAP_SCAN_TEXT], dpi=150, turn=0.8, speckle=0.02)
    parsed, pages, _ = read(tmp_path, data, dpi=150)
    assert parsed.ocr_pages == [1]
    assert _accuracy(pdfmaker.CHEAP_SCAN_TEXT, pages[0][1]) >= 0.95, pages[0][1]


def test_a_page_turned_clockwise_by_two_degrees_reads_at_150_dpi(tmp_path):
    # turned 2 degrees clockwise, not speckled: Tesseract alone read 75% of the characters
    text = pdfmaker.CHEAP_SCAN_TEXT
    data = pdfmaker.scanned([text], dpi=150, turn=-2.0)
    parsed, pages, _ = read(tmp_path, data, dpi=150)
    assert _accuracy(text, pages[0][1]) >= 0.95, pages[0][1]


def test_a_speckled_150_dpi_scan_read_at_300_dpi_is_read_at_its_own_resolution(tmp_path):
    # rendered at 300 dpi each speck became a blot: Tesseract read nothing and the file was refused
    data = pdfmaker.scanned([pdfmaker.CHEAP_SCAN_TEXT], dpi=150, turn=0.8, speckle=0.02)
    parsed, pages, _ = read(tmp_path, data, dpi=300)
    assert _accuracy(pdfmaker.CHEAP_SCAN_TEXT, pages[0][1]) >= 0.95, pages[0][1]


def test_a_scanned_pdf_is_found_by_a_phrase_from_it(ctx):
    j = run(ctx, pdfmaker.scanned(), "scan.pdf")
    assert j.status == JobStatus.succeeded, (j.error_code, j.error_message)
    hits = search(
        ctx, query="fog horn sounded twice a minute across the bay", dataset="default", k=1
    )
    assert hits and hits[0].filename == "scan.pdf" and hits[0].page == 1
    assert "lighthouse keeper" in hits[0].text and hits[0].ocr
    done = [e for e in events(ctx, j.id) if e.kind == "succeeded"][0]
    assert "ocr" in done.data["stages"]  # the stage progress went through "ocr N/M pages"
    assert any("read by OCR" in (e.message or "") for e in events(ctx, j.id) if e.kind == "warning")


def test_chunk_metadata_marks_ocr_text_and_pages_with_text_skip_ocr(ctx, tmp_path):
    typed = pymupdf.open(
        stream=pdfmaker.text_pdf(["The typed page talks about copper kettles and tin roofs."]),
        filetype="pdf",
    )
    mixed = pymupdf.open(stream=pdfmaker.scanned(), filetype="pdf")
    mixed.insert_pdf(typed, start_at=0)  # page 1 typed, pages 2-3 scanned
    data = mixed.tobytes()
    parsed, pages, seen = read(tmp_path, data)
    assert sorted({n for n, _ in seen}) == [2, 3] and parsed.ocr_pages == [2, 3]

    j = run(ctx, data, "mixed.pdf")
    assert j.status == JobStatus.succeeded
    ids = ctx.vectors.ids_where(collection(ctx), {"job_id": j.id})
    got = ctx.vectors.get(collection(ctx), ids, include=["metadatas"])
    marks = {m["page"]: m["ocr"] for m in got["metadatas"]}
    assert marks == {1: False, 2: True, 3: True}


def test_a_picture_without_text_ends_as_no_text_found_even_by_ocr(ctx):
    j = run(ctx, pdfmaker.image_only(), "picture.pdf")
    assert (j.status, j.error_kind.value, j.error_code, j.attempt) == (
        JobStatus.failed,
        "user_action_required",
        "no_text_even_by_ocr",
        1,
    )
    assert "no text found, even by OCR" in j.error_message
    assert "ocrmypdf" not in j.fix_hint
    # it failed where OCR read the page: the Jobs page says "ocr 1/1 pages", not "parsing"
    assert (j.stage.value, j.done, j.total) == ("ocr", 1, 1)


def test_ocr_off_keeps_the_old_refusal_and_says_how_to_turn_it_on(tmp_path):
    with pytest.raises(UserActionError) as err:
        read(tmp_path, pdfmaker.scanned(), mode="off")
    assert err.value.code == "no_text_layer" and "SLUICE_OCR_MODE=auto" in err.value.hint


def test_ocr_always_reads_pages_that_have_text(tmp_path):
    parsed, pages, seen = read(tmp_path, pdfmaker.text_pdf(pdfmaker.SCANNED_TEXT), mode="always")
    assert parsed.ocr_pages == [1, 2]
    assert _accuracy(pdfmaker.SCANNED_TEXT[0], pages[0][1]) >= 0.95


def test_ocr_always_reads_typed_text_over_a_coarse_page_background_sharply(tmp_path):
    # a scan is read at its own resolution; typed text over a 36 dpi background image is not a scan
    doc = pymupdf.open(stream=pdfmaker.text_pdf(pdfmaker.SCANNED_TEXT[:1]), filetype="pdf")
    background = pymupdf.Pixmap(pymupdf.csGRAY, 306, 396, bytes([235]) * (306 * 396), False)
    doc[0].insert_image(doc[0].rect, pixmap=background, overlay=False)
    parsed, pages, _ = read(tmp_path, doc.tobytes(), mode="always", dpi=200)
    assert _accuracy(pdfmaker.SCANNED_TEXT[0], pages[0][1]) >= 0.95, pages[0][1]


def test_without_tesseract_the_job_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv(
        "PATH", str(tmp_path)
    )  # the child runs by absolute path; tesseract is not found
    with pytest.raises(UserActionError) as err:
        read(tmp_path, pdfmaker.scanned())
    assert err.value.code == "no_text_layer" and "make ocr" in err.value.hint


def test_low_confidence_specks_are_not_text():
    tsv = (
        "level\tpage_num\tblock_num\tpar_num\tline_num\tword_num\tleft\ttop\twidth\theight\tconf\ttext\n"
        "5\t1\t1\t1\t1\t1\t0\t0\t9\t9\t12.5\t~~|\n"
        "5\t1\t1\t1\t1\t2\t0\t0\t9\t9\t91.0\tHarbour\n"
        "5\t1\t2\t1\t1\t1\t0\t0\t9\t9\t88.0\tcranes\n"
    )
    assert ocr.words_to_text(tsv) == "Harbour\n\ncranes"
