"""OCR of one page image with Debian's Tesseract (``make ocr`` installs it; never a download).

Runs inside the extraction child (sluice.pipeline.parsing.extract): PyMuPDF renders the page in
grey, the ``tesseract`` command reads the PNG on stdin and writes its words as TSV with a confidence
each. Words under ``MIN_CONFIDENCE`` are dropped: on a photograph or a cartoon Tesseract finds
nothing, or a few low-confidence "words" made of edges, and those must not be indexed as text.

Before Tesseract, a scanned page is cleaned up where that helps (``render``): it is rendered at no
more than the scan's own resolution, so a speck stays one pixel (a coarse scan is scaled up to
150 dpi); a page speckled by a cheap scanner (many isolated pixels) goes through a median filter;
a page turned by a few degrees is turned back (the angle at which its rows of ink line up best).
Tesseract alone reads a speckled page as four fifths of its characters, and small print turned
2 degrees clockwise as three quarters. A clean, straight page goes to Tesseract as rendered: the
median blurs small print and would cost clean pages about a point of accuracy.
"""

from __future__ import annotations

import csv
import io
import math
import os
import shutil
import subprocess

MODES = ("auto", "always", "off")
MIN_CONFIDENCE = 50.0  # of 100; real words on a clean 150 dpi scan score 85-96
MAX_PIXELS = 40_000_000  # a page image larger than this is rendered at a lower resolution
PAGE_SECONDS = 120  # one page; the parse deadline bounds the whole file


NOT_INSTALLED = (
    "Tesseract is not installed (`make ocr`, or apt-get install tesseract-ocr tesseract-ocr-eng)"
)


class OcrUnavailable(Exception):
    """Tesseract, or the language asked for, is not installed."""


def available(language: str = "eng") -> str | None:
    """None when Tesseract and ``language`` are installed; else what is missing, said plainly."""
    if shutil.which("tesseract") is None:
        return NOT_INSTALLED
    try:
        out = subprocess.run(
            ["tesseract", "--list-langs"],
            capture_output=True,
            timeout=30,
            env=_tesseract_env(),
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"Tesseract does not start ({exc})"
    installed = set(out.stdout.decode("utf-8", "replace").split()[1:] if out.stdout else [])
    wanted = [part for part in language.split("+") if part]
    missing = [part for part in wanted if part not in installed]
    if missing:
        return (
            f"the Tesseract language data {', '.join(missing)} is not installed "
            f"(apt-get install {' '.join('tesseract-ocr-' + m for m in missing)})"
        )
    return None


MIN_SCAN_DPI = 150  # a coarser scan is scaled up to this (or twice, when speckled) for Tesseract
SPECKLE_SHARE = 0.0005  # isolated pixels per pixel over which a page is speckled (clean pages: 0)
MAX_SKEW = 5.0  # degrees either way a page is searched for a turn
MIN_SKEW = 0.3  # a smaller turn is left to Tesseract


def render(page, dpi: int, *, cleanup: bool = True) -> tuple[bytes, int]:
    """The page as a grey PNG and the resolution used (lowered for a page too large to render).
    ``cleanup``: a scan is read at its own resolution, despeckled and straightened when it needs
    it."""
    import pymupdf

    native = scan_dpi(page) if cleanup else None
    want = dpi
    if native is not None and native < dpi:
        dpi = max(36, native)
    rect = page.rect
    pixels = (rect.width / 72 * dpi) * (rect.height / 72 * dpi)
    if pixels > MAX_PIXELS:
        dpi = want = max(36, int(dpi * (MAX_PIXELS / pixels) ** 0.5))
    pix = page.get_pixmap(dpi=dpi, colorspace=pymupdf.csGRAY, alpha=False)
    if not cleanup:
        return pix.tobytes("png"), dpi
    from PIL import Image

    img, dpi = despeckle(Image.frombytes("L", (pix.width, pix.height), pix.samples), dpi)
    img = straighten(img)
    pix = None
    scale = min(min(want, MIN_SCAN_DPI) / dpi, (MAX_PIXELS / (img.width * img.height)) ** 0.5)
    if (
        scale > 1
    ):  # a coarse scan: Tesseract reads small print better scaled up (72 dpi: 92% -> 100%)
        img = img.resize(
            (round(img.width * scale), round(img.height * scale)), Image.Resampling.BICUBIC
        )
        dpi = round(dpi * scale)
    out = io.BytesIO()
    img.save(out, "PNG", compress_level=1)
    return out.getvalue(), dpi


def scan_dpi(page) -> int | None:
    """The resolution of the image that covers most of a page without text (a scan), or None: no
    such image, or the page has text of its own (OCR mode "always", fonts that map no characters),
    which must be rendered at the resolution asked for. Rendering a scan above its own resolution
    only interpolates, and turns each speck into a blot (a speckled 150 dpi scan read at 300 dpi:
    no text at all)."""
    area = abs(page.rect)
    best = None
    try:
        if page.get_text("text").strip():
            return None
        infos = page.get_image_info()
    except Exception:
        return None
    for info in infos:
        x0, y0, x1, y1 = info.get("bbox", (0, 0, 0, 0))
        w, h = abs(x1 - x0), abs(y1 - y0)
        if not area or w * h < area / 2 or not info.get("width") or not info.get("height"):
            continue
        dpi = max(info["width"] * 72 / w, info["height"] * 72 / h)
        best = dpi if best is None else max(best, dpi)
    return None if best is None else int(round(best))


def _ink(img):
    return img.point(lambda v: 255 if v < 128 else 0)  # ink 255, paper 0


def speckle_share(img) -> float:
    """The share of pixels that differ from all eight neighbours (ink alone on paper, or paper alone
    in ink), in the middle half of the page: 0 on a clean scan, 1-2% on a cheap scanner's speckled
    page. Pillow only: importing numpy would cost the child more than the whole clean-up."""
    from PIL import ImageChops, ImageFilter

    band = _ink(img.crop((0, img.height // 4, img.width, img.height * 3 // 4)))
    around = band.filter(ImageFilter.Kernel((3, 3), [1, 1, 1, 1, 0, 1, 1, 1, 1], scale=8))
    alone = ImageChops.difference(band, around).histogram()[255]  # 255 only where all eight differ
    return alone / max(1, band.width * band.height)


def despeckle(img, dpi: int):
    """A speckled page through a 3x3 median (81% -> 99.7% of characters at 150 dpi), and a coarser
    one scaled up twice first, through a 5x5 median (100 dpi: 90% -> 98%; a 3x3 median at its own
    pixels eats its thin strokes). A clean page as it is: a median costs small print a point."""
    from PIL import Image, ImageFilter

    if speckle_share(img) < SPECKLE_SHARE:
        return img, dpi
    if dpi >= MIN_SCAN_DPI or img.width * img.height * 4 > MAX_PIXELS:
        return img.filter(ImageFilter.MedianFilter(3)), dpi
    img = img.resize((img.width * 2, img.height * 2), Image.Resampling.BICUBIC)
    return img.filter(ImageFilter.MedianFilter(5)), dpi * 2


def skew(img) -> float:
    """The page's turn in degrees (counter-clockwise positive), to a tenth: the shear at which the
    page's ink, summed along each row, stacks into the sharpest rows (sum of squared row sums).
    Worked on the page shrunk to about 100 columns (a turn of a few degrees moves a row by less than
    a pixel across one) and at most 1,800 rows."""
    from PIL import Image

    ink = _ink(img)
    if ink.histogram()[255] < 500:
        return 0.0
    w, h = min(100, ink.width), min(1800, ink.height)
    col, row = ink.width / w, ink.height / h  # page pixels per reduced column, per reduced row
    small = ink.resize((w, h), Image.Resampling.BOX).convert("F")
    margin = math.ceil(math.tan(math.radians(MAX_SKEW)) * ink.width / 2 / row) + 2

    def sharpness(angle: float) -> float:
        shift = math.tan(math.radians(angle)) * col / row  # reduced rows per reduced column
        sheared = small.transform(
            (w, h + 2 * margin),
            Image.Transform.AFFINE,
            (1, 0, 0, -shift, 1, shift * w / 2 - margin),
            resample=Image.Resampling.NEAREST,
        )
        return sum(
            v * v for v in sheared.resize((1, h + 2 * margin), Image.Resampling.BOX).getdata()
        )

    steps = round(MAX_SKEW * 2)
    coarse = max((k / 2 for k in range(-steps, steps + 1)), key=sharpness)
    fine = max((coarse + k / 10 for k in range(-4, 5)), key=sharpness)
    return round(fine, 1)


def straighten(img):
    """The page turned back when it is turned by MIN_SKEW..MAX_SKEW degrees; else as it is."""
    from PIL import Image

    angle = skew(img)
    if abs(angle) < MIN_SKEW:
        return img
    return img.rotate(-angle, resample=Image.Resampling.BICUBIC, fillcolor=255)


def _die_with_parent() -> None:  # pragma: no cover - runs in the forked tesseract process
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _tesseract_env() -> dict[str, str]:
    """Where Tesseract and its language data are, one thread: nothing else of the caller's
    environment (a console or worker holds Sluice's secrets there)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "OMP_THREAD_LIMIT": "1"}
    if "TESSDATA_PREFIX" in os.environ:
        env["TESSDATA_PREFIX"] = os.environ["TESSDATA_PREFIX"]
    return env


def recognise(png: bytes, *, dpi: int, language: str = "eng") -> str:
    """The text Tesseract reads in a page image: words of enough confidence, in lines and
    paragraphs as it found them; "" when it finds none."""
    env = _tesseract_env()
    try:
        done = subprocess.run(
            ["tesseract", "stdin", "stdout", "-l", language, "--dpi", str(dpi), "tsv"],
            input=png,
            capture_output=True,
            timeout=PAGE_SECONDS,
            env=env,
            preexec_fn=_die_with_parent,
            check=False,
        )
    except FileNotFoundError as exc:
        raise OcrUnavailable(NOT_INSTALLED) from exc
    if done.returncode != 0:
        why = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise OcrUnavailable(why[-1] if why else f"tesseract exited with code {done.returncode}")
    return words_to_text(done.stdout.decode("utf-8", "replace"))


def words_to_text(tsv: str) -> str:
    """Tesseract's TSV (level 5 rows are words) as text: confident words joined by spaces within a
    line, lines by newlines, paragraphs and blocks by blank lines."""
    lines: dict[tuple[int, int, int], list[str]] = {}
    for row in csv.DictReader(io.StringIO(tsv), delimiter="\t", quoting=csv.QUOTE_NONE):
        word = (row.get("text") or "").strip()
        if row.get("level") != "5" or not word:
            continue
        try:
            confidence = float(row["conf"])
        except (TypeError, ValueError):
            continue
        if confidence < MIN_CONFIDENCE:
            continue
        key = (int(row["block_num"]), int(row["par_num"]), int(row["line_num"]))
        lines.setdefault(key, []).append(word)
    out: list[str] = []
    last: tuple[int, int] | None = None
    for (block, par, _), words in lines.items():
        if last is not None and (block, par) != last:
            out.append("")
        out.append(" ".join(words))
        last = (block, par)
    return "\n".join(out)
