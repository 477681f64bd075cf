"""OCR of one page image with Debian's Tesseract (``make ocr`` installs it; never a download).

Runs inside the extraction child (sluice.pipeline.extract): PyMuPDF renders the page in grey,
the ``tesseract`` command reads the PNG on stdin and writes its words as TSV with a confidence
each. Words under ``MIN_CONFIDENCE`` are dropped: on a photograph or a cartoon Tesseract finds
nothing, or a few low-confidence "words" made of edges, and those must not be indexed as text.
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import subprocess

MODES = ("auto", "always", "off")
MIN_CONFIDENCE = 50.0  # of 100; real words on a clean 150 dpi scan score 85-96
MAX_PIXELS = 40_000_000  # a page image larger than this is rendered at a lower resolution
PAGE_SECONDS = 120  # one page; the parse deadline bounds the whole file


NOT_INSTALLED = "Tesseract is not installed (`make ocr`, or apt-get install tesseract-ocr tesseract-ocr-eng)"


class OcrUnavailable(Exception):
    """Tesseract, or the language asked for, is not installed."""


def available(language: str = "eng") -> str | None:
    """None when Tesseract and ``language`` are installed; else what is missing, said plainly."""
    if shutil.which("tesseract") is None:
        return NOT_INSTALLED
    try:
        out = subprocess.run(["tesseract", "--list-langs"], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"Tesseract does not start ({exc})"
    installed = set(out.stdout.decode("utf-8", "replace").split()[1:] if out.stdout else [])
    wanted = [part for part in language.split("+") if part]
    missing = [part for part in wanted if part not in installed]
    if missing:
        return (f"the Tesseract language data {', '.join(missing)} is not installed "
                f"(apt-get install {' '.join('tesseract-ocr-' + m for m in missing)})")
    return None


def render(page, dpi: int) -> tuple[bytes, int]:
    """The page as a grey PNG and the resolution used (lowered for a page too large to render)."""
    import pymupdf

    rect = page.rect
    pixels = (rect.width / 72 * dpi) * (rect.height / 72 * dpi)
    if pixels > MAX_PIXELS:
        dpi = max(36, int(dpi * (MAX_PIXELS / pixels) ** 0.5))
    pix = page.get_pixmap(dpi=dpi, colorspace=pymupdf.csGRAY, alpha=False)
    return pix.tobytes("png"), dpi


def _die_with_parent() -> None:  # pragma: no cover - runs in the forked tesseract process
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def recognise(png: bytes, *, dpi: int, language: str = "eng") -> str:
    """The text Tesseract reads in a page image: words of enough confidence, in lines and
    paragraphs as it found them; "" when it finds none."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "OMP_THREAD_LIMIT": "1"}
    if "TESSDATA_PREFIX" in os.environ:
        env["TESSDATA_PREFIX"] = os.environ["TESSDATA_PREFIX"]
    try:
        done = subprocess.run(["tesseract", "stdin", "stdout", "-l", language, "--dpi", str(dpi), "tsv"],
                              input=png, capture_output=True, timeout=PAGE_SECONDS, env=env,
                              preexec_fn=_die_with_parent, check=False)
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
