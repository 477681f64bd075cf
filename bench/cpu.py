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
import json
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
BEFORE = Path(__file__).with_name("per_document_before.json")  # the code before issue 31's cuts


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


def account(
    svc: Services,
    paths: list[Path],
    *,
    name: str,
    embedder: str = "sentence-transformers",
    steps: bool = False,
) -> dict:
    """Run every document's job in this process; return CPU seconds by part, chunks and
    documents, and what each step cost (``bench.tally``: SQL statements, Chroma and cache calls)
    with the job events written."""
    svc.configure(
        name,
        SLUICE_EMBED_BATCH_SIZE="32",
        SLUICE_EMBED_PRECISION="auto",
        SLUICE_EMBEDDER=embedder,
        SLUICE_RECOVERY_INTERVAL_SECONDS="3600",
    )
    ctx = svc.context()
    from sqlmodel import Session, col, func, select

    from bench.tally import counting
    from sluice.ops.ingest import ingest_path
    from sluice.pipeline.running.runner import run_job
    from sluice.storage.models import JobEvent

    embedder_obj = ctx.embedder
    warm = corpus_mod.generate_big(svc.workdir / f"{name}-warm.pdf", pages=2, seed=99)
    run_job(ingest_path(ctx, warm, dataset="warm").job_id, ctx=ctx)  # model loaded, fork server up
    ids = [ingest_path(ctx, p, dataset="bench").job_id for p in paths]
    servers = fork_servers()

    def snapshot() -> dict[str, float]:
        return {
            "process": time.process_time(),
            "encode": getattr(embedder_obj, "cpu_seconds", 0.0),
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
    if not steps:
        return {"documents": len(ids), "chunks": chunks, "precision": ctx.precision, "cpu": spent}
    # The same documents again, counted step by step (the counting costs CPU of its own, so it is
    # not in the figures above): a dataset of their own, the embedding cache empty again.
    svc.cache.client().flushdb()
    again = [ingest_path(ctx, p, dataset="steps").job_id for p in paths]
    with counting(ctx) as (sql, calls):
        for job_id in again:
            if run_job(job_id, ctx=ctx).result != "succeeded":
                raise RuntimeError(f"job {job_id} did not succeed")
    with Session(ctx.engine) as session:
        events = dict(
            session.exec(
                select(JobEvent.kind, func.count())
                .where(col(JobEvent.job_id).in_(again), JobEvent.kind != "created")
                .group_by(JobEvent.kind)
            ).all()
        )
    return {
        "documents": len(ids),
        "chunks": chunks,
        "precision": ctx.precision,
        "cpu": spent,
        "sql": sql.rows(),
        "calls": calls.rows(),
        "events": events,
    }


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


STEP_TITLE = "### One small document, step by step"


def _per_document(run: dict) -> dict[str, tuple[float, float, str]]:
    """Row label -> (count per document, ms per document, kinds) of one workload's tallies."""
    docs = run["documents"]
    out: dict[str, tuple[float, float, str]] = {}
    groups: dict[str, list[dict]] = {}
    for row in run["sql"]:
        groups.setdefault(f"SQL: {row['step']}", []).append(row)
    for row in run["calls"]:
        groups.setdefault(row["kind"], []).append(row)
    for label, rows in groups.items():
        statements = [r for r in rows if r["kind"] != "COMMIT"]
        kinds = ", ".join(
            f"{r['kind']}" + (f" x{r['count'] / docs:.3g}" if r["count"] != docs else "")
            for r in rows
            if label.startswith("SQL")
        )
        out[label] = (
            sum(r["count"] for r in statements) / docs,
            sum(r["ms"] for r in statements) / docs,
            kinds,
        )
    return out


def steps_table(after: dict[str, dict], before: dict | None) -> str:
    """Per document of each workload: statements and Chroma / cache calls by step, the job events,
    and CPU ms by part; with ``before`` (the same measurement of the code before), side by side."""
    lines = [
        STEP_TITLE,
        "",
        "Every SQL statement of the jobs counted and timed through SQLAlchemy's "
        "`before_cursor_execute` / `after_cursor_execute` events (`bench/tally.py`), each under "
        "the step that made it (the outermost `sluice.storage` function on the stack); every call "
        "to Chroma and the embedding cache the same way. Statements and calls per document; ms "
        "are wall milliseconds inside those calls in the worker (SQLite runs in the process, so "
        "nearly all of it is the worker's CPU); a row's kinds list what its statements are "
        "(xN: N per document; COMMIT counts the transactions; beside a before column, the kinds "
        "are the after run's).",
        "",
    ]
    for name, run in after.items():
        old = (before or {}).get(name)
        now = _per_document(run)
        was = _per_document(old) if old else {}
        head = "| " + name + " | statements or calls | ms |"
        rule = "| --- | --- | --- |"
        if old:
            head = f"| {name} | before: statements or calls | before: ms | after | after: ms |"
            rule = "| --- | --- | --- | --- | --- |"
        lines += [head, rule]
        for label in sorted(set(now) | set(was), key=lambda k: (not k.startswith("SQL"), k)):
            n, ms, kinds = now.get(label, (0.0, 0.0, ""))
            cells = [f"{n:.2f}", f"{ms:.2f}"]
            if old:
                n0, ms0, kinds0 = was.get(label, (0.0, 0.0, ""))
                cells = [f"{n0:.2f}", f"{ms0:.2f}", *cells]
                kinds = kinds or kinds0
            text = f"{label}" + (f" ({kinds})" if kinds else "")
            lines.append(f"| {text} | " + " | ".join(cells) + " |")

        def total(r: dict, prefix: str) -> tuple[float, float]:
            rows = [v for k, v in _per_document(r).items() if k.startswith(prefix)]
            return sum(v[0] for v in rows), sum(v[1] for v in rows)

        for prefix, label in (("SQL", "all SQL statements"), ("Chroma", "all Chroma calls")):
            cells = [f"{x:.2f}" for x in total(run, prefix)]
            if old:
                cells = [f"{x:.2f}" for x in total(old, prefix)] + cells
            lines.append(f"| **{label}** | " + " | ".join(f"**{c}**" for c in cells) + " |")
        commits = [
            sum(r["count"] for r in x["sql"] if r["kind"] == "COMMIT") / x["documents"]
            for x in ([old] if old else []) + [run]
        ]
        events = [
            sum(x["events"].values()) / x["documents"] for x in ([old] if old else []) + [run]
        ]
        cpu = [
            {k: 1000 * v / x["documents"] for k, v in x["cpu"].items()}
            for x in ([old] if old else []) + [run]
        ]

        def row(label: str, values: list[str], old: dict | None = old) -> str:
            if old:
                return f"| {label} | {values[0]} |  | {values[1]} |  |"
            return f"| {label} | {values[0]} |  |"

        lines.append(row("transactions (COMMIT)", [f"{c:.2f}" for c in commits]))
        kinds_of = sorted(set().union(*[x["events"] for x in ([old] if old else []) + [run]]))
        lines.append(
            row(
                "job events (" + ", ".join(kinds_of) + ")",
                [f"{e:.2f}" for e in events],
            )
        )
        for key, label in (
            ("worker", "CPU ms: the worker (less encoding)"),
            ("parsing", "CPU ms: parsing (fork server and its children)"),
            ("chroma", "CPU ms: Chroma server"),
            ("cache", "CPU ms: cache Redis"),
            ("encode", "CPU ms: encoding"),
        ):
            lines.append(row(label, [f"{c[key]:.1f}" for c in cpu]))
        lines.append(row("**CPU ms: all**", [f"**{sum(c.values()):.1f}**" for c in cpu]))
        lines.append("")
        if old:
            lines.append(f"Before: {old.get('note', '')}")
            lines.append("")
    return "\n".join(lines)


def tiny_texts(out_dir: Path, documents: int) -> list[Path]:
    """``documents`` tiny .txt notes of one chunk each (the orchestration bench's tiny jobs)."""
    from bench.orchestration import WORDS

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(documents):
        path = out_dir / f"note-{i}.txt"
        words = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(12))
        path.write_text(f"note {i} {uuid.uuid4().hex}: {words}")
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--small", type=int, default=100, help="small documents in the second workload"
    )
    parser.add_argument(
        "--documents", type=int, default=16, help="generated 8-page reports in the first"
    )
    parser.add_argument("--tiny", type=int, default=100, help="tiny .txt jobs in the third")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--json", type=Path, help="write the raw measurements here")
    parser.add_argument(
        "--before",
        type=Path,
        default=BEFORE,
        help="the same measurement of the code before (JSON of --json), shown beside",
    )
    parser.add_argument("--only-steps", action="store_true", help="small and tiny jobs only")
    args = parser.parse_args(argv)
    clean_environment()
    load_start = load_average()
    with Services() as svc:
        work = svc.workdir
        runs = {}
        if not args.only_steps:
            reports, _ = corpus_mod.generate(work / "corpus", documents=args.documents, pages=8)
            runs["bench corpus"] = account(
                svc, reports + corpus_mod.sample_pdfs(SAMPLES), name=f"cpu-{uuid.uuid4().hex[:6]}"
            )
        runs["small documents"] = account(
            svc,
            corpus_mod.generate_small(work / "small", documents=args.small),
            name=f"cpu-{uuid.uuid4().hex[:6]}",
            steps=True,
        )
        tiny = {
            "tiny .txt jobs (hash embedder)": account(
                svc,
                tiny_texts(work / "tiny", args.tiny),
                name=f"cpu-{uuid.uuid4().hex[:6]}",
                embedder="hash",
                steps=True,
            )
        }
    load = (load_start, load_average())
    for run in (*runs.values(), *tiny.values()):
        run["load"] = list(load)
    before = json.loads(args.before.read_text()) if args.before and args.before.exists() else None
    steps = {k: v for k, v in runs.items() if k != "bench corpus"} | tiny
    section = table(runs, load) + "\n" + steps_table(steps, before) + "\n"
    print(section)
    if args.json:
        args.json.write_text(json.dumps({**runs, **tiny}, indent=1))
    if args.out and not args.only_steps:
        write_section(args.out, TITLE, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
