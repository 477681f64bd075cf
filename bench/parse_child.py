"""What extracting in a child process costs, on the shared sample PDFs.

    python -m bench.parse_child [--rounds 3] [--samples DIR]

Three ways to read every page of every sample, each the median of the rounds:
  plain     PyMuPDF ``get_text()`` in this process (what Sluice did before reading order and the
            child)
  inproc    Sluice's extraction (reading order, page checks) in this process
  child     the same extraction through ``open_document``: a child process per file
The difference child - inproc is the price of the process boundary; inproc - plain is the price of
reading order.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from sluice.pipeline.parsing.extract import PDF, Refusal, Request, read
from sluice.pipeline.parsing.parse import open_document

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT.parent / "shared" / "corpus" / "pdf-samples"


def plain(path: Path) -> int:
    import pymupdf

    pymupdf.TOOLS.mupdf_display_errors(False)
    try:
        with pymupdf.open(path) as doc:
            return sum(1 for page in doc if page.get_text() is not None)
    except Exception:
        return 0


def inproc(path: Path) -> int:
    try:
        return sum(1 for m in read(Request(path=str(path), media_type=PDF)) if m["t"] == "page")
    except Refusal:
        return 0


def child(path: Path) -> int:
    try:
        parsed = open_document(path, media_type=PDF, max_pages=5000)
        return sum(1 for _ in parsed.pages())
    except Exception:
        return 0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--samples", type=Path, default=SAMPLES)
    args = ap.parse_args()
    files = sorted(args.samples.glob("*.pdf"))
    if not files:
        sys.exit(f"no PDFs in {args.samples}")
    plain(files[0])  # import PyMuPDF once, outside the timing
    times: dict[str, list[float]] = {"plain": [], "inproc": [], "child": []}
    pages = {}
    for _ in range(args.rounds):
        for name, fn in (("plain", plain), ("inproc", inproc), ("child", child)):
            t0 = time.perf_counter()
            pages[name] = sum(fn(f) for f in files)
            times[name].append(time.perf_counter() - t0)
    print(f"{len(files)} files, {args.rounds} rounds (median seconds; pages read)")
    for name, values in times.items():
        med = statistics.median(values)
        print(
            f"  {name:7s} {med:7.2f} s  {med / len(files) * 1000:7.1f} ms/file  pages {pages[name]}"
        )
    per_file = (
        (statistics.median(times["child"]) - statistics.median(times["inproc"])) / len(files) * 1000
    )
    print(f"  child process overhead: {per_file:.0f} ms per file")


if __name__ == "__main__":
    main()
