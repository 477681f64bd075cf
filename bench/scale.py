"""Cost against index size: one dataset grown by bulk loading (``bench.scale_load``), and at each
size the real ingest path and search measured.

    python -m bench.scale [--sizes 0,100000,300000,1000000] [--docs 40] [--big 3]
                          [--queries 60] [--out BENCHMARKS.md]

At each size (chunks already in the dataset): ``--docs`` small documents (1 to 3 chunks) and then
``--big`` big ones (``BIG_CHUNKS`` chunks each) go through the real path (uploads, the queue, one
huey_consumer with the Procfile's 4 threads, Chroma, the job database), all published at once; the
rate is chunks from the first claim to the last finish. Then dense, lexical and hybrid search,
with and without a metadata filter (a tenth of the documents), p50 and p95 over ``--queries``
queries; then the recall audit's own measure (``sluice.pipeline.reconcile.recall``: sampled
queries answered by the index and by exact search over every stored vector, recall@10), its
exact search allowed at every size. What grows: each stage's time per job (from the job events)
and the size on disk of Chroma and the job database.

The hash embedder throughout (the model is not the subject: its cost per chunk does not depend on
the index). The ingest figures are ratios to the rate into the empty dataset of the same run, so
machines of one kind that differ in speed still compare. With ``--out`` the table replaces the
"Cost against index size" section.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path
from unittest import mock

from bench.report import cpu_model, load_average, write_section
from bench.retrieval import FILTER, MODES
from bench.scale_load import PER_DOC, Loader
from bench.system import Services, as_epoch, clean_environment, cpu_seconds, wait_final

TITLE = "## Cost against index size"
SIZES = (0, 100_000, 300_000, 1_000_000)
BIG_CHUNKS = 200  # chunks of one big document
RATIO_TARGETS = {100_000: 0.85, 1_000_000: 0.8}  # ingest rate / rate into the empty dataset
HYBRID_P95_MS = 100.0  # at 1,000,000 chunks
RECALL_TARGET = 0.99
THREADS = 4  # the Procfile's worker threads
DATASET = "scale"
MODEL_DATASET = "scale-model"
FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def cpu_flags() -> list[str]:
    """The CPU flags that decide the speed of vector work, of those this machine has."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    return [f for f in FLAGS if f in have]
    except OSError:
        pass
    return []


def machine() -> str:
    flags = ", ".join(cpu_flags()) or "none of " + ", ".join(FLAGS)
    return f"{cpu_model()}, {os.cpu_count()} vCPUs, flags {flags}"


def documents(loader: Loader, n: int, size: int, chunks: tuple[int, int]) -> list[bytes]:
    """``n`` documents of ``chunks`` (lo, hi) chunks each, unique to this size."""
    out = []
    for i in range(n):
        count = chunks[0] + i % (chunks[1] - chunks[0] + 1)
        parts = [loader.text() for _ in range(count)]
        out.append((f"at {size} doc {i} {uuid.uuid4().hex}\n\n" + "\n\n".join(parts)).encode())
    return out


def ingest(
    ctx,
    loader: Loader,
    size: int,
    kind: str,
    bodies: list[bytes],
    *,
    server: int | None = None,
    dataset: str = DATASET,
) -> dict:
    """Upload and publish them all at once; chunks per second from first claim to last finish.
    With ``server`` (the Chroma server's pid), also the CPU time that server spent meanwhile per
    chunk (its graph work grows with the collection, BENCHMARKS.md), and how many jobs needed a
    second attempt (a retry's backoff, not the index, then decides the rate)."""
    from sqlmodel import Session, func, select

    from sluice.ops.ingest import ingest_bytes
    from sluice.pipeline.queueing.publishing import publish
    from sluice.storage.models import Job, JobEvent

    cpu_before = cpu_seconds(server) if server else 0.0
    ids = [
        ingest_bytes(
            ctx, body, dataset=dataset, filename=f"{kind}-{size}-{i}.txt", publish=publish
        ).job_id
        for i, body in enumerate(bodies)
    ]
    done = wait_final(ctx, ids, timeout=1800)
    server_cpu = cpu_seconds(server) - cpu_before if server else None
    if done.statuses != {"succeeded": len(ids)}:
        raise RuntimeError(f"{kind} documents at {size:,} ended {done.statuses}")
    with Session(ctx.engine) as session:
        first = min(
            as_epoch(s) for s in session.exec(select(Job.started_at).where(Job.id.in_(ids))).all()
        )
        retried = session.exec(
            select(func.count(func.distinct(JobEvent.job_id))).where(
                JobEvent.job_id.in_(ids), JobEvent.kind == "attempt_failed"
            )
        ).one()
    seconds = max(done.last_finished - first, 1e-6)
    return {
        "documents": len(ids),
        "chunks": done.chunks,
        "seconds": seconds,
        "chunks_per_s": done.chunks / seconds,
        "stages": stage_seconds(ctx, ids),
        "retried": retried,
        "server_cpu_ms_per_chunk": (
            None if server_cpu is None else 1000 * server_cpu / max(done.chunks, 1)
        ),
    }


def stage_seconds(ctx, job_ids: list[int]) -> dict[str, float]:
    """Mean seconds per job spent in each stage: the time from each event to the job's next one,
    counted to the stage the earlier event names."""
    from sqlmodel import Session, select

    from sluice.storage.models import JobEvent

    with Session(ctx.engine) as session:
        rows = session.exec(
            select(JobEvent.job_id, JobEvent.at, JobEvent.stage)
            .where(JobEvent.job_id.in_(job_ids))
            .order_by(JobEvent.job_id, JobEvent.at, JobEvent.id)
        ).all()
    spent: dict[str, float] = defaultdict(float)
    for (job, at, stage), (job_next, at_next, _) in zip(rows, rows[1:], strict=False):
        if job == job_next:
            spent[stage or "?"] += as_epoch(at_next) - as_epoch(at)
    return {stage: seconds / len(job_ids) for stage, seconds in spent.items()}


def queries(loader: Loader, n: int) -> list[str]:
    """A third rare codes, a third quoted two-word phrases, a third five loose words."""
    typed = []
    for i in range(n):
        if i % 3 == 0 and loader.codes:
            typed.append(loader.rng.choice(loader.codes))
        elif i % 3 == 1:
            typed.append('"' + " ".join(loader.rng.choice(loader.words[:120]) for _ in "ab") + '"')
        else:
            typed.append(loader.text(5))
    return typed


def latency(ctx, typed: list[str]) -> dict[str, dict[str, float]]:
    """p50 and p95 in ms of each mode, without and with the metadata filter (one warm-up each)."""
    from sluice.ops.search import search

    out = {}
    for mode in MODES:
        for label, where in ((mode, None), (f"{mode}|filtered", FILTER)):
            search(ctx, query=typed[0], dataset=DATASET, k=10, mode=mode, where=where)
            times = []
            for q in typed:
                t = time.perf_counter()
                search(ctx, query=q, dataset=DATASET, k=10, mode=mode, where=where)
                times.append((time.perf_counter() - t) * 1000)
            times.sort()
            out[label] = {
                "p50": statistics.median(times),
                "p95": times[int(0.95 * (len(times) - 1))],
            }
    return out


def recall(ctx, queries_n: int) -> dict:
    """The recall audit's measure at this size, its exact search allowed whatever the size."""
    from sluice.ops.search import get_dataset
    from sluice.pipeline.reconcile import recall as audit

    collection = get_dataset(ctx, DATASET).collection
    exact = _Remembered(audit._exact)
    with mock.patch.object(audit, "EXACT_LIMIT", 10**9), mock.patch.object(audit, "_exact", exact):
        found = audit.audit_recall(ctx, collection, sample=200, queries=queries_n)
        deeper = {str(depth): _deeper(ctx, collection, queries_n, depth) for depth in DEPTHS}
    return {
        "recall": found.recall,
        "queries": found.queries,
        "sampled": found.sampled,
        "unreachable": found.unreachable,
        "hard_to_reach": found.hard_to_reach,
        "chunks": found.chunks,
        "seconds": found.seconds,
        "deeper": deeper,
    }


DEPTHS = (800, 1600)  # walks deeper than vectors.HNSW's ef_search: what a larger one would buy


class _Remembered:
    """The audit's exact search, done once for the same queries (a walk of every vector)."""

    def __init__(self, exact) -> None:
        self.exact, self.seen = exact, {}

    def __call__(self, ctx, collection, queries, k):
        key = (collection, queries.tobytes(), k)
        if key not in self.seen:
            self.seen[key] = self.exact(ctx, collection, queries, k)
        return self.seen[key]


def _deeper(ctx, collection: str, queries_n: int, depth: int) -> dict:
    """The same audit with each query walking ``depth`` candidates (Chroma's walk is at least as
    deep as the answer is long: the first 10 of ``depth`` answers are what ef_search ``depth``
    would return), and a query's time at that depth (an upper bound: the answer is longer)."""
    import numpy as np

    from sluice.pipeline.reconcile import recall as audit

    answers = audit._answers

    def deep(ctx_, name, queries, n):
        return [row[:n] for row in answers(ctx_, name, queries, max(n, depth))]

    with mock.patch.object(audit, "_answers", deep):
        found = audit.audit_recall(ctx, collection, sample=200, queries=queries_n)
    rng = np.random.default_rng(5)
    probes = rng.normal(size=(20, ctx.embedder.dim)).astype(np.float32)
    spent = timed(list(probes), lambda q: ctx.vectors.query_ids(collection, q[None, :], n=depth))
    return {"recall": found.recall, "query_ms": spent}


def timed(calls: list, fn) -> dict[str, float]:
    """p50 and p95 in ms of ``fn`` over each of ``calls`` (one warm-up)."""
    fn(calls[0])
    times = []
    for arg in calls:
        t = time.perf_counter()
        fn(arg)
        times.append((time.perf_counter() - t) * 1000)
    times.sort()
    return {"p50": statistics.median(times), "p95": times[int(0.95 * (len(times) - 1))]}


def reads(ctx, n: int) -> dict[str, dict[str, float]]:
    """What a person or an application reads of one job or document at this size: the API's
    ``GET /v1/jobs/{id}`` (its body, as ``sluice.api.scoped.job`` makes it for a key of every
    dataset), the console's job detail, and the document page (its header and first page of
    chunks), each over ``n`` jobs drawn from the whole dataset."""
    from sqlalchemy import func as sa_func
    from sqlmodel import Session, select

    from sluice.api import scoped
    from sluice.ops import document_view
    from sluice.ops.keys import ApiPrincipal
    from sluice.ops.reads import job_detail
    from sluice.ops.search import get_dataset
    from sluice.storage.models import Job, JobStatus

    dataset_id = get_dataset(ctx, DATASET).id
    with Session(ctx.engine) as session:
        picked = session.exec(
            select(Job.id, Job.document_id)
            .where(Job.dataset_id == dataset_id, Job.status == JobStatus.succeeded)
            .order_by(sa_func.random())
            .limit(n)
        ).all()
    every = ApiPrincipal(0, "bench", "read", True, frozenset())

    def page(pair) -> None:
        document_view.view(ctx, f"doc:{pair[1]}")
        document_view.chunks(ctx, pair[1])

    return {
        "api_job": timed(picked, lambda pair: scoped.job(every, pair[0])),
        "job_detail": timed(picked, lambda pair: job_detail(pair[0])),
        "document_page": timed(picked, page),
    }


def reconcile_at_size(ctx) -> dict:
    """The reconcile pass at this size: a full repairing walk (it saves the checkpoint), a dry full
    walk under tracemalloc for its peak memory, then 5 documents' metadata changed through Sluice
    and a dry pass over what changed."""
    from sqlmodel import Session, select

    from sluice.ops.metadata import set_document_metadata
    from sluice.ops.search import get_dataset
    from sluice.pipeline.reconcile.audit import reconcile
    from sluice.storage.models import Document
    from tests.support.big_store import traced_reconcile

    started = time.perf_counter()
    full = reconcile(ctx, dataset=DATASET, repair=True, save=False, actor="bench")
    full_s = time.perf_counter() - started
    traced = traced_reconcile(ctx, DATASET)
    dataset_id = get_dataset(ctx, DATASET).id
    with Session(ctx.engine) as session:
        docs = session.exec(
            select(Document.id).where(Document.dataset_id == dataset_id).limit(5)
        ).all()
    for doc in docs:  # a value of this size's own: the same one again would change nothing
        set_document_metadata(ctx, doc, {"bench": f"changed at {full.chunks}"}, actor="bench")
    started = time.perf_counter()
    changed = reconcile(ctx, dataset=DATASET, save=False, changed_only=True)
    incremental_s = time.perf_counter() - started
    [summary] = changed.datasets
    index = full.datasets[0].index or {} if full.datasets else {}
    return {
        "full_s": full_s,
        # the recall audit's share of the full pass, and what its repair did (a rebuild copies
        # every chunk into a new collection)
        "index_s": index.get("seconds"),
        "index_healthy": index.get("healthy"),
        "actions": list(full.actions),
        "full_found": [full.missing, full.orphans, full.mismatched],
        "full_errors": len(full.errors),
        "peak_mb": traced.peak / 1024 / 1024,
        "traced_s": traced.seconds,
        "incremental_s": incremental_s,
        "incremental_kind": summary.kind,
        "incremental_jobs": summary.jobs_checked,
        "ids_asked": summary.ids_asked,
    }


def disk_mb(folder: Path) -> float:
    if not folder.exists():
        return 0.0
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 1024 / 1024


def point(svc: Services, ctx, loader: Loader, size: int, args) -> dict:
    """Everything measured at one size."""
    from sluice.ops.search import get_dataset

    started = time.perf_counter()
    added = loader.grow(size)
    grew = time.perf_counter() - started
    collection = get_dataset(ctx, DATASET).collection
    indexed = ctx.vectors.count(collection)
    log(f"{indexed:,} chunks in the dataset ({added:,} bulk-loaded in {grew:.0f} s)")
    with ctx.engine.begin() as conn:  # fresh statistics after the bulk load, as autovacuum would
        from sqlalchemy import text

        conn.execute(text("ANALYZE"))
    server = svc.chroma.pid
    small = ingest(
        ctx, loader, size, "small", documents(loader, args.docs, size, (1, 3)), server=server
    )
    big = ingest(
        ctx,
        loader,
        size,
        "big",
        documents(loader, args.big, size, (args.big_chunks,) * 2),
        server=server,
    )
    log(
        f"ingest at {size:,}: small {small['chunks_per_s']:.1f} chunks/s, "
        f"big {big['chunks_per_s']:.1f} chunks/s; Chroma server CPU per chunk "
        f"{small['server_cpu_ms_per_chunk']:.1f} / {big['server_cpu_ms_per_chunk']:.1f} ms; "
        f"jobs retried {small['retried']} / {big['retried']}"
    )
    lat = latency(ctx, queries(loader, args.queries))
    log(f"hybrid p95 {lat['hybrid']['p95']:.1f} ms, filtered {lat['hybrid|filtered']['p95']:.1f}")
    rec = recall(ctx, args.recall_queries)
    log(f"recall@10 {rec['recall']} over {rec['queries']} queries ({rec['seconds']:.0f} s)")
    read = reads(ctx, args.queries)
    log("reads p95 " + ", ".join(f"{k} {v['p95']:.1f} ms" for k, v in read.items()))
    walk = reconcile_at_size(ctx) if size else None
    if walk:
        log(
            f"reconcile: full {walk['full_s']:.1f} s (found {walk['full_found']}), peak "
            f"{walk['peak_mb']:.1f} MB; incremental {walk['incremental_s']:.2f} s"
        )
    return {
        "reads": read,
        "reconcile": walk,
        "size": size,
        "indexed": indexed,
        "bulk_s": grew,
        "added": added,
        "small": small,
        "big": big,
        "latency": lat,
        "recall": rec,
        "chroma_mb": disk_mb(svc.workdir / "chroma"),
        "db_mb": disk_mb(svc.workdir / "scale"),
    }


def model_point(svc: Services, loader: Loader, args) -> dict:
    """The shipped model's ingest into an empty dataset of its own: a worker of the same threads
    with the real model (loaded offline) takes the same mix of small and big documents, uploaded
    by this process under the same settings (a job is built for its uploader's pipeline version,
    and a dataset holds one model's vectors). Its rate against the hash embedder's into the empty
    dataset is how much of a chunk's cost the model is; the index's part grows, the model's not."""
    from sluice.pipeline.running.context import set_context
    from sluice.settings import reset_settings_cache

    def switch(embedder: str):
        os.environ["SLUICE_EMBEDDER"] = embedder
        reset_settings_cache()
        set_context(None)
        return svc.context()

    ctx = switch("sentence-transformers")
    worker = svc.start_worker(dict(os.environ), "scale-model", workers=THREADS)
    try:
        server = svc.chroma.pid
        runs = {
            kind: ingest(
                ctx, loader, 0, f"model-{kind}", bodies, server=server, dataset=MODEL_DATASET
            )
            for kind, bodies in (
                ("small", documents(loader, args.docs, 0, (1, 3))),
                ("big", documents(loader, args.big, 0, (args.big_chunks,) * 2)),
            )
        }
    finally:
        svc.stop_worker(worker)
        switch("hash")
    log(
        f"model into an empty dataset: small {runs['small']['chunks_per_s']:.1f} chunks/s, "
        f"big {runs['big']['chunks_per_s']:.1f} chunks/s"
    )
    return runs


def measure(args, report=None) -> list[dict]:
    """Every point of ``args.sizes``; ``report`` (if given) gets the points after each one, so a
    run stopped at the largest size keeps what it measured before."""
    from sluice.pipeline.queueing.publishing import publish

    with Services() as svc:
        # The recovery loop at its default pace, as in production: an hour's interval made every
        # round count the reapers as silent and hold a worker thread for the grace each minute.
        env = svc.configure("scale", SLUICE_EMBEDDER="hash")
        ctx = svc.context()
        worker = svc.start_worker(env, "scale", workers=THREADS)
        loader = Loader(ctx, DATASET)
        # The dataset is made by a first upload through the worker (which warms it up, too).
        from sluice.ops.ingest import ingest_bytes

        first = ingest_bytes(
            ctx, b"the first document " * 40, dataset=DATASET, filename="a.txt", publish=publish
        )
        if wait_final(ctx, [first.job_id], timeout=300).statuses != {"succeeded": 1}:
            raise RuntimeError("the first upload did not succeed")
        points: list[dict] = []
        for size in args.sizes:
            points.append(point(svc, ctx, loader, size, args))
            if args.model and size == args.sizes[0]:
                svc.stop_worker(worker)
                points[-1]["model"] = model_point(svc, loader, args)
                ctx = loader.ctx = svc.context()
                worker = svc.start_worker(env, "scale-after-model", workers=THREADS)
            if report:
                report(points)
        svc.stop_worker(worker)
    return points


def _met(ok: bool | None) -> str:
    return {True: "met", False: "**missed**", None: ""}[ok]


def ingest_table(points: list[dict]) -> list[str]:
    base = points[0]
    lines = [
        "| chunks in the dataset | small documents, chunks/s | / empty | big documents, "
        "chunks/s | / empty | target | |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for p in points:
        rs = p["small"]["chunks_per_s"] / base["small"]["chunks_per_s"]
        rb = p["big"]["chunks_per_s"] / base["big"]["chunks_per_s"]
        target = RATIO_TARGETS.get(p["size"])
        ok = None if target is None or p is base else min(rs, rb) >= target
        lines.append(
            f"| {p['indexed']:,} | {p['small']['chunks_per_s']:.1f} "
            f"({p['small']['documents']} docs, {p['small']['chunks']} chunks) | {rs:.2f} "
            f"| {p['big']['chunks_per_s']:.1f} ({p['big']['documents']} docs, "
            f"{p['big']['chunks']} chunks) | {rb:.2f} "
            f"| {f'>= {target}' if target else ''} | {_met(ok)} |"
        )
    return lines


def model_lines(points: list[dict]) -> list[str]:
    """The shipped model's rate into an empty dataset beside the hash embedder's (``--model``)."""
    base = points[0]
    if "model" not in base:
        return []
    cells = []
    for kind in ("small", "big"):
        model, hashed = base["model"][kind], base[kind]
        cells.append(
            f"{kind} documents {model['chunks_per_s']:.1f} chunks/s against "
            f"{hashed['chunks_per_s']:.1f} with the hash embedder "
            f"({model['chunks_per_s'] / hashed['chunks_per_s']:.2f} of it)"
        )
    return [
        "",
        "The shipped model into an empty dataset of its own (the same mix of documents with "
        f"texts of their own, the same worker threads), beside the hash embedder's rate at the "
        f"first point ({base['indexed']:,} chunks): "
        + "; ".join(cells)
        + ". The model's cost per chunk does not depend on the index, so with the model the "
        "index's growth is a smaller share of each chunk's cost than in the ratios above.",
    ]


def search_table(points: list[dict]) -> list[str]:
    labels = [(m, f"{m}|filtered") for m in MODES]
    head = " | ".join(f"{m} | {m}, filtered" for m in MODES)
    lines = [
        f"| chunks | {head} | hybrid p95 < {HYBRID_P95_MS:.0f} ms | recall@10 (queries) | |",
        "| --- " * 10 + "|",
    ]
    for p in points:
        lat = p["latency"]
        cells = " | ".join(
            f"{lat[a]['p50']:.1f} / {lat[a]['p95']:.1f} | {lat[b]['p50']:.1f} / {lat[b]['p95']:.1f}"
            for a, b in labels
        )
        worst = max(lat["hybrid"]["p95"], lat["hybrid|filtered"]["p95"])
        rec = p["recall"]
        ok = None if rec["recall"] is None else rec["recall"] >= RECALL_TARGET
        lines.append(
            f"| {p['indexed']:,} | {cells} | {_met(worst < HYBRID_P95_MS)} "
            f"| {rec['recall'] if rec['recall'] is not None else 'n/a'} ({rec['queries']}; "
            f"{rec['sampled'] - rec['unreachable']}/{rec['sampled']} reached){_deeper_cell(rec)} "
            f"| {_met(ok)} |"
        )
    return lines


def _deeper_cell(rec: dict) -> str:
    """What deeper walks returned: '; walking 800: 0.97 (p95 12 ms a query), ...'."""
    parts = [
        f"{depth}: {got['recall']} (p95 {got['query_ms']['p95']:.0f} ms a query)"
        for depth, got in (rec.get("deeper") or {}).items()
    ]
    return f"; walking {', '.join(parts)}" if parts else ""


READ_TARGETS = {"api_job": 10.0, "job_detail": 100.0, "document_page": 100.0}


def reads_table(points: list[dict]) -> list[str]:
    """The job and document reads at each size, and the reconcile pass."""
    lines = [
        "| chunks | `GET /v1/jobs/{id}` body, p50 / p95 ms (target p95 < 10) | console job detail "
        "(< 100) | document page (< 100) | reconcile full, s (< 300 at 1,000,000) | its traced "
        "peak | incremental after 5 documents changed, s (< 10) |",
        "| --- " * 7 + "|",
    ]
    for p in points:
        read = p.get("reads") or {}
        cells = [
            f"{read[k]['p50']:.1f} / {read[k]['p95']:.1f} {_met(read[k]['p95'] < bound)}"
            if k in read
            else ""
            for k, bound in READ_TARGETS.items()
        ]
        walk = p.get("reconcile")
        if walk:
            index = (
                f"; its recall check {walk['index_s']:.1f} s"
                + ("" if walk.get("index_healthy", True) else ", unhealthy")
                + (f", {len(walk['actions'])} repair(s)" if walk.get("actions") else "")
                if walk.get("index_s") is not None
                else ""
            )
            cells += [
                f"{walk['full_s']:.1f} (missing, orphans, mismatched: "
                f"{', '.join(str(n) for n in walk['full_found'])}{index})",
                f"{walk['peak_mb']:.1f} MB",
                f"{walk['incremental_s']:.2f} ({walk['incremental_kind']}, "
                f"{walk['incremental_jobs']} jobs, {walk['ids_asked']:,} ids asked)",
            ]
        else:
            cells += ["", "", ""]
        lines.append(f"| {p['indexed']:,} | " + " | ".join(cells) + " |")
    return lines


def growth_table(points: list[dict]) -> list[str]:
    stages = sorted({s for p in points for s in (*p["small"]["stages"], *p["big"]["stages"])})
    lines = [
        "| chunks | bulk load, chunks/s | Chroma on disk | job database | Chroma server CPU per "
        "chunk, ms: small, big | jobs retried: small, big | small job, ms per stage: "
        + ", ".join(stages)
        + " | big job, s per stage |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for p in points:
        rate = f"{p['added'] / p['bulk_s']:,.0f}" if p["added"] else ""
        small = ", ".join(f"{1000 * p['small']['stages'].get(s, 0):.0f}" for s in stages)
        big = ", ".join(f"{p['big']['stages'].get(s, 0):.2f}" for s in stages)
        cpu = ", ".join(
            ""
            if p[k].get("server_cpu_ms_per_chunk") is None
            else f"{p[k]['server_cpu_ms_per_chunk']:.1f}"
            for k in ("small", "big")
        )
        retried = f"{p['small'].get('retried', 0)}, {p['big'].get('retried', 0)}"
        lines.append(
            f"| {p['indexed']:,} | {rate} | {p['chroma_mb']:.0f} MB | {p['db_mb']:.0f} MB "
            f"| {cpu} | {retried} | {small} | {big} |"
        )
    return lines


def what_grows(points: list[dict]) -> str:
    """The stage whose time per big job grew the most from the first size to the last."""
    if len(points) < 2:
        return "One size only: nothing to compare."
    first, last = points[0]["big"]["stages"], points[-1]["big"]["stages"]
    grown = sorted(((last.get(s, 0) - first.get(s, 0), s) for s in last), reverse=True)
    delta, stage = grown[0]
    per_k = (points[-1]["chroma_mb"] - points[0]["chroma_mb"]) / max(
        1, (points[-1]["indexed"] - points[0]["indexed"]) / 1000
    )
    return (
        f"From {points[0]['indexed']:,} to {points[-1]['indexed']:,} chunks the stage of a big "
        f"job that grew most is **{stage}** ({first.get(stage, 0):.2f} s to "
        f"{last.get(stage, 0):.2f} s, {delta:+.2f} s); Chroma's folder grows by "
        f"{per_k:.1f} MB per 1,000 chunks."
    )


def intro(args, load: tuple[str, str], minutes: float) -> str:
    sizes = ",".join(str(s) for s in args.sizes)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return (
        f"`python -m bench.scale --sizes {sizes} --docs {args.docs} --big {args.big} "
        f"--big-chunks {args.big_chunks} --queries {args.queries}"
        f"{' --model' if getattr(args, 'model', False) else ''}` ({when}, {minutes:.1f} min). "
        f"Machine: {machine()}; load average {load[0]} at start, {load[1]} at end (1/5/15 min; "
        "other work shares this machine). Hash embedder (the model is not the subject), SQLite "
        f"job database, a Chroma server, one huey_consumer of {THREADS} threads; the dataset "
        f"grown by bulk loading in documents of {PER_DOC} chunks, big documents of "
        f"{args.big_chunks} chunks. Ingest figures are ratios to the empty dataset of the same run."
    )


def section(points: list[dict], args, load: tuple[str, str], minutes: float) -> str:
    skipped = [s for s in SIZES if s not in args.sizes]
    lines = [
        TITLE,
        "",
        intro(args, load, minutes),
        *(["", f"Note on this run: {args.note}"] if args.note else []),
        "",
        *ingest_table(points),
        *model_lines(points),
        "",
        "Search, p50 / p95 in ms, k=10; filtered: a metadata filter allowing a tenth of the "
        "documents; recall@10 of the ANN index against exact search over every stored vector (the "
        f"recall audit's measure; target >= {RECALL_TARGET}); the p95 bound is the target at "
        "1,000,000 chunks, checked at each size measured.",
        "",
        *search_table(points),
        "",
        "Reads of one job or document (over jobs drawn from the whole dataset) and the "
        "reconcile pass (a full repairing walk, a dry one under tracemalloc for the peak, and a "
        "dry pass over what changed):",
        "",
        *reads_table(points),
        "",
        "What grows (stage times from the job events, mean per job):",
        "",
        *growth_table(points),
        "",
        what_grows(points),
    ]
    if getattr(args, "plots", None):
        lines += [
            "",
            *(
                f"![{alt}]({args.plots.as_posix().rstrip('/')}/{name}.png)"
                for name, alt in (
                    ("ingest", "ingest rate against index size"),
                    ("search_p95", "search p95 against index size"),
                    ("recall", "recall@10 against index size"),
                )
            ),
        ]
    if skipped:
        lines += [
            "",
            "Not run in this run: the "
            + " and ".join(f"{s:,}" for s in skipped)
            + " chunk points of the issue's sizes ("
            + ", ".join(f"{s:,}" for s in SIZES)
            + "); their targets are unmeasured.",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale")
    parser.add_argument(
        "--sizes",
        type=lambda v: sorted({int(x) for x in v.split(",")}),
        default=list(SIZES),
        help="chunks in the dataset at each point, comma-separated (0 first)",
    )
    parser.add_argument("--docs", type=int, default=40, help="small documents at each size")
    parser.add_argument("--big", type=int, default=3, help="big documents at each size")
    parser.add_argument("--big-chunks", type=int, default=BIG_CHUNKS, help="chunks of each")
    parser.add_argument("--queries", type=int, default=60, help="searches of each kind")
    parser.add_argument("--recall-queries", type=int, default=50)
    parser.add_argument("--out", type=Path, help="Markdown file whose section to replace")
    parser.add_argument("--json", type=Path, help="also write every figure measured here")
    parser.add_argument("--note", default="", help="a sentence on this run's conditions")
    parser.add_argument("--plots", type=Path, help="folder to draw the PNGs into (bench.plots)")
    parser.add_argument(
        "--model",
        action="store_true",
        help="also ingest with the shipped model into an empty dataset of its own",
    )
    args = parser.parse_args(argv)
    clean_environment()
    load_start, started = load_average(), time.monotonic()

    def report(points: list[dict]) -> None:
        minutes = (time.monotonic() - started) / 60
        text = section(points, args, (load_start, load_average()), minutes)
        print(text, flush=True)
        if args.json:
            args.json.write_text(
                json.dumps(
                    {"machine": machine(), "argv": portable(argv), "points": points}, indent=1
                )
            )
        if args.out:
            write_section(args.out, TITLE, text)
        if args.plots:
            from bench.plots import draw

            draw(points, args.plots, machine())

    measure(args, report)
    return 0


def portable(argv: list[str] | None) -> list[str]:
    """The command line as recorded: paths relative to the working folder, so a figure file names
    no folder of the machine that made it."""
    out = []
    for arg in sys.argv[1:] if argv is None else argv:
        if os.path.isabs(arg):
            path = Path(arg)
            arg = os.path.relpath(path) if path.is_relative_to(Path.cwd()) else path.name
        out.append(arg)
    return out


if __name__ == "__main__":
    sys.exit(main())
