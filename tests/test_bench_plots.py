"""`bench.plots` draws what `bench.scale` measured: each line holds the figures of the points it was
given (the ratios computed against the empty dataset), and the three PNGs are real images."""

from __future__ import annotations

import json
import struct

import pytest

from bench import plots

PNG = b"\x89PNG\r\n\x1a\n"


def _point(indexed: int, small: float, big: float, p95: float, recall: float | None) -> dict:
    latency = {
        label: {"p50": p95 / 2, "p95": p95 * (2 if "filtered" in label else 1)}
        for mode in ("dense", "lexical", "hybrid")
        for label in (mode, f"{mode}|filtered")
    }
    return {
        "indexed": indexed,
        "small": {"chunks_per_s": small},
        "big": {"chunks_per_s": big},
        "latency": latency,
        "recall": {"recall": recall},
    }


POINTS = [
    _point(100_683, 57.0, 150.0, 40.0, 0.92),
    _point(1, 60.0, 300.0, 20.0, 1.0),  # out of order on purpose: plots go by size
    _point(300_000, 45.0, 120.0, 80.0, None),  # a recall not measured is left out, not zero
]


def test_the_lines_hold_the_measured_figures_in_size_order():
    lines = plots.series(POINTS)
    x, ratio = lines["big / empty"]
    assert x == [1.0, 100_683.0, 300_000.0]
    assert ratio == pytest.approx([1.0, 0.5, 0.4])
    assert lines["small chunks/s"][1] == [60.0, 57.0, 45.0]
    assert lines["hybrid|filtered p95"][1] == [40.0, 80.0, 160.0]
    assert lines["recall@10"] == ([1.0, 100_683.0], [1.0, 0.92])


def test_main_draws_three_pngs_from_the_figures_file(tmp_path):
    figures = tmp_path / "scale.json"
    figures.write_text(json.dumps({"machine": "test CPU, 2 vCPUs", "points": POINTS}))
    assert plots.main([str(figures), "--out", str(tmp_path / "out")]) == 0
    for name in ("ingest.png", "search_p95.png", "recall.png"):
        data = (tmp_path / "out" / name).read_bytes()
        assert data[:8] == PNG
        width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk
        assert width >= 500 and height >= 300
    again = tmp_path / "again"
    plots.main([str(figures), "--out", str(again)])
    # The same figures draw the same bytes: a redraw in `make bench` leaves git quiet.
    assert (again / "ingest.png").read_bytes() == (tmp_path / "out" / "ingest.png").read_bytes()
