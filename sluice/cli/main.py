"""The ``sluice`` command: the console's operations, for scripts and shells.

    sluice ingest PATH... [--dataset NAME] [--wait]     upload files (folders recursively; --follow-links)
    sluice jobs [--dataset NAME] [--status S] [--json]  list jobs
    sluice show JOB_ID [--json]                          one job with its timeline
    sluice datasets [--create NAME] [--json]             datasets with document and chunk counts
    sluice search QUERY [--dataset NAME] [--k N]         best chunks
    sluice dead [--kind KIND] [--json]                   dead letters grouped by kind and reason
    sluice retry JOB_ID... | --dead [--kind KIND]        queue failed jobs again
    sluice cancel JOB_ID...                              cancel pending or running jobs
    sluice recover                                       one round of recovery (reaper, outbox)
    sluice reconcile [--repair] [--json] [--dataset NAME] audit the index (and repair it)
    sluice delete JOB_ID | doc:DOCUMENT_ID               delete a document, keep its history
    sluice reindex --all [--dataset NAME] [--dry-run]    rebuild with the current pipeline version
    sluice serve queue|cache|chroma|worker|console       run one of the Procfile's processes
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

SUPPORTED_SUFFIXES = {".pdf", ".txt", ".md", ".markdown"}


def _ctx():
    from sluice.pipeline.context import get_context

    return get_context()


def _publish():
    from sluice.pipeline.queue import publish

    return publish


def _print_json(data) -> None:
    print(json.dumps(data, indent=2, default=str))


def _expand(paths: Iterable[str], *, follow_links: bool = False) -> list[Path]:
    from sluice.ops.ingest import collect_files

    found = collect_files(list(paths), suffixes=SUPPORTED_SUFFIXES, follow_links=follow_links)
    for path, why in found.skipped:
        print(f"sluice: skipped {path}: {why}", file=sys.stderr)
    return found.files


# --- commands ------------------------------------------------------------------------------------


def cmd_ingest(args) -> int:
    from sluice.ops.ingest import ingest_path

    ctx = _ctx()
    files = _expand(args.paths, follow_links=args.follow_links)
    if not files:
        print("sluice: nothing to ingest", file=sys.stderr)
        return 2
    publish = _publish()
    results = []
    for path in files:
        r = ingest_path(ctx, path, dataset=args.dataset, actor=f"cli:{os.getenv('USER', 'unknown')}",
                        publish=publish)
        results.append(r)
        if not args.json:
            if r.accepted:
                print(f"{r.job_id}\t{r.filename}\t{r.message}")
            else:
                print(f"-\t{r.filename}\trefused: {r.message}. {r.fix_hint}")
    if args.json and not args.wait:
        _print_json([r.to_dict() for r in results])
    refused = any(not r.accepted for r in results)
    if not args.wait:
        return 1 if refused else 0
    ids = [r.job_id for r in results if r.accepted]
    ok = _wait(ctx, ids, timeout=args.timeout, quiet=args.json)
    if args.json:
        _print_json(_rows(ctx, ids))
    return 0 if ok and not refused else 1


def _rows(ctx, ids: Sequence[int]) -> list[dict]:
    from sqlmodel import Session

    from sluice.storage.models import Job
    from sluice.storage.queries import job_row

    with Session(ctx.engine) as session:
        return [job_row(session.get(Job, i)) for i in ids]


def _wait(ctx, ids: Sequence[int], *, timeout: float, quiet: bool) -> bool:
    from sluice.storage.models import JobStatus

    finals = {s.value for s in JobStatus.final()}
    deadline = time.monotonic() + timeout
    last: dict[int, str] = {}
    while True:
        rows = _rows(ctx, ids)
        for row in rows:
            line = f"{row['id']}\t{row['filename']}\t{row['status']}\t{row['progress']}"
            if row["error_message"] and row["status"] in ("failed", "retrying"):
                line += f"\t{row['error_kind']}: {row['error_message']}"
                if row["fix_hint"]:
                    line += f" ({row['fix_hint']})"
            if last.get(row["id"]) != line and not quiet:
                print(line, flush=True)
            last[row["id"]] = line
        if all(r["status"] in finals for r in rows):
            ok = all(r["status"] == "succeeded" for r in rows)
            if not quiet:
                n_ok = sum(r["status"] == "succeeded" for r in rows)
                print(f"{n_ok}/{len(rows)} succeeded", flush=True)
            return ok
        if time.monotonic() > deadline:
            if not quiet:
                print(f"sluice: gave up waiting after {timeout:.0f}s", file=sys.stderr)
            return False
        time.sleep(0.5)


def _dataset_id(session, name: str | None) -> int | None:
    from sluice.storage.queries import dataset_by_name

    if not name:
        return None
    ds = dataset_by_name(session=session, name=name)
    if ds is None:
        raise SystemExit(f"sluice: no dataset named {name!r} (see `sluice datasets`)")
    return ds.id


def cmd_jobs(args) -> int:
    from sqlmodel import Session

    from sluice.storage.queries import JobFilter, job_row, list_jobs

    ctx = _ctx()
    with Session(ctx.engine) as session:
        f = JobFilter(dataset_id=_dataset_id(session, args.dataset), statuses=args.status or [])
        jobs = list_jobs(session=session, f=f, page_size=args.limit)
        names = _dataset_names(session)
        rows = [{**job_row(j), "dataset": names.get(j.dataset_id, "")} for j in jobs]
    if args.json:
        _print_json(rows)
        return 0
    for r in rows:
        err = f"\t{r['error_kind']}: {r['error_message']}" if r["error_message"] else ""
        print(f"{r['id']}\t{r['dataset']}\t{r['filename']}\t{r['status']}\t{r['progress']}"
              f"\tattempt {r['attempt']}/{r['max_attempts']}{err}")
    return 0


def _dataset_names(session) -> dict[int, str]:
    from sluice.storage.queries import datasets

    return {d.id: d.name for d in datasets(session=session)}


def cmd_show(args) -> int:
    from sqlmodel import Session

    from sluice.storage.models import Job
    from sluice.storage.queries import job_events, job_row

    ctx = _ctx()
    with Session(ctx.engine) as session:
        job = session.get(Job, args.job_id)
        if job is None:
            print(f"sluice: no job {args.job_id}", file=sys.stderr)
            return 1
        row = {**job_row(job), "dataset": _dataset_names(session).get(job.dataset_id, ""),
               "error_detail": job.error_detail}
        events = [{"at": e.at.isoformat(), "kind": e.kind, "from": e.from_status, "to": e.to_status,
                   "stage": e.stage, "attempt": e.attempt, "actor": e.actor, "message": e.message, "data": e.data}
                  for e in job_events(session=session, job_id=job.id)]
    if args.json:
        _print_json({**row, "events": events})
        return 0
    for key in ("id", "dataset", "filename", "status", "progress", "attempt", "error_kind", "error_message",
                "fix_hint", "chunk_count", "pipeline_version"):
        print(f"{key:16} {row[key]}")
    print("events:")
    for e in events:
        print(f"  {e['at']}  {e['kind']:18} {e['actor']:20} {e['message']}")
    return 0


def cmd_datasets(args) -> int:
    from sqlmodel import Session

    from sluice.storage.db import ensure_dataset
    from sluice.storage.queries import dataset_summaries

    ctx = _ctx()
    with Session(ctx.engine) as session:
        if args.create:
            ensure_dataset(session=session, name=args.create)
        rows = dataset_summaries(session=session)
    if args.json:
        _print_json(rows)
        return 0
    for r in rows:
        print(f"{r['name']}\t{r['documents']} documents\t{r['chunks']} chunks")
    return 0


def cmd_search(args) -> int:
    from sluice.ops.search import UnknownDataset, search

    try:
        hits = search(_ctx(), query=args.query, dataset=args.dataset, k=args.k)
    except UnknownDataset as exc:
        print(f"sluice: {exc}", file=sys.stderr)
        return 1
    if args.json:
        _print_json([h.to_dict() for h in hits])
        return 0
    for h in hits:
        text = " ".join(h.text.split())
        print(f"{h.score:.3f}\t{h.filename}\tp.{h.page}\t{text[:160]}")
    return 0


def cmd_dead(args) -> int:
    from sqlmodel import Session

    from sluice.storage.queries import dead_letter_groups, dead_letters, job_row

    ctx = _ctx()
    with Session(ctx.engine) as session:
        ds = _dataset_id(session, args.dataset)
        groups = dead_letter_groups(session=session, dataset_id=ds)
        jobs = [job_row(j) for j in dead_letters(session=session, dataset_id=ds, kind=args.kind)]
    for g in groups:
        g["jobs"] = [j for j in jobs if (j["error_kind"] or "unknown") == g["kind"]
                     and (j["error_code"] or "unknown") == g["code"]]
        g["latest"] = g["latest"].isoformat() if g["latest"] else None
    if args.kind:
        groups = [g for g in groups if g["kind"] == args.kind]
    if args.json:
        _print_json(groups)
        return 0
    if not groups:
        print("no dead letters")
    for g in groups:
        print(f"{g['kind']} / {g['code']}: {g['count']} job(s). {g['fix_hint']}")
        for j in g["jobs"]:
            print(f"  {j['id']}\t{j['filename']}\t{j['error_message']}")
    return 0


def _report(results) -> int:
    for r in results:
        print(r.message, file=sys.stdout if r.ok else sys.stderr)
    return 0 if results and all(r.ok for r in results) else 1


def cmd_retry(args) -> int:
    from sqlmodel import Session

    from sluice.storage import jobs
    from sluice.storage.outbox import dispatch
    from sluice.storage.queries import dead_letter_ids

    ctx = _ctx()
    with Session(ctx.engine) as session:
        ids = list(args.job_ids)
        if args.dead:
            ids += dead_letter_ids(session=session, kind=args.kind, dataset_id=_dataset_id(session, args.dataset))
        if not ids:
            print("nothing to retry")
            return 0
        if args.dry_run:
            from sluice.ops.preview import preview_jobs

            _print_json(preview_jobs(ctx, ids).to_dict())
            return 0
        results = jobs.retry(session=session, job_ids=ids, actor=f"cli:{os.getenv('USER', 'unknown')}",
                             reason=args.reason)
    _try_dispatch(ctx, dispatch)
    return _report(results)


def _try_dispatch(ctx, dispatch) -> None:
    try:
        dispatch(engine=ctx.engine, publish=_publish())
    except Exception as exc:  # the worker's recovery publishes them later
        print(f"sluice: queue unreachable ({exc}); jobs are published when it is back", file=sys.stderr)


def cmd_cancel(args) -> int:
    from sqlmodel import Session

    from sluice.storage import jobs

    ctx = _ctx()
    with Session(ctx.engine) as session:
        results = jobs.request_cancel(session=session, job_ids=args.job_ids,
                                      actor=f"cli:{os.getenv('USER', 'unknown')}")
    return _report(results)


def cmd_recover(args) -> int:
    from sluice.pipeline.tasks import recover_once

    report = recover_once()
    _print_json({"reaped": report.reaped, "published": report.published, "republished": report.republished,
                 "publish_error": report.publish_error})
    return 0


def cmd_serve(args) -> int:
    from sluice.storage.files import private_dir
    from sluice.storage.servers import chroma_argv, redis_argv
    from sluice.storage.settings import get_settings

    s = get_settings()
    private_dir(s.data_dir)
    if args.what in ("queue", "cache"):
        url = s.queue_redis_url if args.what == "queue" else s.cache_redis_url
        argv = redis_argv(args.what, url=url, data_dir=s.data_dir)
    elif args.what == "chroma":
        from sluice.storage.chroma_gate import serve

        chroma_argv(url=s.chroma_url, path=s.chroma_dir)  # refuses an address beyond loopback
        return serve(s)
    elif args.what == "worker":
        exe = str(Path(sys.executable).with_name("huey_consumer"))
        argv = [exe, "sluice.pipeline.tasks.huey", "-k", args.kind, "-w", str(args.workers), "-d", "0.1"]
    else:  # console
        from sluice.ops.access import check_bind
        from sluice.ops.gate import allowed_hosts

        check_bind(s)
        app = Path(__file__).resolve().parent.parent / "console" / "app.py"
        argv = [sys.executable, "-m", "streamlit", "run", str(app), "--server.address", s.console_address,
                "--server.port", str(s.console_port), "--server.headless", "true",
                "--browser.gatherUsageStats", "false",
                "--server.maxUploadSize", str(max(1, s.max_upload_bytes // (1024 * 1024)))]
        argv += [arg for host in sorted(allowed_hosts(s)) for arg in ("--server.allowedHosts", host)]
    sys.stdout.flush()
    os.execv(argv[0], argv)
    return 0  # pragma: no cover


# --- integrity: reconcile, delete, reindex --all ------------------------------------------------------


def cmd_reconcile(args) -> int:
    from sluice.pipeline.reconcile import reconcile

    ctx = _ctx()
    report = reconcile(ctx, repair=args.repair, actor=f"cli:{os.getenv('USER', 'unknown')}",
                       dataset=args.dataset, publish=_publish_or_none())
    if args.json:
        _print_json(report.to_dict())
    else:
        print(report.describe())
    if report.errors:
        return 1
    return 0 if report.clean or args.repair else 1


def _publish_or_none():
    try:
        return _publish()
    except Exception:  # the queue settings are unusable here; the workers publish the outbox later
        return None


def cmd_delete(args) -> int:
    from sluice.ops.documents import delete_document

    result = delete_document(_ctx(), args.ref, actor=f"cli:{os.getenv('USER', 'unknown')}")
    if args.json:
        _print_json(result.to_dict())
    else:
        print(result.message, file=sys.stdout if result.ok else sys.stderr)
    return 0 if result.ok else 1


def cmd_reindex(args) -> int:
    from sluice.ops import reindex

    ctx = _ctx()
    if args.dry_run:
        plan = reindex.plan(ctx, dataset=args.dataset)
        if args.json:
            _print_json(plan.to_dict())
        else:
            print(plan.describe())
        return 0
    result = reindex.reindex_all(ctx, dataset=args.dataset, actor=f"cli:{os.getenv('USER', 'unknown')}",
                                 publish=_publish_or_none())
    if args.json:
        _print_json(result.to_dict())
    else:
        print(f"{result.queued} job(s) queued for pipeline {result.pipeline_version}"
              + (f", {result.underway} already under way" if result.underway else ""))
        for r in result.results:
            if not r.ok:
                print(r.message, file=sys.stderr)
        if result.queue_error:
            print(f"sluice: queue unreachable ({result.queue_error}); the workers publish the jobs later",
                  file=sys.stderr)
    return 0 if all(r.ok for r in result.results) else 1


def add_integrity_commands(sub) -> None:
    a = sub.add_parser("reconcile", help="audit the index against the job database (and repair it)")
    a.add_argument("--repair", action="store_true",
                   help="delete orphans, fix metadata, queue rebuilds of documents with missing chunks")
    a.add_argument("--dataset", help="only this dataset")
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=cmd_reconcile)

    a = sub.add_parser("delete", help="delete a document: its vectors, its blob if unshared, its jobs marked deleted")
    a.add_argument("ref", metavar="JOB_OR_DOCUMENT_ID",
                   help="a job id (17) deletes that job's document; doc:42 names the document itself")
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=cmd_delete)

    a = sub.add_parser("reindex", help="rebuild documents with the pipeline version the settings make now")
    a.add_argument("--all", action="store_true", required=True,
                   help="every document whose searchable job is of another pipeline version")
    a.add_argument("--dataset", help="only this dataset")
    a.add_argument("--dry-run", action="store_true", help="show documents, about how many chunks, cache hits")
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=cmd_reindex)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sluice", description="Durable document ingestion into a vector index.")
    sub = p.add_subparsers(dest="command", required=True)

    a = sub.add_parser("ingest", help="upload files or folders")
    a.add_argument("paths", nargs="+")
    a.add_argument("--dataset", default="default")
    a.add_argument("--wait", action="store_true", help="show progress; exit 0 only if every job succeeded")
    a.add_argument("--timeout", type=float, default=3600)
    a.add_argument("--json", action="store_true")
    a.add_argument("--follow-links", action="store_true",
                   help="in folders, also follow symbolic links that point outside them")
    a.set_defaults(func=cmd_ingest)

    a = sub.add_parser("jobs", help="list jobs")
    a.add_argument("--dataset")
    a.add_argument("--status", action="append", choices=[s for s in
                   ("pending", "running", "retrying", "succeeded", "failed", "cancelled", "superseded", "deleted")])
    a.add_argument("--limit", type=int, default=100)
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=cmd_jobs)

    a = sub.add_parser("show", help="one job with its timeline")
    a.add_argument("job_id", type=int)
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=cmd_show)

    a = sub.add_parser("datasets", help="datasets with document and chunk counts")
    a.add_argument("--create", metavar="NAME")
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=cmd_datasets)

    a = sub.add_parser("search", help="search one dataset")
    a.add_argument("query")
    a.add_argument("--dataset", default="default")
    a.add_argument("--k", type=int, default=5)
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=cmd_search)

    a = sub.add_parser("dead", help="dead letters grouped by kind and reason")
    a.add_argument("--kind", choices=["transient", "permanent", "user_action_required"])
    a.add_argument("--dataset")
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=cmd_dead)

    a = sub.add_parser("retry", help="queue failed or cancelled jobs again")
    a.add_argument("job_ids", nargs="*", type=int)
    a.add_argument("--dead", action="store_true", help="all dead letters (narrow with --kind, --dataset)")
    a.add_argument("--kind", choices=["transient", "permanent", "user_action_required"])
    a.add_argument("--dataset")
    a.add_argument("--reason", default="manual retry")
    a.add_argument("--dry-run", action="store_true", help="show what a retry would embed, change nothing")
    a.set_defaults(func=cmd_retry)

    a = sub.add_parser("cancel", help="cancel pending, retrying or running jobs")
    a.add_argument("job_ids", nargs="+", type=int)
    a.set_defaults(func=cmd_cancel)

    a = sub.add_parser("recover", help="run one round of recovery now")
    a.set_defaults(func=cmd_recover)

    a = sub.add_parser("serve", help="run one of the Procfile's processes")
    a.add_argument("what", choices=["queue", "cache", "chroma", "worker", "console"])
    a.add_argument("--workers", type=int, default=2)
    a.add_argument("--kind", choices=["thread", "process", "greenlet"], default="thread")
    a.set_defaults(func=cmd_serve)

    add_integrity_commands(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    import logging

    from sluice.storage.files import use_private_umask
    from sluice.storage.settings import SettingsError

    use_private_umask()  # also for the servers `sluice serve` execs: their files are private too
    logging.basicConfig(level=os.getenv("SLUICE_LOG_LEVEL", "WARNING"), format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except SettingsError as exc:
        print(f"sluice: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
