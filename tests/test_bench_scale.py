"""`python -m bench.scale` still runs end to end on its smallest input: an empty dataset and one of
100 bulk-loaded chunks, two small documents and one big one through a real worker at each, every
search mode with and without the filter, and the recall audit's measure.

It writes into a temporary file, never into BENCHMARKS.md. No timing is asserted: the machine is
shared; the bench's own figures are what it reports (``make bench-scale``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parent.parent
LABELS = [f"{mode}{f}" for mode in ("dense", "lexical", "hybrid") for f in ("", "|filtered")]


def test_bench_scale_on_its_smallest_input_fills_every_figure(tmp_path):
    out, raw = tmp_path / "BENCH.md", tmp_path / "raw.json"
    committed = ROOT / "BENCHMARKS.md"
    before = committed.read_bytes() if committed.exists() else None
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    argv = "--sizes 0,100 --docs 2 --big 1 --big-chunks 4 --queries 3 --recall-queries 3"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.scale",
            *argv.split(),
            *("--out", str(out), "--json", str(raw), "--plots", str(tmp_path / "plots")),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (committed.read_bytes() if committed.exists() else None) == before

    points = json.loads(raw.read_text())["points"]
    assert [p["size"] for p in points] == [0, 100]
    assert points[1]["indexed"] >= 100 + points[0]["indexed"]
    for p in points:
        assert p["small"]["documents"] == 2 and 2 <= p["small"]["chunks"] <= 6
        assert p["big"]["chunks"] == 4
        assert p["small"]["chunks_per_s"] > 0 and p["big"]["chunks_per_s"] > 0
        assert p["small"]["stages"], "no stage times from the job events"
        for kind in ("small", "big"):  # what the Chroma server spent on them, and retries
            assert p[kind]["server_cpu_ms_per_chunk"] >= 0 and p[kind]["retried"] >= 0
        assert set(p["latency"]) == set(LABELS)
        assert all(v["p95"] >= v["p50"] > 0 for v in p["latency"].values())
        assert p["recall"]["recall"] is not None and p["recall"]["queries"] == 3
        deeper = p["recall"]["deeper"]  # what a deeper walk would return, and cost
        assert set(deeper) == {"800", "1600"} and all(
            d["recall"] is not None for d in deeper.values()
        )
        assert all(d["query_ms"]["p95"] > 0 for d in deeper.values())
    text = out.read_text().strip()
    assert text.startswith("## Cost against index size") and "vCPUs, flags" in text
    assert "| 1.00 |" in text  # the empty dataset's own ratio
    assert "Chroma server CPU per chunk, ms: small, big" in text
    assert "Not run in this run: the 100,000 and 300,000 and 1,000,000 chunk points" in text
    for name in ("ingest", "search_p95", "recall"):  # drawn, and shown under the tables
        assert (tmp_path / "plots" / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
        assert f"{(tmp_path / 'plots').as_posix()}/{name}.png)" in text
