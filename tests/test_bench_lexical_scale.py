"""`python -m bench.lexical_scale` still runs end to end on its smallest input: both vocabularies
grown to two sizes, each query kind measured as shipped and with every token loose, and after an
FTS5 optimize at the last size. It writes into a temporary file, never into BENCHMARKS.md; no
timing is asserted (``make bench-scale`` reports the figures)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parent.parent


def test_bench_lexical_scale_on_its_smallest_input_fills_every_row(tmp_path):
    out = tmp_path / "BENCH.md"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    argv = ["--sizes", "300,600", "--queries", "6", "--out", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "bench.lexical_scale", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line for line in out.read_text().splitlines() if re.match(r"\| (bench|natural)", line)]
    labels = [(r.split(" | ")[0][2:], r.split(" | ")[1]) for r in rows]
    expected = []
    for vocabulary in ("bench", "natural"):
        for size in ("300", "600"):
            expected += [(f"{vocabulary}, every token loose", size), (vocabulary, size)]
        expected.append((f"{vocabulary}, after FTS5 optimize", "600"))
    assert labels == expected
    for row in rows:  # every kind of query measured: p50 / p95, both numbers
        cells = row.strip("| ").split(" | ")[2:]
        assert len(cells) == 4 and all(re.fullmatch(r"\d+\.\d / \d+\.\d", c) for c in cells), row
