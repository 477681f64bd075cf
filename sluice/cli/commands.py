"""The commands of ``sluice``: each parses nothing and decides nothing, it calls ``sluice.ops`` and
prints.

Every command acts as ``cli_operator()`` (the OS user, shown as ``cli:NAME`` in job events) through
the same functions as the console, so both front ends refuse, queue and word things the same way.
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Sequence
from typing import Any

from sluice.cli.metadata_commands import parse_meta, parse_where
from sluice.cli.output import plain, print_json, report, table
from sluice.ops import actions, reads
from sluice.ops.access import cli_operator
from sluice.ops.ingest import SUPPORTED_SUFFIXES, collect_files
from sluice.ops.metadata import CLI_RULE, FilterError, MetadataError
from sluice.storage.models import JobStatus
from sluice.storage.queries import JobFilter

FINAL = {s.value for s in JobStatus.final()}


def _fail(message: str, code: int = 1) -> int:
    print(f"sluice: {message}", file=sys.stderr)
    return code


def _dataset_id(name: str | None) -> int | None:
    try:
        return reads.dataset_id(name)
    except reads.UnknownDatasetName as exc:
        raise SystemExit(f"sluice: {exc}") from None


# --- uploads --------------------------------------------------------------------------------------


def ingest(args) -> int:
    found = collect_files(
        list(args.paths), suffixes=SUPPORTED_SUFFIXES, follow_links=args.follow_links
    )
    for path, why in found.skipped:
        print(f"sluice: skipped {path}: {why}", file=sys.stderr)
    files = found.files
    if not files:
        return _fail("nothing to ingest", 2)
    if args.external_id is not None and len(files) > 1:
        return _fail(f"--external-id names one file; {len(files)} were given", 2)
    try:
        metadata = parse_meta(args.meta)
    except MetadataError as err:
        return _fail(str(err), 2)
    who = cli_operator()
    results = []
    dataset_id = None  # the dataset the first upload resolved: a rename meanwhile makes no other
    for path in files:
        r = actions.upload_path(
            who,
            path,
            dataset=args.dataset,
            dataset_id=dataset_id,
            external_id=args.external_id,
            metadata=metadata,
        )
        dataset_id = dataset_id or r.dataset_id
        results.append(r)
        if not args.json:
            if r.accepted:
                print(f"{r.job_id}\t{r.filename}\t{r.message}")
            else:
                print(f"-\t{r.filename}\trefused: {r.message}. {r.fix_hint}")
    refused = any(not r.accepted for r in results)
    if not args.wait:
        if args.json:
            print_json([r.to_dict() for r in results])
        return 1 if refused else 0
    ids = [r.job_id for r in results if r.accepted and r.job_id is not None]
    ok = _wait(ids, timeout=args.timeout, quiet=args.json)
    if args.json:
        print_json(reads.job_rows(ids))
    return 0 if ok and not refused else 1


def _wait(ids: Sequence[int], *, timeout: float, quiet: bool) -> bool:
    """Follow the jobs until all are final. On a terminal: one live line with totals and an
    estimate; piped: a line per change of a job, for logs. Failures are printed as they happen in
    both."""
    live = sys.stdout.isatty() and not quiet
    started = time.monotonic()
    deadline = started + timeout
    last: dict[int, str] = {}
    while True:
        rows = reads.job_rows(list(ids))
        for row in rows:
            line = f"{row['id']}\t{row['filename']}\t{row['status']}\t{row['progress']}"
            if row["error_message"] and row["status"] in ("failed", "retrying"):
                line += f"\t{row['error_kind']}: {row['error_message']}"
                if row["fix_hint"]:
                    line += f" ({row['fix_hint']})"
            if last.get(row["id"]) != line and not quiet:
                if not live:
                    print(line, flush=True)
                elif row["status"] == "failed":
                    print(f"\r\033[K{line}", flush=True)
            last[row["id"]] = line
        finished = all(r["status"] in FINAL for r in rows)
        if live:
            print(
                f"\r\033[K{_totals(rows, time.monotonic() - started)}",
                end="" if not finished else "\n",
                flush=True,
            )
        if finished:
            if not quiet:
                n_ok = sum(r["status"] == "succeeded" for r in rows)
                print(f"{n_ok}/{len(rows)} succeeded", flush=True)
            return all(r["status"] == "succeeded" for r in rows)
        if time.monotonic() > deadline:
            if not quiet:
                print(f"\nsluice: gave up waiting after {timeout:.0f}s", file=sys.stderr)
            return False
        time.sleep(0.5)


def _totals(rows: list[dict], elapsed: float) -> str:
    """12/40 done (11 succeeded, 1 failed), 3 running: embedding 320/500 chunks; about 1.2 min
    left"""
    done = [r for r in rows if r["status"] in FINAL]
    failed = sum(r["status"] == "failed" for r in done)
    running = [r for r in rows if r["status"] == "running"]
    width = 24
    filled = int(width * len(done) / max(1, len(rows)))
    text = (
        f"[{'#' * filled}{'.' * (width - filled)}] {len(done)}/{len(rows)} done "
        f"({len(done) - failed} succeeded, {failed} failed)"
    )
    if running:
        text += f", {len(running)} running: {running[0]['progress']}"
    if done and len(done) < len(rows):
        text += f"; about {elapsed / len(done) * (len(rows) - len(done)):.0f} s left"
    return text


# --- reads ----------------------------------------------------------------------------------------


def jobs(args) -> int:
    f = JobFilter(dataset_id=_dataset_id(args.dataset), statuses=args.status or [])
    try:
        where = parse_where(args.where)
    except FilterError as err:
        return _fail(f"{err} ({CLI_RULE})", 2)
    if where:
        f.document_ids = reads.documents_matching(f.dataset_id, where)
    rows = reads.jobs_page(f, sort="created", descending=True, page=1, page_size=args.limit).rows
    if args.json:
        print_json(rows)
        return 0
    for r in rows:
        r["attempts"] = f"{r['attempt']}/{r['max_attempts']}"
        r["error"] = f"{r['error_kind']}: {r['error_message']}" if r["error_message"] else ""
    table(
        rows,
        [
            ("id", "ID"),
            ("dataset", "DATASET"),
            ("filename", "FILE"),
            ("status", "STATUS"),
            ("progress", "PROGRESS"),
            ("attempts", "ATTEMPTS"),
            ("error", "ERROR"),
        ],
        empty="no jobs" + (f" in dataset {args.dataset!r}" if args.dataset else ""),
    )
    return 0


def show(args) -> int:
    detail = reads.job_detail(args.job_id)
    if detail is None:
        return _fail(f"no job {args.job_id}")
    from sluice.ops.replacing import job_version

    version = job_version(reads.ctx(), args.job_id)
    row = {
        **detail.row,
        "dataset": detail.dataset,
        "error_detail": detail.error_detail,
        "version": version.to_dict() if version is not None else None,
    }
    events = [{**e, "at": e["at"].isoformat()} for e in detail.events]
    chunks: list[dict[str, Any]] | None = None
    if getattr(args, "chunks", False):
        from sluice.ops.document_view import job_chunks

        chunks = [
            {"position": c.position, "page": c.page, "chunk_id": c.chunk_id, "text": c.text}
            for c in job_chunks(reads.ctx(), args.job_id)
        ]
    if args.json:
        print_json({**row, "events": events, **({"chunks": chunks} if chunks is not None else {})})
        return 0
    for key in (
        "id",
        "dataset",
        "filename",
        "status",
        "progress",
        "attempt",
        "error_kind",
        "error_message",
        "fix_hint",
        "chunk_count",
        "pipeline_version",
    ):
        print(f"{key:16} {plain(row[key])}")
    print(f"{'search':16} {plain(version.message if version is not None else None)}")
    print("events:")
    table(
        events,
        [("at", "AT"), ("kind", "EVENT"), ("actor", "BY"), ("message", "MESSAGE")],
        empty="  none",
    )
    if chunks is not None:
        print("chunks:")
        table(
            [{**c, "text": " ".join(c["text"].split())[:120]} for c in chunks],
            [("position", "#"), ("page", "PAGE"), ("text", "TEXT")],
            empty="  none in the index",
        )
    return 0


def datasets(args) -> int:
    if args.create:
        ok, message = actions.create_dataset(cli_operator(), args.create)
        if not ok:
            return _fail(message)
    if args.name:
        return dataset_settings(args)
    if args.set or args.unset or args.yes:
        return _fail("name the dataset: sluice datasets NAME --set KEY=VALUE")
    rows = reads.dataset_summaries()
    if args.json:
        print_json(rows)
        return 0
    table(
        rows,
        [("name", "DATASET"), ("documents", "DOCUMENTS"), ("chunks", "CHUNKS")],
        empty="no datasets",
    )
    return 0


def dataset_settings(args) -> int:
    from sluice.ops.settings_changes import UnknownDataset

    assignments: dict[str, str | None] = {key.strip(): None for key in args.unset}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            return _fail(f"--set {item!r}: write KEY=VALUE, e.g. --set chunk_size=400")
        assignments[key.strip()] = value
    if not assignments:
        try:
            view = actions.dataset_settings(args.name)
        except UnknownDataset as exc:
            return _fail(str(exc))
        if args.json:
            print_json(view.to_dict())
            return 0
        table(
            [
                {
                    **r.to_dict(),
                    "source": "this dataset" if r.source == "dataset" else "default (SLUICE_*)",
                }
                for r in view.rows
            ],
            [
                ("key", "SETTING"),
                ("value", "VALUE"),
                ("source", "FROM"),
                ("description", "MEANING"),
            ],
            empty="",
        )
        print(
            f"pipeline {view.pipeline_version}"
            + (
                f"; changed by {view.changed_by} at {view.changed_at:%Y-%m-%d %H:%M} UTC"
                if view.changed_at
                else ""
            )
            + (
                f"; {view.to_rebuild} document(s) still on another version (sluice reindex --all "
                f"--dataset {shlex.quote(args.name)})"
                if view.to_rebuild
                else ""
            )
        )
        return 0
    change = (
        actions.set_dataset_settings(cli_operator(), args.name, assignments)
        if args.yes
        else actions.preview_dataset_settings(args.name, assignments)
    )
    if args.json:
        print_json(change.to_dict())
        return 0 if change.ok else 1
    if not change.ok:
        return _fail(change.message)
    print(change.message)
    if not args.yes:
        print("(nothing changed; add --yes to save the settings and reindex this dataset)")
    return 0


def dead(args) -> int:
    ds = _dataset_id(args.dataset)
    groups = [g for g in reads.dead_letter_groups(ds) if not args.kind or g["kind"] == args.kind]
    for g in groups:
        g["jobs"] = reads.dead_letters_in_group(g["kind"], g["code"], ds)
    if args.json:
        print_json(groups)
        return 0
    if not groups:
        print("no dead letters")
    for g in groups:
        print(f"{g['kind']} / {g['code']}: {g['count']} job(s). {g['fix_hint']}")
        for j in g["jobs"]:
            print(f"  {j['id']}\t{j['filename']}\t{j['error_message']}")
    return 0


def webhooks(args) -> int:
    log = reads.webhook_log(endpoint=args.endpoint, limit=args.limit, full=True)
    if args.json:
        print_json(log)
        return 0
    if not log["endpoints"]:
        print("no webhook endpoints (SLUICE_WEBHOOK_URLS is empty) and no deliveries")
        return 0
    for e in log["endpoints"]:
        note = "" if e["configured"] else " (no longer configured)"
        print(
            plain(
                f"{e['endpoint']}{note}: {e['delivered']} delivered, {e['waiting']} waiting, "
                f"{e['gave_up']} given up; last delivered {e['last_delivered_at'] or 'never'}"
            )
        )
    for d in log["deliveries"]:
        when = d["delivered_at"] or f"next try {d['next_attempt_at']}"
        print(
            plain(
                f"  {d['id']}\t{d['event']}\tjob {d['job_id']}\t{d['state']}\t{d['attempts']} "
                f"attempt(s)\t{when}\t{d['endpoint']}\t{d['last_error'] or ''}"
            )
        )
    return 0


# --- actions --------------------------------------------------------------------------------------


def retry(args) -> int:
    ids = list(args.job_ids)
    if args.password_stdin:
        if len(ids) != 1 or args.dead or args.dry_run:
            print("sluice: --password-stdin takes exactly one job id", file=sys.stderr)
            return 2
        if sys.stdin.isatty():  # typed at a terminal: not echoed
            import getpass

            password = getpass.getpass("Password of the PDF: ")
        else:
            password = sys.stdin.readline().rstrip("\r\n")
        done = actions.retry_with_password(cli_operator(), ids[0], password)
        del password
        return report(done.results, note=done.queue_note)
    if args.dead:
        ids += reads.dead_letter_ids(args.kind, None, _dataset_id(args.dataset))
    if not ids:
        print("nothing to retry")
        return 0
    if args.dry_run:
        cost = reads.retry_cost(ids)
        if args.json:
            print_json(cost.to_dict())
        else:
            print(cost.describe())
        return 0
    done = actions.retry(cli_operator(), ids, reason=args.reason)
    for warning in done.warnings:
        print(f"sluice: warning: {warning}", file=sys.stderr)
    return report(done.results, note=done.queue_note)


def cancel(args) -> int:
    done = actions.cancel(cli_operator(), args.job_ids)
    return report(done.results)


def recover(args) -> int:
    from sluice.ops.dataset_admin import finish_deletions
    from sluice.ops.sources.follow import follow_round
    from sluice.pipeline.queueing.tasks import recover_once

    result = recover_once(rounds=(follow_round,))
    finished = finish_deletions(reads.ctx())  # dataset deletes that stopped halfway
    print_json(
        {
            "reaped": result.reaped,
            "published": result.published,
            "republished": result.republished,
            "publish_error": result.publish_error,
            "reap_waited_seconds": round(result.reap_waited_seconds, 1),
            "datasets_deleted": sum(r.ok for r in finished),
            "datasets_still_deleting": [r.message for r in finished if not r.ok],
        }
    )
    return 0


def reconcile(args) -> int:
    result = actions.reconcile(
        cli_operator(), repair=args.repair, dataset=args.dataset, changed_only=args.changed
    )
    if args.json:
        print_json(result.to_dict())
    else:
        print(result.describe())
    if result.errors:
        return 1
    return 0 if result.clean or args.repair else 1


def delete(args) -> int:
    result = actions.delete_document(cli_operator(), args.ref)
    if args.json:
        print_json(result.to_dict())
    else:
        print(result.message, file=sys.stdout if result.ok else sys.stderr)
    return 0 if result.ok else 1


def reindex(args) -> int:
    if args.dry_run:
        plan = reads.reindex_plan(args.dataset)
        changes = reads.reindex_changes(args.dataset) if plan.documents else None
        if args.json:
            print_json({**plan.to_dict(), "changes": changes.to_dict() if changes else None})
        else:
            print(plan.describe())
            if changes is not None:  # what the rebuilt chunks look like, on a sample
                print(f"what changes: {changes.describe()}")
                for change in changes.sampled:
                    print(f"  {change.describe()}")
        return 0
    result = actions.reindex_all(cli_operator(), dataset=args.dataset)
    if args.json:
        print_json(result.to_dict())
    else:
        if result.queued:
            print(
                f"{result.queued} job(s) queued for pipeline {result.pipeline_version}"
                + (f", {result.underway} already under way" if result.underway else "")
            )
        for r in result.results:
            if not r.ok:
                print(r.message, file=sys.stderr)
        if result.queue_error:
            print(f"sluice: {result.queue_note}", file=sys.stderr)
    return 0 if all(r.ok for r in result.results) else 1


def bulk(args) -> int:
    f = JobFilter(
        dataset_id=_dataset_id(args.dataset),
        statuses=args.status or [],
        stages=args.stage or [],
        error_kinds=args.kind or [],
        name_contains=args.name or "",
    )
    plan = reads.bulk_preview(args.action, f, with_cost=not args.yes)
    if args.json and not args.yes:
        print_json(
            {
                "action": plan.action,
                "matching": plan.matching,
                "job_ids": plan.job_ids,
                "documents": plan.documents,
                "cost": plan.cost,
            }
        )
        return 0
    if not args.yes:
        print(plan.describe())
        print("(nothing changed; add --yes to do it)")
        return 0
    done = actions.bulk(cli_operator(), args.action, f)
    for warning in done.warnings[:5]:
        print(f"sluice: warning: {warning}", file=sys.stderr)
    return report(done.results, note=done.queue_note)


def prune(args) -> int:
    days = args.days if args.days is not None else None
    if days is None and reads.ctx().settings.retention_days == 0:
        print("retention is off (SLUICE_RETENTION_DAYS=0); give --days N to prune anyway")
        return 0
    result = actions.prune(cli_operator(), dry_run=args.dry_run, days=days)
    if args.json:
        print_json(result.to_dict())
    else:
        print(result.describe())
    return 0
