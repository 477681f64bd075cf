"""Plots of cost against index size, drawn from the figures ``bench.scale --json`` wrote: ingest
rate, search p95 and ANN recall against chunks in the dataset, as PNGs shown in BENCHMARKS.md.

    python -m bench.plots [benchmarks/scale.json] [--out benchmarks]

`make bench-scale` writes the figures and draws; `make bench` redraws from the committed figures,
so the pictures never disagree with the table they sit under.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.retrieval import MODES
from bench.scale import HYBRID_P95_MS, RATIO_TARGETS, RECALL_TARGET

FIGURES = Path("benchmarks/scale.json")
OUT = Path("benchmarks")


def _pyplot():
    """matplotlib without a display (the bench runs on servers)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _thousands(axis) -> None:
    from matplotlib.ticker import FuncFormatter

    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 1000:,.0f}k" if v else "0"))


def series(points: list[dict]) -> dict[str, tuple[list[float], list[float]]]:
    """Every line the plots draw, by name: (chunks in the dataset, value) pairs, in size order."""
    points = sorted(points, key=lambda p: p["indexed"])
    x = [float(p["indexed"]) for p in points]
    base = points[0]
    out: dict[str, tuple[list[float], list[float]]] = {}
    for kind in ("small", "big"):
        rates = [p[kind]["chunks_per_s"] for p in points]
        out[f"{kind} chunks/s"] = (x, rates)
        out[f"{kind} / empty"] = (x, [r / base[kind]["chunks_per_s"] for r in rates])
    for mode in MODES:
        for label in (mode, f"{mode}|filtered"):
            out[f"{label} p95"] = (x, [p["latency"][label]["p95"] for p in points])
    kept = [(xi, p["recall"]["recall"]) for xi, p in zip(x, points, strict=True)]
    kept = [(xi, r) for xi, r in kept if r is not None]
    out["recall@10"] = ([xi for xi, _ in kept], [r for _, r in kept])
    return out


def draw(points: list[dict], out: Path, machine: str = "") -> list[Path]:
    """Three PNGs into ``out``: ingest.png, search_p95.png, recall.png; their paths."""
    plt = _pyplot()
    lines = series(points)
    out.mkdir(parents=True, exist_ok=True)
    note = f"\n{machine}" if machine else ""
    made = []

    fig, (rate, ratio) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    for kind, marker in (("small", "o"), ("big", "s")):
        rate.plot(*lines[f"{kind} chunks/s"], marker=marker, label=f"{kind} documents")
        ratio.plot(*lines[f"{kind} / empty"], marker=marker, label=f"{kind} documents")
    for size, target in RATIO_TARGETS.items():
        ratio.plot([size], [target], "k_", markersize=18, mew=2)
        ratio.annotate(
            f"target {target}", (size, target), textcoords="offset points", xytext=(4, 6)
        )
    rate.set(title="Ingest rate", xlabel="chunks in the dataset", ylabel="chunks per second")
    ratio.set(title="Ingest rate / into the empty dataset", xlabel="chunks in the dataset")
    for ax in (rate, ratio):
        _thousands(ax.xaxis)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"Ingest against index size (hash embedder){note}", fontsize=10)
    made.append(_save(plt, fig, out / "ingest.png"))

    fig, ax = plt.subplots(figsize=(7, 4.5), constrained_layout=True)
    for mode in MODES:
        line = ax.plot(*lines[f"{mode} p95"], marker="o", label=mode)[0]
        ax.plot(
            *lines[f"{mode}|filtered p95"],
            marker="x",
            linestyle="--",
            color=line.get_color(),
            label=f"{mode}, filtered",
        )
    ax.axhline(HYBRID_P95_MS, color="k", linewidth=0.8, linestyle=":")
    ax.annotate(
        f"hybrid target {HYBRID_P95_MS:.0f} ms",
        (0, HYBRID_P95_MS),
        xytext=(2, 3),
        textcoords="offset points",
    )
    ax.set(title=f"Search p95, k=10{note}", xlabel="chunks in the dataset", ylabel="ms")
    ax.set_yscale("log")
    _thousands(ax.xaxis)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    made.append(_save(plt, fig, out / "search_p95.png"))

    fig, ax = plt.subplots(figsize=(7, 4), constrained_layout=True)
    ax.plot(*lines["recall@10"], marker="o", label="ANN against exact search")
    ax.axhline(RECALL_TARGET, color="k", linewidth=0.8, linestyle=":")
    ax.annotate(
        f"target {RECALL_TARGET}", (0, RECALL_TARGET), xytext=(2, 3), textcoords="offset points"
    )
    ax.set(
        title=f"Recall@10 of the vector index{note}",
        xlabel="chunks in the dataset",
        ylabel="recall@10",
        ylim=(min([0.8, *lines["recall@10"][1]]) - 0.02, 1.005),
    )
    _thousands(ax.xaxis)
    ax.grid(alpha=0.3)
    ax.legend()
    made.append(_save(plt, fig, out / "recall.png"))
    return made


def _save(plt, fig, path: Path) -> Path:
    # No date in the file, so that a redraw of the same figures is the same bytes for git.
    fig.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.plots")
    parser.add_argument("figures", type=Path, nargs="?", default=FIGURES)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if not args.figures.exists():
        print(f"{args.figures}: no figures (make bench-scale writes them); nothing drawn")
        return 0
    raw = json.loads(args.figures.read_text())
    for path in draw(raw["points"], args.out, raw.get("machine", "")):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
