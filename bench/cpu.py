"""Where the CPU goes: per chunk and per document, the model's encoding against everything else.

    python -m bench.cpu [--small N] [--out BENCHMARKS.md]

On a host where the worker, its parsing children, Chroma and Redis share the cores, every CPU second
that is not encoding is a second the model's lanes do not get. So the share of all CPU that went to
encoding is the ceiling of "Sluice / raw limit" on such a host, however well the pipeline overlaps
its stages. This measures that share directly, in CPU seconds (not wall time: the figure holds on a
busy machine too): the runner runs the jobs of the bench corpus, then of a stream of small
documents, in this process with the real model, and each part is read from where it is spent:

- encoding: the CPU time of the embedder's lanes (``SentenceEmbedder.cpu_seconds``);
- the rest of the worker: this process's CPU time less the lanes' (claims, progress and success
  writes, chunking, the cache and Chroma clients, the lexical index);
- parsing: the extraction fork server and the children it forked, one per document;
- Chroma and the cache Redis: their server processes.

With --out, the table replaces the "Where the CPU goes" section of that file.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from pathlib import Path

from bench import corpus as corpus_mod
from bench.report import load_average, write_section
from bench.system import Services, clean_environment, cpu_seconds

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = Path(
    os.environ.get("SLUICE_SAMPLES_DIR", ROOT.parent / "shared" / "corpus" / "pdf-samples")
)
TITLE = "## Where the CPU goes"


def fork_servers() -> list[int]:
    """This process's children that are multiprocessing fork servers (the extraction children's
    parent)."""
    me, found = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                parent = int(fh.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmdline = fh.read()
        except OSError:
            continue
        if parent == me and b"forkserver" in cmdline:
            found.append(int(entry))
    return found


def account(svc: Services, paths: list[Path], *, name: str) -> dict:
    """Run every document's job in this process; return CPU seconds by part, chunks and
    documents."""
    svc.configure(
        name,
        SLUICE_EMBED_BATCH_SIZE="32",
        SLUICE_EMBED_PRECISION="auto",
        SLUICE_RECOVERY_INTERVAL_SECONDS="3600",
    )
    ctx = svc.context()
    from sluice.ops.ingest import ingest_path
    from sluice.pipeline.running.runner import run_job

    embedder = ctx.embedder
    warm = corpus_mod.generate_big(svc.workdir / f"{name}-warm.pdf", pages=2, seed=99)
    run_job(ingest_path(ctx, warm, dataset="warm").job_id, ctx=ctx)  # model loaded, fork server up
    ids = [ingest_path(ctx, p, dataset="bench").job_id for p in paths]
    servers = fork_servers()

    def snapshot() -> dict[str, float]:
        return {
            "process": time.process_time(),
            "encode": embedder.cpu_seconds,
            "parsing": sum(cpu_seconds(pid, children=True) for pid in servers),
            "chroma": cpu_seconds(svc.chroma.pid, children=True),
            "cache": cpu_seconds(svc.cache.pid, children=True),
        }

    before, chunks = snapshot(), 0
    for job_id in ids:
        outcome = run_job(job_id, ctx=ctx)
        if outcome.result != "succeeded":
            raise RuntimeError(f"job {job_id} ended {outcome.result}: {outcome.message}")
        chunks += int(outcome.message.split()[0])
    after = snapshot()
    spent = {k: after[k] - before[k] for k in before}
    spent["worker"] = spent.pop("process") - spent["encode"]
    return {"documents": len(ids), "chunks": chunks, "precision": ctx.precision, "cpu": spent}


def table(runs: dict[str, dict], load: tuple[str, str]) -> str:
    parts = (
        ("encode", "encoding (the model's lanes)"),
        ("worker", "the rest of the worker"),
        ("parsing", "parsing (fork server and one child per document)"),
        ("chroma", "Chroma server"),
        ("cache", "cache Redis"),
    )
    names = list(runs)
    lines = [
        TITLE,
        "",
        "Produced by `bench/cpu.py` (part of `make bench`). CPU milliseconds, not wall time, so "
        "the figures hold on a busy machine; the jobs run one after another in one process with "
        'the real model. The encoding share is the ceiling of "Sluice / raw limit" on a host '
        "where all of it shares the cores.",
        "",
        "| CPU ms | " + " | ".join(f"{n}: per chunk | per document" for n in names) + " |",
        "| --- |" + " --- | --- |" * len(names),
    ]
    for key, label in parts:
        cells = []
        for n in names:
            r = runs[n]
            cells += [
                f"{1000 * r['cpu'][key] / r['chunks']:.2f}",
                f"{1000 * r['cpu'][key] / r['documents']:.1f}",
            ]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    total = {n: sum(r["cpu"].values()) for n, r in runs.items()}
    lines.append(
        "| **all** | "
        + " | ".join(
            f"**{1000 * total[n] / r['chunks']:.2f}** | **{1000 * total[n] / r['documents']:.1f}**"
            for n, r in runs.items()
        )
        + " |"
    )
    lines.append(
        "| **encoding share of all CPU** | "
        + " | ".join(f"**{r['cpu']['encode'] / total[n]:.2f}** | " for n, r in runs.items())
        + " |"
    )
    lines += [
        "",
        "Workloads: "
        + "; ".join(
            f"{n}: {r['documents']} documents, {r['chunks']:,} chunks, precision {r['precision']}"
            for n, r in runs.items()
        )
        + ".",
        "",
        f"Load average (1/5/15 min) at start {load[0]}, at end {load[1]}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--small", type=int, default=100, help="small documents in the second workload"
    )
    parser.add_argument(
        "--documents", type=int, default=16, help="generated 8-page reports in the first"
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    clean_environment()
    load_start = load_average()
    with Services() as svc:
        work = svc.workdir
        reports, _ = corpus_mod.generate(work / "corpus", documents=args.documents, pages=8)
        runs = {
            "bench corpus": account(
                svc, reports + corpus_mod.sample_pdfs(SAMPLES), name=f"cpu-{uuid.uuid4().hex[:6]}"
            ),
            "small documents": account(
                svc,
                corpus_mod.generate_small(work / "small", documents=args.small),
                name=f"cpu-{uuid.uuid4().hex[:6]}",
            ),
        }
    section = table(runs, (load_start, load_average()))
    print(section)
    if args.out:
        write_section(args.out, TITLE, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
