"""OCR fidelity and speed: scans of known text read back through Sluice's parser.

    python -m bench.ocr [--pages N] [--out BENCHMARKS.md]

Each page of known text (ten-point to twelve-point body text, as in office documents) is typeset
with PyMuPDF, rendered to a grey image at the scan resolution and kept as an image only, as a
flatbed scanner writes it. The parser (sluice.pipeline.parsing.parse, in its child process, with
Tesseract) reads the file back; character accuracy is 1 - the edit distance share of difflib's
matcher between the known and the read text (spaces collapsed); speed is pages per second of the
whole parse, child start included. The degraded scan (turned 0.8 degrees, 2% of pixels flipped) is
read twice: with Sluice's clean-up before Tesseract (despeckle, straighten) and without it, as
before. With --out, the table replaces the "OCR" section of that file.
"""

from __future__ import annotations

import argparse
import difflib
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pymupdf

from bench.report import load_average, write_section
from sluice.pipeline.parsing.parse import PDF, OcrOptions, ParseLimits, open_document

WORDS = (
    "harbour crane ledger invoice quarterly revenue municipal housing pump river delta storm "
    "season archive observatory contract clause tenant payment schedule engine valve pressure "
    "reading meter station report committee minutes budget 2024 12.5% 4,700 EUR No. 17"
).split()


def page_text(rng: random.Random, sentences: int = 14) -> str:
    out = []
    for _ in range(sentences):
        words = [rng.choice(WORDS) for _ in range(rng.randint(8, 16))]
        out.append(" ".join(words).capitalize() + ".")
    return " ".join(out)


def scan(texts: list[str], dpi: int, fontsize: float, degraded: bool = False) -> bytes:
    """``degraded``: turned by 0.8 degrees and speckled (2% of pixels flipped), as a cheap
    scanner."""
    src = pymupdf.open()
    for text in texts:
        src.new_page().insert_textbox(pymupdf.Rect(72, 72, 540, 760), text, fontsize=fontsize)
    out = pymupdf.open()
    rng = random.Random(7)
    for page in src:
        pix = page.get_pixmap(dpi=dpi, colorspace=pymupdf.csGRAY)
        if degraded:
            from PIL import Image

            img = Image.frombytes("L", (pix.width, pix.height), pix.samples)
            img = img.rotate(0.8, resample=Image.Resampling.BICUBIC, fillcolor=255)
            px = img.load()
            for _ in range(img.width * img.height // 50):
                x, y = rng.randrange(img.width), rng.randrange(img.height)
                px[x, y] = 255 - px[x, y]
            pix = pymupdf.Pixmap(pymupdf.csGRAY, img.width, img.height, img.tobytes(), False)
        out.new_page(width=page.rect.width, height=page.rect.height).insert_image(
            page.rect, pixmap=pix
        )
    return out.tobytes(deflate=True)


def accuracy(truth: str, got: str) -> float:
    a, b = " ".join(truth.split()), " ".join(got.split())
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def measure(
    pages: int, dpi: int, fontsize: float, degraded: bool = False, cleanup: bool = True
) -> dict:
    rng = random.Random(dpi * 100 + int(fontsize))
    texts = [page_text(rng) for _ in range(pages)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "scan.pdf"
        path.write_bytes(scan(texts, dpi, fontsize, degraded))
        start = time.perf_counter()
        parsed = open_document(
            path,
            media_type=PDF,
            max_pages=pages,
            limits=ParseLimits(),
            ocr=OcrOptions("auto", dpi, "eng", cleanup=cleanup),
        )
        read = dict(parsed.pages())
        seconds = time.perf_counter() - start
    scores = [accuracy(t, read.get(i + 1, "")) for i, t in enumerate(texts)]
    return {
        "dpi": dpi,
        "font": fontsize,
        "scan": "turned 0.8°, 2% speckle" if degraded else "clean",
        "cleanup": cleanup,
        "pages": pages,
        "accuracy": statistics.mean(scores),
        "worst": min(scores),
        "pages_per_s": pages / seconds,
    }


def table(rows: list[dict], load: str = "") -> str:
    lines = [
        "## OCR (Tesseract, scanned pages of known text)",
        "",
        "| scan and OCR dpi | font pt | scan | clean-up | pages | character accuracy (mean) | "
        "worst page | pages/s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['dpi']} | {r['font']:g} | {r['scan']} | "
            f"{'on' if r['cleanup'] else 'off (as before)'} | {r['pages']} | {r['accuracy']:.2%} | "
            f"{r['worst']:.2%} | {r['pages_per_s']:.2f} |"
        )
    if load:
        lines += [
            "",
            f"Load average (1/5/15 min) at the end: {load}; the machine was shared with other "
            "work, so pages/s is lower than on an idle machine.",
        ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=10)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    plan = (
        (150, 11, False, True),
        (150, 9, False, True),
        (150, 11, True, True),
        (150, 11, True, False),
        (200, 11, False, True),
        (300, 11, False, True),
    )
    rows = [
        measure(args.pages, dpi, font, degraded, cleanup) for dpi, font, degraded, cleanup in plan
    ]
    section = table(rows, load_average())
    print(section)
    if args.out:
        write_section(args.out, "## OCR (Tesseract", section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
