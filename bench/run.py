"""The benchmark: Sluice against the physical limit of its model, against LlamaIndex, and at scale.

    python -m bench.run            full run (about 15 minutes), writes BENCHMARKS.md
    python -m bench.run --quick    a small version (under 2 minutes)
    python -m bench.run --smoke    the smallest input: every figure once, for the suite's check
                                   that each still comes out a number (tests/test_bench_run.py)
    python -m bench.run --out X    write the table to X instead

It starts its own queue Redis, cache Redis and Chroma server on free ports, and real huey_consumer
workers, in a temporary folder; nothing of a running system is touched. The heavy figures run in
rounds (raw limits, Sluice in each precision, the peer), so that a change in the machine's load hits
all of them alike; each figure is the median of the rounds with min and max.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from bench import corpus as corpus_mod
from bench.report import Table, header, spread, write_markdown
from bench.system import Services, clean_environment

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = Path(
    os.environ.get("SLUICE_SAMPLES_DIR", ROOT.parent / "shared" / "corpus" / "pdf-samples")
)
BATCH = 32
SMALL_THREADS = 4  # the Procfile's worker threads (`sluice serve worker --workers 4`)


@dataclass
class Plan:
    quick: bool
    rounds: int
    documents: int
    pages: int
    tiny_jobs: int
    noop_tasks: int
    dedupe_repeats: int
    crash_pages: int
    console_jobs: int
    console_repeats: int
    big_pages: int
    memory_runs: int
    small_documents: int
    cold_starts: int
    smoke: bool = False  # the smallest input: generated documents only, no shared samples

    @property
    def mode(self) -> str:
        return "smoke" if self.smoke else "quick" if self.quick else "full"

    @classmethod
    def make(cls, quick: bool, rounds: int | None, *, smoke: bool = False) -> Plan:
        if smoke:
            return cls(
                True,
                rounds or 1,
                documents=2,
                pages=2,
                tiny_jobs=20,
                noop_tasks=100,
                dedupe_repeats=2,
                crash_pages=20,
                console_jobs=1_000,
                console_repeats=3,
                big_pages=30,
                memory_runs=1,
                small_documents=4,
                cold_starts=1,
                smoke=True,
            )
        if quick:
            return cls(
                True,
                rounds or 1,
                documents=3,
                pages=3,
                tiny_jobs=40,
                noop_tasks=300,
                dedupe_repeats=5,
                crash_pages=60,
                console_jobs=5_000,
                console_repeats=5,
                big_pages=100,
                memory_runs=1,
                small_documents=12,
                cold_starts=1,
            )
        return cls(
            False,
            rounds or 3,
            documents=16,
            pages=8,
            tiny_jobs=300,
            noop_tasks=3000,
            dedupe_repeats=20,
            crash_pages=104,
            console_jobs=100_000,
            console_repeats=30,
            big_pages=2000,
            memory_runs=3,
            small_documents=200,
            cold_starts=3,
        )


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def subprocess_json(module: str, spec: dict, workdir: Path, timeout: float) -> dict:
    """Run ``python -m module spec.json`` and return the JSON on its last line of output."""
    spec_path = workdir / f"{module.replace('.', '-')}-{time.monotonic_ns()}.json"
    spec_path.write_text(json.dumps(spec))
    proc = subprocess.run(
        [sys.executable, "-m", module, str(spec_path)],
        cwd=ROOT,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{module} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def peer_available() -> str:
    """Empty when LlamaIndex can run; otherwise why not."""
    import importlib.util

    for name in (
        "llama_index.core",
        "llama_index.embeddings.huggingface",
        "llama_index.vector_stores.chroma",
    ):
        try:
            if importlib.util.find_spec(name) is None:
                return f"{name} is not installed (`make bench` installs the `bench` extra)"
        except ModuleNotFoundError:
            return f"{name} is not installed (`make bench` installs the `bench` extra)"
    return ""


HAYSTACK_MODULES = (
    "haystack",
    "haystack_integrations.components.embedders.sentence_transformers",
    "haystack_integrations.document_stores.chroma",
    "pypdf",
)


def haystack_available() -> str:
    """Empty when Haystack's indexing pipeline can run; otherwise why not."""
    import importlib.util

    for name in HAYSTACK_MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            return f"{name} is not installed (`pip install -e '.[peer-haystack]'`)"
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a small version, under 2 minutes")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="the smallest input (every figure once; its numbers mean little): the suite's check",
    )
    parser.add_argument(
        "--out", type=Path, default=ROOT / "BENCHMARKS.md", help="Markdown file to write"
    )
    parser.add_argument("--json", type=Path, help="also write every raw measurement as JSON here")
    parser.add_argument(
        "--rounds", type=int, help="rounds of the heavy figures (default 3, quick 1)"
    )
    args = parser.parse_args(argv)

    plan = Plan.make(args.quick, args.rounds, smoke=args.smoke)
    clean_environment()
    started = datetime.now(UTC)
    t_start = time.monotonic()
    load_start = os.getloadavg()
    raw: dict = {"plan": plan.__dict__}
    with Services() as svc:
        raw.update(measure(svc, plan))
    load_end = os.getloadavg()
    table, precision, corpus_text, extra = build_table(raw, plan)
    seconds = time.monotonic() - t_start
    generated = (
        header(
            started=started.strftime("%Y-%m-%d %H:%M UTC"),
            seconds=seconds,
            load_start=load_start,
            load_end=load_end,
            quick=plan.quick,
            mode=plan.mode,
            precision=precision,
            corpus=corpus_text,
            extra=extra,
        )
        + "\n\n"
        + table.markdown()
    )
    print(table.text())
    print(f"\nload average at start {load_start}, at end {load_end}; {seconds:.0f}s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_markdown(args.out, generated)
    if args.json:
        args.json.write_text(json.dumps(raw, indent=1, default=str))
    log(f"wrote {args.out}")
    return 0


# --- measuring ------------------------------------------------------------------------------------


def measure(svc: Services, plan: Plan) -> dict:
    from bench.sluice_runs import ingest_corpus, recall_ranks
    from sluice.pipeline.running.embed import cpu_has_bf16, resolve_precision

    work = svc.workdir
    gen_paths, facts = corpus_mod.generate(
        work / "corpus", documents=plan.documents, pages=plan.pages
    )
    paths = gen_paths + ([] if plan.smoke else corpus_mod.sample_pdfs(SAMPLES, quick=plan.quick))
    small_paths = corpus_mod.generate_small(work / "small", documents=plan.small_documents)
    warm_doc = corpus_mod.generate_big(work / "warm" / "warm-up.pdf", pages=2, seed=99)
    fact_dicts = [f.__dict__ for f in facts]
    # bf16 without native bf16 arithmetic is emulated (several times slower than fp32): `auto` does
    # not choose it there, and measuring it would only spend the time budget.
    native_bf16 = cpu_has_bf16()
    auto = resolve_precision("auto")
    precisions = ["fp32", "bf16"] if native_bf16 else ["fp32"]
    out: dict = {
        "corpus": {
            "files": len(paths),
            "generated": len(gen_paths),
            "pages": plan.pages,
            "facts": len(facts),
            "small": len(small_paths),
        },
        "native_bf16": native_bf16,
        "auto": auto,
        "rounds": [],
    }
    why_no_peer = peer_available()
    out["peer_unavailable"] = why_no_peer
    why_no_haystack = haystack_available()
    out["haystack_unavailable"] = why_no_haystack
    if why_no_haystack:
        log(f"Haystack is skipped: {why_no_haystack}")
    settings_common = {"SLUICE_EMBED_BATCH_SIZE": str(BATCH)}

    for r in range(plan.rounds):
        rnd: dict = {}
        log(f"round {r + 1}/{plan.rounds}: raw limits and the plain script")
        rnd["limits"] = subprocess_json(
            "bench.encode",
            {
                "paths": [str(p) for p in paths],
                "chunk_size": 800,
                "chunk_overlap": 100,
                "batch": BATCH,
                "precisions": precisions,
                "chroma_url": svc.chroma.url,
                # The limit (Sluice's own embedder, the model alone) every round; the model's plain
                # encode with torch's defaults and the plain script once, to keep within 15 minutes.
                "modes": (["intraop"] if r == 0 else []) + ["packed"],
                "plain": ["fp32"] if r == 0 else [],
            },
            work,
            1800,
        )
        log(
            f"round {r + 1}: a stream of {len(small_paths)} small documents, its raw limit, then "
            f"Sluice ({auto})"
        )
        rnd["small_limit"] = small_limit(svc, small_paths, auto)
        rnd["small"] = ingest_corpus(
            svc,
            small_paths,
            name=f"small-{r}",
            warm=warm_doc,
            workers=SMALL_THREADS,
            settings={**settings_common, "SLUICE_EMBED_PRECISION": "auto"},
        )

        def keep_auto(ctx, publish, job_ids, first=(r == 0)):
            from bench.savings import dedupe_answer

            extra = {
                "dedupe": dedupe_answer(ctx, publish, gen_paths[:5], repeats=plan.dedupe_repeats)
            }
            if first:
                extra["ranks"] = recall_ranks(ctx, facts)
            return extra

        def keep_fp32(ctx, publish, job_ids, first=(r == 0)):
            return {"ranks": recall_ranks(ctx, facts)} if first else {}

        log(f"round {r + 1}: Sluice, precision auto")
        rnd["sluice_auto"] = ingest_corpus(
            svc,
            paths,
            name=f"auto-{r}",
            keep=keep_auto,
            warm=warm_doc,
            settings={**settings_common, "SLUICE_EMBED_PRECISION": "auto"},
        )
        if auto == "fp32":  # the same run: `auto` is fp32 on this machine
            rnd["sluice_fp32"] = rnd["sluice_auto"]
        else:
            log(f"round {r + 1}: Sluice, precision fp32")
            rnd["sluice_fp32"] = ingest_corpus(
                svc,
                paths,
                name=f"fp32-{r}",
                keep=keep_fp32,
                warm=warm_doc,
                settings={**settings_common, "SLUICE_EMBED_PRECISION": "fp32"},
            )
        if not why_no_peer:
            setups = ["fp32", "default"] if r % 2 == 0 else ["default", "fp32"]
            log(f"round {r + 1}: LlamaIndex IngestionPipeline, {' then '.join(setups)} setup")
            try:
                peer = subprocess_json(
                    "bench.peer",
                    {
                        "paths": [str(p) for p in paths],
                        "setups": setups,
                        "batch": BATCH,
                        "chroma_url": svc.chroma.url,
                        "facts": fact_dicts if r == 0 else [],
                    },
                    work,
                    1800,
                )
                rnd["llama_fp32"], rnd["llama_default"] = peer["fp32"], peer["default"]
                out["llama_index"] = peer["llama_index"]
            except RuntimeError as exc:
                why_no_peer = f"LlamaIndex failed: {str(exc).strip().splitlines()[-1]}"
                out["peer_unavailable"] = why_no_peer
        # Haystack in the first round only (both setups and its recall): three rounds of it would
        # take the full bench past its time budget.
        if not why_no_haystack and r == 0:
            log(f"round {r + 1}: Haystack's indexing pipeline, fp32 then default setup")
            try:
                hay = subprocess_json(
                    "bench.peer",
                    {
                        "peer": "haystack",
                        "paths": [str(p) for p in paths],
                        # its embedder's default batch is 32: then the documented setup is the
                        # fp32 one at Sluice's batch, measured once
                        "setups": ["fp32"] if BATCH == 32 else ["fp32", "default"],
                        "batch": BATCH,
                        "chroma_url": svc.chroma.url,
                        "facts": fact_dicts,
                    },
                    work,
                    1800,
                )
                rnd["haystack_fp32"] = hay["fp32"]
                rnd["haystack_default"] = hay.get("default", hay["fp32"])
                out["haystack"] = hay["haystack"]
            except RuntimeError as exc:
                why_no_haystack = f"Haystack failed: {str(exc).strip().splitlines()[-1]}"
                out["haystack_unavailable"] = why_no_haystack
                log(why_no_haystack)
        out["rounds"].append(rnd)

    from bench.orchestration import huey_noop_per_second, sluice_jobs_per_second

    out["orchestration"] = []
    for r in range(max(1, plan.rounds)):
        log(f"orchestration {r + 1}: Huey no-op tasks, then tiny Sluice jobs")
        out["orchestration"].append(
            {
                "huey": huey_noop_per_second(svc, tasks=plan.noop_tasks, workers=2),
                **{
                    f"sluice_w{w}": sluice_jobs_per_second(svc, jobs=plan.tiny_jobs, workers=w)
                    for w in (2, 4)
                },
            }
        )

    from bench.savings import crash_at_90

    crash_doc = corpus_mod.generate_big(
        work / "crash" / "crash.pdf", pages=plan.crash_pages, seed=5
    )
    crash_chunks = count_chunks(crash_doc)
    out["crash"] = []
    # The hash embedder: what is counted is the runner's and the cache's doing, not the model's.
    crash_settings = {**settings_common, "SLUICE_EMBEDDER": "hash"}
    for r in range(max(1, plan.rounds)):
        log(f"crash at 90% {r + 1}: {crash_chunks} chunks")
        out["crash"].append(
            crash_at_90(svc, crash_doc, chunks=crash_chunks, settings=crash_settings)
        )

    from bench.console import postgres_figures, sqlite_figures

    log(f"console: {plan.console_jobs:,} jobs on SQLite")
    out["console_sqlite"] = sqlite_figures(
        work, jobs=plan.console_jobs, repeats=plan.console_repeats
    )
    pg = os.environ.get("SLUICE_TEST_DATABASE_URL")
    if pg:
        log(f"console: {plan.console_jobs:,} jobs on PostgreSQL")
        try:
            out["console_postgres"] = postgres_figures(
                pg, jobs=plan.console_jobs, repeats=plan.console_repeats
            )
        except Exception as exc:  # the server is down: say so in the table
            out["console_postgres"] = {"error": f"{type(exc).__name__}: {exc}"}

    from bench.coldstart import cold_search, console_first_page, worker_first_chunk

    out["cold"] = []
    for r in range(plan.cold_starts):
        log(
            f"cold start {r + 1}: `sluice serve worker` to the first chunk embedded, `sluice serve "
            "console` to the first page drawn"
        )
        out["cold"].append(
            {
                "worker": worker_first_chunk(svc, name=f"cold-{r}"),
                "console": console_first_page(svc, name=f"cold-{r}"),
            }
        )
    log("cold start: `sluice search` to its first hit, 5 new processes")
    out["cold_search"] = cold_search(svc, name="cold-search")

    from bench.memory import worker_peak

    small = corpus_mod.generate_big(work / "memory" / "small.pdf", pages=10, seed=3)
    big = corpus_mod.generate_big(work / "memory" / "big.pdf", pages=plan.big_pages, seed=3)
    out["memory"] = []
    for r in range(plan.memory_runs):
        log(f"memory {r + 1}: worker peak RSS on 10 pages, then on {plan.big_pages:,} pages")
        mem_settings = {
            **settings_common,
            "SLUICE_EMBEDDER": "hash",
            "SLUICE_STAGE_TIMEOUT_SECONDS": "3600",
        }
        out["memory"].append(
            {
                "small": worker_peak(svc, small, settings=mem_settings),
                "big": worker_peak(svc, big, settings=mem_settings),
            }
        )
    return out


def small_limit(svc: Services, paths: list[Path], precision: str) -> dict:
    """The raw limit of the model on the chunks of ``paths`` (``bench.encode``, packed lanes)."""
    spec = {
        "paths": [str(p) for p in paths],
        "chunk_size": 800,
        "chunk_overlap": 100,
        "batch": BATCH,
        "precisions": [precision],
        "chroma_url": svc.chroma.url,
        "modes": ["packed"],
        "plain": [],
    }
    return subprocess_json("bench.encode", spec, svc.workdir, 1800)


def count_chunks(path: Path) -> int:
    from bench.encode import corpus_chunks

    return len(corpus_chunks([path], size=800, overlap=100))


# --- the table ------------------------------------------------------------------------------------


def build_table(raw: dict, plan: Plan) -> tuple[Table, str, str, list[str]]:
    from bench.sluice_runs import recall_at

    t = Table()
    rounds = raw["rounds"]

    def cps(d: dict | None) -> float | None:
        return d["chunks"] / d["seconds"] if d else None

    def limit(d: dict, precision: str) -> float:
        """The raw limit: the fastest way of running the model alone that was measured."""
        return max(cps(v) for k, v in d["limits"].items() if k.startswith(f"raw_{precision}_"))

    def naive(d: dict, precision: str) -> float:
        """The model's own encode, one call per pipeline batch, torch's default threads."""
        return cps(d["limits"][f"raw_{precision}_intraop"])

    def per_round(fn) -> list[float]:
        values = []
        for rnd in rounds:
            try:
                v = fn(rnd)
            except (KeyError, TypeError, ZeroDivisionError):
                v = None
            if v is not None:
                values.append(v)
        return values

    chunks = rounds[0]["sluice_auto"]["chunks"]
    precision = rounds[0]["sluice_auto"]["precision"]
    raw_chunks = rounds[0]["limits"]["chunks"]
    s1 = (
        "1. Limit ratio (chunks/s; raw = the model alone on the pipeline's chunks, same batch size)"
    )
    cores = rounds[0]["limits"]["cores"]
    modes = {
        "intraop": f"the model's own encode per batch, torch defaults ({cores} threads)",
        "lanes": f"{cores} single-threaded lanes, a batch each",
        "packed": f"Sluice's embedder alone ({cores} single-threaded lanes, batches packed by "
        "length)",
    }
    native = raw.get("native_bf16", True)
    for prec in ("fp32", "bf16") if native else ("fp32",):
        for mode, label in modes.items():
            values = per_round(lambda d, p=prec, m=mode: cps(d["limits"].get(f"raw_{p}_{m}")))
            if values:
                t.add(s1, f"raw {prec}, {label}", values, digits=1)
        t.add(
            s1,
            f"raw limit {prec} (the fastest way)",
            per_round(lambda d, p=prec: limit(d, p)),
            digits=1,
        )
    if native:
        t.add(
            s1,
            "bf16 / fp32 raw limit",
            per_round(lambda d: limit(d, "bf16") / limit(d, "fp32")),
            unit="x",
            digits=2,
        )
    else:
        t.rows.append(
            _text_row(
                s1,
                "raw bf16",
                "not measured",
                "",
                None,
                "this CPU has no native bf16 (no AVX512_BF16 or AMX): `auto` is fp32 here, "
                "and emulated bf16 is several times slower than fp32",
            )
        )
    t.add(
        s1,
        f"Sluice pipeline, auto ({precision})",
        per_round(lambda d: cps(d["sluice_auto"])),
        digits=1,
    )
    t.add(
        s1,
        f"Sluice auto / raw limit {precision}",
        per_round(lambda d: cps(d["sluice_auto"]) / limit(d, precision)),
        unit="x",
        digits=2,
        target=">= 0.95",
        ok=lambda v: v >= 0.95,
    )
    t.add(
        s1,
        f"Sluice auto / raw {precision}, the model's own encode per batch (torch defaults)",
        per_round(lambda d: cps(d["sluice_auto"]) / naive(d, precision)),
        unit="x",
        digits=2,
    )
    if native:
        t.add(
            s1,
            "Sluice auto / raw limit fp32",
            per_round(lambda d: cps(d["sluice_auto"]) / limit(d, "fp32")),
            unit="x",
            digits=2,
            target=">= 2.5",
            ok=lambda v: v >= 2.5,
        )
    else:
        t.rows.append(
            _text_row(
                s1,
                "Sluice auto / raw limit fp32",
                "n/a",
                ">= 2.5",
                None,
                "needs bf16 hardware: on this CPU `auto` is fp32, so the ratio is the fp32 one",
            )
        )
    if rounds[0]["sluice_fp32"] is not rounds[0]["sluice_auto"]:
        t.add(s1, "Sluice pipeline, fp32", per_round(lambda d: cps(d["sluice_fp32"])), digits=1)
    t.add(
        s1,
        "Sluice fp32 / raw limit fp32",
        per_round(lambda d: cps(d["sluice_fp32"]) / limit(d, "fp32")),
        unit="x",
        digits=2,
        target=">= 0.95",
        ok=lambda v: v >= 0.95,
        note=""
        if rounds[0]["sluice_fp32"] is not rounds[0]["sluice_auto"]
        else "the auto run (auto is fp32 here)",
    )
    t.add(
        s1,
        "Sluice fp32 / raw fp32, the model's own encode per batch (torch defaults)",
        per_round(lambda d: cps(d["sluice_fp32"]) / naive(d, "fp32")),
        unit="x",
        digits=2,
    )
    small = raw["corpus"].get("small")
    if "small" in rounds[0]:
        t.add(
            s1,
            f"small documents: raw limit {precision} on their chunks",
            per_round(lambda d: cps(d["small_limit"][f"raw_{precision}_packed"])),
            digits=1,
            note=f"{rounds[0]['small_limit']['chunks']} chunks of {small} PDFs of 1-3 pages",
        )
        t.add(
            s1,
            f"small documents: Sluice auto ({precision})",
            per_round(lambda d: cps(d["small"])),
            digits=1,
            note=f"{small} uploads in a row, one worker process, {SMALL_THREADS} threads (the "
            "Procfile's)",
        )
        t.add(
            s1,
            "small documents: Sluice auto / raw limit",
            per_round(lambda d: cps(d["small"]) / cps(d["small_limit"][f"raw_{precision}_packed"])),
            unit="x",
            digits=2,
            target=">= 0.85",
            ok=lambda v: v >= 0.85,
        )

    s2 = "2. Peer (chunks/s on the same corpus and model)"

    def peer_rows(name: str, key: str, rounds_of, note: str) -> None:
        """A peer's chunks/s in its fp32 and default setups, and Sluice's ratios to them."""
        for setup, label in (("fp32", "fp32 ("), ("default", "default setup (fp32, ")):
            batch = rounds[0][f"{key}_{setup}"]["batch"]
            t.add(
                s2,
                f"{name} {label}embed batch {batch})",
                rounds_of(lambda d, k=f"{key}_{setup}": cps(d[k])),
                digits=1,
                note=note if setup == "fp32" else "",
            )
        for ours, setup, target in (("fp32", "fp32", 1.25), ("auto", "default", 2.5)):
            t.add(
                s2,
                f"Sluice {ours} / {name} {'fp32' if setup == 'fp32' else 'default setup'}",
                rounds_of(lambda d, o=ours, k=f"{key}_{setup}": cps(d[f"sluice_{o}"]) / cps(d[k])),
                unit="x",
                digits=2,
                target=f">= {target}",
                ok=lambda v, x=target: v >= x,
            )

    t.add(
        s2,
        "plain script fp32 (parse, split, encode, add)",
        per_round(lambda d: cps(d["limits"]["plain_fp32"])),
        digits=1,
        note="the ceiling for a pipeline",
    )
    t.add(
        s2,
        "plain script / raw fp32",
        per_round(lambda d: cps(d["limits"]["plain_fp32"]) / limit(d, "fp32")),
        unit="x",
        digits=2,
    )
    no_peer = raw.get("peer_unavailable")
    if no_peer or "llama_fp32" not in rounds[0]:
        note = f"LlamaIndex not run: {no_peer}; compared with the plain script instead"
        t.add(
            s2,
            "Sluice fp32 / plain script fp32",
            per_round(lambda d: cps(d["sluice_fp32"]) / cps(d["limits"]["plain_fp32"])),
            unit="x",
            digits=2,
            note=note,
        )
        t.add(
            s2,
            "Sluice auto / plain script fp32",
            per_round(lambda d: cps(d["sluice_auto"]) / cps(d["limits"]["plain_fp32"])),
            unit="x",
            digits=2,
        )
    else:
        li32 = rounds[0]["llama_fp32"]
        peer_rows("LlamaIndex", "llama", per_round, f"{li32['chunks']} chunks (Sluice: {chunks})")
    hay32, haydef = rounds[0].get("haystack_fp32"), rounds[0].get("haystack_default")
    if hay32 and haydef:
        peer_rows(
            "Haystack",
            "haystack",
            lambda fn: [fn(d) for d in rounds[:1]],  # one round of Haystack (see measure)
            f"{hay32['chunks']} chunks (Sluice: {chunks}); haystack-ai {raw.get('haystack', '?')}, "
            "its documented indexing pipeline; the first round only",
        )
    elif raw.get("haystack_unavailable"):
        t.rows.append(_text_row(s2, "Haystack", "not run", "", None, raw["haystack_unavailable"]))
    systems = [
        ("Sluice auto", rounds[0]["sluice_auto"].get("ranks")),
        ("Sluice fp32", rounds[0]["sluice_fp32"].get("ranks")),
    ]
    if "llama_fp32" in rounds[0]:
        systems += [
            ("LlamaIndex fp32", rounds[0]["llama_fp32"].get("ranks")),
            ("LlamaIndex default", rounds[0]["llama_default"].get("ranks")),
        ]
    if hay32 and haydef:
        systems += [
            ("Haystack fp32", hay32.get("ranks")),
            ("Haystack documented setup", haydef.get("ranks")),
        ]
    best1 = max((recall_at(r, 1) for _, r in systems[2:] if r), default=0.0)
    best10 = max((recall_at(r, 10) for _, r in systems[2:] if r), default=0.0)
    for name, ranks in systems:
        if not ranks:
            continue
        r1, r10 = recall_at(ranks, 1), recall_at(ranks, 10)
        is_sluice = name.startswith("Sluice") and len(systems) > 2
        t.rows.append(
            _text_row(
                s2,
                f"recall@1 / recall@10, {name} ({len(ranks)} queries)",
                f"{r1:.3f} / {r10:.3f}",
                ">= peer" if is_sluice else "",
                (r1 >= best1 and r10 >= best10) if is_sluice else None,
            )
        )

    s3 = (
        "3. Orchestration (tiny .txt jobs, hash embedder, real queue, SQLite and Chroma; one "
        "worker process)"
    )
    orch = raw["orchestration"]
    t.add(
        s3,
        "Huey no-op tasks/s (same queue Redis, 2 threads)",
        [o["huey"]["tasks_per_s"] for o in orch],
        digits=0,
    )
    t.add(s3, "Huey ms per task", [o["huey"]["ms_per_task"] for o in orch], digits=2)
    for w in (2, 4):
        t.add(
            s3,
            f"Sluice jobs/s, {w} worker threads",
            [o[f"sluice_w{w}"]["jobs_per_s"] for o in orch],
            digits=1,
            target=">= 100",
            ok=lambda v: v >= 100,
        )
        t.add(
            s3,
            f"Sluice ms per job, {w} worker threads",
            [o[f"sluice_w{w}"]["ms_per_job"] for o in orch],
            digits=1,
        )

    s4 = "4. Dedupe and retry savings"
    dedupe = [d["sluice_auto"]["dedupe"] for d in rounds]
    t.add(
        s4,
        "re-upload of an indexed file, answer time",
        [m for d in dedupe for m in d["ms"]],
        unit=" ms",
        digits=1,
        target="< 50 ms",
        ok=lambda v: v < 50,
        note=f"{sum(len(d['ms']) for d in dedupe)} re-uploads of 10-page PDFs",
    )
    t.rows.append(
        _text_row(
            s4,
            "re-uploads: new jobs / chunks embedded / messages queued",
            f"{sum(d['new_jobs'] for d in dedupe)} / {sum(d['embedded'] for d in dedupe)} / "
            f"{sum(d['queued'] for d in dedupe)}",
            "0 / 0 / 0",
            all(d["new_jobs"] == d["embedded"] == d["queued"] == 0 for d in dedupe),
        )
    )
    crash = raw["crash"]
    c0 = crash[0]
    t.add(
        s4,
        "chunks re-embedded after a crash at 90%",
        [c["re_embedded"] for c in crash],
        digits=0,
        target=f"<= {BATCH}",
        ok=lambda v: v <= BATCH,
        note=f"{c0['chunks']} chunks in {c0['batches']} batches, worker killed after batch "
        f"{c0['crash_batch']} "
        f"({100 * min(c0['chunks'], c0['crash_batch'] * BATCH) / c0['chunks']:.0f}% embedded); "
        f"second attempt embedded {c0['second_embedded']}, {c0['second_cached']} from cache (hash "
        "embedder)",
    )

    for key, label in (("console_sqlite", "SQLite"), ("console_postgres", "PostgreSQL")):
        data = raw.get(key)
        if data is None:
            continue
        s5 = f"5. Console at {plan.console_jobs:,} jobs, {label} (ms, p50 / p95)"
        if "error" in data:
            t.rows.append(_text_row(s5, "not measured", data["error"], "", None))
            continue
        for name, q in data["queries"].items():
            jobs_page_or_overview = name.startswith("jobs page") or name == "overview"
            target = "p95 < 100" if jobs_page_or_overview and label == "SQLite" else ""
            t.rows.append(
                _text_row(
                    s5,
                    name,
                    f"{q['p50']:.1f} / {q['p95']:.1f}",
                    target,
                    (q["p95"] < 100) if target else None,
                    f"{q['n']} runs",
                )
            )

    s6 = "6. Memory (worker peak RSS, MB)"
    mem = raw["memory"]
    t.add(
        s6,
        "10-page PDF",
        [m["small"]["peak_mb"] for m in mem],
        digits=0,
        note=f"{mem[0]['small']['chunks']} chunks",
    )
    t.add(
        s6,
        f"{plan.big_pages:,}-page PDF",
        [m["big"]["peak_mb"] for m in mem],
        digits=0,
        note=f"{mem[0]['big']['chunks']} chunks",
    )
    t.add(
        s6,
        f"{plan.big_pages:,} pages / 10 pages",
        [m["big"]["peak_mb"] / m["small"]["peak_mb"] for m in mem],
        unit="x",
        digits=2,
        target="<= 1.3",
        ok=lambda v: v <= 1.3,
        note="hash embedder: no model weights in the baseline",
    )
    rss_auto = spread([d["sluice_auto"]["worker_peak_rss_mb"] for d in rounds])["median"]
    t.add(s6, "worker with the real model, whole corpus (auto)", rss_auto, digits=0)

    cold = raw.get("cold") or []
    if cold:
        s7 = "7. Cold start (seconds from the command to the first result)"
        t.add(
            s7,
            "`sluice serve worker` to the first chunk embedded (real model)",
            [c["worker"]["first_chunk_s"] for c in cold],
            unit=" s",
            digits=2,
            note="a job queued before the start; " + cold[0]["worker"]["note"],
        )
        t.add(
            s7,
            "  of which: the worker process ready (queue and model)",
            [c["worker"]["ready_s"] for c in cold],
            unit=" s",
            digits=2,
        )
        t.add(
            s7,
            "`sluice serve console` to its health endpoint answering",
            [c["console"]["health_s"] for c in cold],
            unit=" s",
            digits=2,
        )
        drawn = [c["console"]["drawn_s"] for c in cold if c["console"].get("drawn_s") is not None]
        t.add(
            s7,
            "`sluice serve console` to the first page drawn (Overview, in Chromium)",
            drawn or None,
            unit=" s",
            digits=2,
            note=cold[0]["console"].get("note", ""),
        )
    searched = raw.get("cold_search")
    if searched:
        load = searched["load"][0]
        t.add(
            "7. Cold start (seconds from the command to the first result)",
            "cold `sluice search` to its first hit (query encoder exported)",
            searched["seconds"],
            unit=" s",
            digits=2,
            target="<= 1.5",
            ok=lambda v: v <= 1.5,
            note=f"load average {load:.2f} at the end"
            + (" (not idle: 2 cores)" if load > 0.5 else ""),
        )

    corpus = raw["corpus"]
    samples = (
        ", plus the text PDFs of the shared sample set"
        if corpus["files"] > corpus["generated"]
        else ""
    )
    corpus_text = (
        f"{corpus['files']} PDFs ({corpus['generated']} generated reports of {corpus['pages']} "
        f"pages with {corpus['facts']} known-answer facts{samples}); {chunks:,} chunks in Sluice "
        "(800 characters, 100 overlap; raw limits encode the "
        f"same {raw_chunks:,}); all-MiniLM-L6-v2, batch {BATCH}; {plan.rounds} round(s)"
    )
    extra = []
    if no_peer:
        extra.append(f"Peer: not run ({no_peer}).")
    if raw.get("haystack_unavailable"):
        extra.append(f"Haystack: not run ({raw['haystack_unavailable']}).")
    return t, precision, corpus_text, extra


def _text_row(section, figure, value, target, met, note=""):
    from bench.report import Row

    return Row(section, figure, value, target, met, note)


if __name__ == "__main__":
    sys.exit(main())
