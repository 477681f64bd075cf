"""`python -m bench.run` still runs end to end and fills every figure of the table with numbers:
on its smallest input (``--smoke``: two generated 2-page reports, no shared samples, a few jobs of
each kind), which goes through every step that ``make bench`` and ``make bench-quick`` take.

It writes into a temporary file, never into BENCHMARKS.md. No timing is asserted: the machine is
shared; the bench's own figures are what it reports.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

# The smallest input shortens the measured work; what is left is every process the bench starts
# (each loads the model), a few minutes on an idle machine; a loaded one (CI) may take a few times
# that.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parent.parent

FIGURES = [
    "raw fp32, the model's own encode per batch",
    "raw fp32, Sluice's embedder alone",
    "raw limit fp32 (the fastest way)",
    "Sluice pipeline, auto",
    "Sluice fp32 / raw limit fp32",
    "small documents: raw limit",
    "small documents: Sluice auto (",
    "small documents: Sluice auto / raw limit",
    "`sluice serve worker` to the first chunk embedded",
    "`sluice serve console` to its health endpoint answering",
    "plain script fp32",
    "recall@1 / recall@10, Sluice auto",
    "recall@1 / recall@10, Sluice fp32",
    "Huey no-op tasks/s",
    "Sluice jobs/s, 2 worker threads",
    "Sluice jobs/s, 4 worker threads",
    "re-upload of an indexed file, answer time",
    "re-uploads: new jobs / chunks embedded / messages queued",
    "chunks re-embedded after a crash at 90%",
    "jobs page 1",
    "jobs page, filtered",
    "(deep)",
    "overview",
    "10-page PDF",
    "pages / 10 pages",
]
PEER = [
    "LlamaIndex fp32",
    "LlamaIndex default setup",
    "Sluice fp32 / LlamaIndex fp32",
    "Sluice auto / LlamaIndex default",
    "recall@1 / recall@10, LlamaIndex fp32",
]
NO_PEER = ["Sluice fp32 / plain script fp32"]
# Where the CPU has native bf16 (auto resolves to bf16); elsewhere the table says bf16 was not
# measured.
BF16 = [
    "raw bf16, Sluice's embedder alone",
    "raw limit bf16 (the fastest way)",
    "bf16 / fp32 raw limit",
    "Sluice auto / raw limit fp32",
    "Sluice pipeline, fp32",
]


def rows(markdown: str) -> dict[str, str]:
    """figure -> value cell, from the table's rows."""
    out = {}
    for line in markdown.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and not cells[0].startswith(("**", "---", "figure")):
            out[cells[0]] = cells[1]
    return out


def test_bench_on_its_smallest_input_produces_every_figure(tmp_path):
    out = tmp_path / "BENCH.md"
    committed = ROOT / "BENCHMARKS.md"
    before = committed.read_bytes() if committed.exists() else None
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("SLUICE_") or k == "SLUICE_TEST_DATABASE_URL"
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.run",
            "--smoke",
            "--out",
            str(out),
            "--json",
            str(tmp_path / "raw.json"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (
        committed.read_bytes() if committed.exists() else None
    ) == before  # the committed table is untouched

    text = out.read_text()
    assert "CPUs" in text and "Load average" in text and "Versions:" in text
    table = rows(text)
    expected = FIGURES + (
        NO_PEER if "LlamaIndex not run" in text or "Peer: not run" in text else PEER
    )
    if table.get("raw bf16") == "not measured":
        assert "no native bf16" in text
    else:
        expected += BF16
    if Path("/usr/bin/chromium").exists():
        expected.append("`sluice serve console` to the first page drawn")
    for figure in expected:
        found = [value for name, value in table.items() if figure in name]
        assert found, f"no row for {figure!r} in:\n{text}"
        assert all(re.search(r"\d", v) and "n/a" not in v for v in found), (
            f"{figure!r} has no number: {found}"
        )
    if os.environ.get("SLUICE_TEST_DATABASE_URL"):
        assert "PostgreSQL" in text
