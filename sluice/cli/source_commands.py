"""``sluice sources add|list|remove|undo`` and ``sluice sync NAME [--preview] [--yes]``: folders
and S3 prefixes a dataset follows. ``add`` prints the first sync's plan; ``--yes`` runs it."""

from __future__ import annotations

import sys

from sluice.cli.output import listing, print_json
from sluice.errors import OperationError

# what ``sources add`` hands to sluice.ops.sources.syncing.add_source
ADD_OPTIONS = ("name", "dataset", "folder", "s3", "include", "exclude", "every")


def _fail(exc: OperationError) -> int:
    print(f"sluice: {exc.message}", file=sys.stderr)
    return 1


def add(args) -> int:
    from sluice.ops.access import cli_operator
    from sluice.ops.sources import manage

    try:
        view = manage.add(cli_operator(), **{k: getattr(args, k) for k in ADD_OPTIONS})
    except OperationError as exc:
        return _fail(exc)
    every = f", every {view.every_seconds}s" if view.every_seconds else ""
    print(f"source {view.name}: {view.kind} {view.location} -> dataset {view.dataset}{every}")
    plan = view.preview or {}
    if plan.get("message"):
        print(f"  its first sync: {plan['message']}")
    for failure in plan.get("failed", [])[:20]:
        print(f"  cannot read: {failure['path']}: {failure['error']}")
    print(
        f"  nothing is uploaded until you confirm it: sluice sync {view.name} --yes"
        + (" (the workers follow it from then on)" if view.every_seconds else "")
    )
    return 0


def list_(args) -> int:
    from sluice.ops.sources import manage

    views = manage.list_sources()
    return listing(
        [_row(v.to_dict()) for v in views],
        "name dataset where:SOURCE docs last:LAST_SYNC result next",
        empty="no sources (add one: sluice sources add NAME --dataset D --folder PATH)",
        as_json=args.json,
        json_rows=[v.to_dict() for v in views],
    )


def _row(v: dict) -> dict:
    run = v["last_run"] or {}
    return {
        **v,
        "where": f"{v['kind']} {v['location']}",
        "docs": v["documents"],
        "last": (run.get("finished_at") or run.get("started_at") or "never")[:19],
        "result": _counts(run) if run else "",
        "next": "after --yes" if not v["confirmed"] else (v["next_run_at"] or "when asked")[:19],
    }


def _counts(run: dict) -> str:
    text = (
        f"{run['status']}: +{run['added']} ~{run['changed']} -{run['removed']} "
        f"renamed {run['renamed']} failed {run['failed']}"
    )
    return text + (f" held {run['held']}" if run.get("held") else "")


def sync(args) -> int:
    from sluice.ops.access import cli_operator
    from sluice.ops.sources import manage

    try:
        result = manage.sync(cli_operator(), args.name, preview=args.preview, confirm=args.yes)
    except OperationError as exc:
        return _fail(exc)
    if args.json:
        print_json(result.to_dict())
    else:
        print(("preview: " if result.preview else "") + result.message)
        for failure in result.failed[:20]:
            print(f"  failed: {failure['path']}: {failure['error']}")
        if result.held_reason:
            print(f"  removals held: {result.held_reason}")
    if result.status == "busy":
        return 1
    return 3 if result.status in ("held", "failed", "unconfirmed") else 0


def remove(args) -> int:
    from sluice.ops.access import cli_operator
    from sluice.ops.sources import manage

    try:
        print(manage.remove(cli_operator(), args.name, keep_documents=args.keep_documents).message)
    except OperationError as exc:
        return _fail(exc)
    return 0


def undo(args) -> int:
    from sluice.ops.access import cli_operator
    from sluice.ops.sources import manage

    try:
        print(manage.undo(cli_operator(), args.name))
    except OperationError as exc:
        return _fail(exc)
    return 0


def add_source_commands(sub) -> None:
    p = sub.add_parser("sources", help="folders and S3 prefixes a dataset follows")
    s = p.add_subparsers(dest="sources_command", required=True)
    a = s.add_parser(
        "add",
        help="a folder or an s3://bucket/prefix that a dataset follows: shows the first sync's "
        "plan; nothing is uploaded until `sluice sync NAME --yes`",
    )
    a.add_argument("name")
    a.add_argument("--dataset", required=True)
    where = a.add_mutually_exclusive_group(required=True)
    where.add_argument("--folder", help="a folder on this host (workers on it follow its changes)")
    where.add_argument("--s3", help="s3://bucket/prefix (the endpoint of SLUICE_S3_ENDPOINT_URL)")
    a.add_argument("--include", action="append", default=[], help="only these globs (repeat)")
    a.add_argument("--exclude", action="append", default=[], help="never these globs (repeat)")
    a.add_argument("--every", help="sync by the workers this often (15m, 1h, 1d)")
    a.set_defaults(func=add)
    a = s.add_parser("list", help="each source with its last sync and the next one")
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=list_)
    a = s.add_parser(
        "remove",
        help="forget a source and delete the documents it made (those that were in the dataset "
        "before it are kept)",
    )
    a.add_argument("name")
    a.add_argument("--keep-documents", action="store_true", help="keep its documents")
    a.set_defaults(func=remove)
    a = s.add_parser("undo", help="bring back what its syncs removed (within the tombstone time)")
    a.add_argument("name")
    a.set_defaults(func=undo)
    a = sub.add_parser("sync", help="sync a source now: additions, changes, renames, removals")
    a.add_argument("name")
    a.add_argument("--preview", action="store_true", help="only show what it would do and cost")
    a.add_argument(
        "--yes",
        action="store_true",
        help="confirm a new source's first sync, and removals the guard holds back",
    )
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=sync)
