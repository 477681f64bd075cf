"""The ``sluice`` command: the console's operations, for scripts and shells. Its reference,
``docs/cli.md``, is made from this parser (``python -m sluice.cli.manual``)."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from sluice.cli.audit_commands import add_audit_commands
from sluice.cli.blob_commands import add_blob_commands
from sluice.cli.key_commands import add_key_commands
from sluice.cli.scheduling import add_pause_commands, add_priority_commands
from sluice.cli.source_commands import add_source_commands
from sluice.servers import supervisor


class _Commands:
    """The command functions of a module that is imported only when one of them runs: building the
    parser imports no operation, so a cold ``sluice search`` pays only for what searching uses."""

    def __init__(self, module: str) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Callable[[argparse.Namespace], int | None]:
        def run(args: argparse.Namespace) -> int | None:
            return getattr(importlib.import_module(self._module), name)(args)

        run.__name__ = name
        return run


commands = _Commands("sluice.cli.commands")
search_command = _Commands("sluice.cli.search_command")
document_commands = _Commands("sluice.cli.document_commands")
metadata_commands = _Commands("sluice.cli.metadata_commands")
WHERE_HELP = (
    "a metadata filter (repeat: all must hold): KEY=V, KEY!=V, KEY>=V (>, <, <=; numbers and "
    "ISO dates), KEY~A,B (one of), KEY!~A,B (none of), KEY? (has it), KEY!? (lacks it), or a "
    'JSON filter such as {"$or": [{"lang": "de"}, {"year": 2024}]}'
)
META_HELP = "a metadata field (repeat): the value is read as JSON where it parses, else as text"
serve_commands = _Commands("sluice.cli.serve")
dataset_commands = _Commands("sluice.cli.dataset_commands")

STATUSES = [
    "pending",
    "running",
    "retrying",
    "succeeded",
    "failed",
    "cancelled",
    "superseded",
    "deleted",
]


def add_integrity_commands(sub) -> None:
    a = sub.add_parser("reconcile", help="audit the index against the job database (and repair it)")
    a.add_argument(
        "--repair",
        action="store_true",
        help="delete orphans, fix metadata, queue rebuilds of documents with missing chunks",
    )
    a.add_argument("--dataset", help="only this dataset")
    a.add_argument(
        "--changed",
        action="store_true",
        help="read only the chunks of jobs that changed since the last repairing pass (a full "
        "pass where a dataset has none)",
    )
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=commands.reconcile)

    a = sub.add_parser(
        "delete",
        help="delete a document: its vectors, its blob if unshared, its jobs marked deleted",
    )
    a.add_argument(
        "ref",
        metavar="JOB_OR_DOCUMENT_ID",
        help="a job id (17) deletes that job's document; doc:42 names the document itself",
    )
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=commands.delete)

    a = sub.add_parser(
        "reindex", help="rebuild documents with the pipeline version the settings make now"
    )
    a.add_argument(
        "--all",
        action="store_true",
        required=True,
        help="every document whose searchable job is of another pipeline version",
    )
    a.add_argument("--dataset", help="only this dataset")
    a.add_argument(
        "--dry-run", action="store_true", help="show documents, about how many chunks, cache hits"
    )
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=commands.reindex)


def add_ingest_commands(sub) -> None:
    """ingest: upload files and folders."""
    a = sub.add_parser("ingest", help="upload files or folders")
    a.add_argument("paths", nargs="+")
    a.add_argument("--dataset", default="default")
    a.add_argument(
        "--wait", action="store_true", help="show progress; exit 0 only if every job succeeded"
    )
    a.add_argument("--timeout", type=float, default=3600)
    a.add_argument("--json", action="store_true")
    a.add_argument(
        "--follow-links",
        action="store_true",
        help="in folders, also follow symbolic links that point outside them",
    )
    a.add_argument(
        "--external-id",
        help="your own id of the file (one file only): new bytes under it replace the live version",
    )
    a.add_argument("--meta", action="append", metavar="KEY=VALUE", help=META_HELP)
    a.set_defaults(func=commands.ingest)
    a = sub.add_parser(
        "documents",
        help="a document's metadata; documents a filter allows; the one your external id names",
    )
    a.add_argument("document_id", nargs="?", type=int, help="one document: its metadata")
    a.add_argument("--meta", action="append", metavar="KEY=VALUE", help=META_HELP + "; replaces")
    a.add_argument("--clear", action="store_true", help="remove the document's metadata")
    a.add_argument("--where", action="append", metavar="EXPR", help=WHERE_HELP)
    a.add_argument("--limit", type=int, default=100)
    a.add_argument("--external-id", help="your own id of the document")
    a.add_argument("--dataset", default="default")
    a.add_argument(
        "--delete", action="store_true", help="delete it: the live version and a replacement"
    )
    switch = a.add_mutually_exclusive_group()
    switch.add_argument(
        "--disable",
        action="store_true",
        help="switch the document off: its chunks kept, none answered by any search",
    )
    switch.add_argument("--enable", action="store_true", help="switch the document on again")
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=metadata_commands.documents)
    a = sub.add_parser(
        "chunks", help="switch a chunk off (kept, left out of search) or on; edit its text"
    )
    a.add_argument("action", choices=["disable", "enable", "edit"])
    a.add_argument("chunk_id")
    given = a.add_mutually_exclusive_group()
    given.add_argument("--text", help="edit: the chunk's new text (embedded and indexed again)")
    given.add_argument("--file", help="edit: read the chunk's new text from this file (- : stdin)")
    a.add_argument("--dataset", help="the dataset, when the chunk id is in several")
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=metadata_commands.chunks)


def _search_controls(a: argparse.ArgumentParser) -> None:
    """``sluice search``'s threshold, per-document cap and hybrid weight (the API's body fields)."""
    a.add_argument(
        "--min-score",
        type=float,
        metavar="S",
        help="only hits scoring at least S (0 to 1, the same scale in every mode; fewer than k "
        "may come)",
    )
    a.add_argument(
        "--max-per-document",
        type=int,
        metavar="N",
        dest="max_chunks_per_document",
        help="at most N hits of one document (the others' hits fill k)",
    )
    a.add_argument(
        "--dense-weight",
        type=float,
        metavar="W",
        help="hybrid: the dense ranker's share, 0 (the lexical order) to 1 (the dense order); "
        "default 0.5, both alike",
    )
    a.add_argument(
        "--rerank",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the reranker (SLUICE_RERANK_MODEL) rescores the best candidates; default: when one "
        "is set",
    )


def add_read_commands(sub) -> None:
    """Reading: jobs, one job, datasets (and their parse settings), search, dead letters."""
    a = sub.add_parser("jobs", help="list jobs")
    a.add_argument("--dataset")
    a.add_argument("--status", action="append", choices=STATUSES)
    a.add_argument("--where", action="append", metavar="EXPR", help=WHERE_HELP)
    a.add_argument("--limit", type=int, default=100)
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=commands.jobs)

    a = sub.add_parser("show", help="one job with its timeline")
    a.add_argument("job_id", type=int)
    a.add_argument(
        "--chunks", action="store_true", help="also the job's chunks in order, with pages"
    )
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=commands.show)

    a = sub.add_parser(
        "datasets", help="datasets with document and chunk counts; one dataset's parse settings"
    )
    a.add_argument(
        "name", nargs="?", help="one dataset: show (and with --set, change) its parse settings"
    )
    a.add_argument(
        "rest",
        nargs="*",
        metavar="...",
        help="rename OLD NEW: a new name (search, jobs and API keys go on working); "
        "delete NAME: the dataset and everything in it (--yes; without it, what would go)",
    )
    a.add_argument("--create", metavar="NAME")
    a.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="chunk_size, chunk_overlap, ocr_mode (auto|always|off) or ocr_language",
    )
    a.add_argument(
        "--unset", action="append", default=[], metavar="KEY", help="back to the SLUICE_* default"
    )
    a.add_argument(
        "--yes", action="store_true", help="apply the change (without: show what it would cost)"
    )
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=dataset_commands.datasets)

    a = sub.add_parser("search", help="search every dataset, or the one named (as the console)")
    a.add_argument("query")
    a.add_argument("--dataset", help="only this dataset (default: all, as the console searches)")
    a.add_argument("--k", type=int, default=5)
    a.add_argument(
        "--mode",
        choices=["hybrid", "dense", "lexical"],
        default="hybrid",
        help="hybrid fuses both rankings; lexical never loads the model",
    )
    a.add_argument("--file", help="only files whose name contains this")
    a.add_argument("--pages", help="only these pages: A-B, A-, -B or one page")
    a.add_argument("--media-type", help="only this media type, e.g. application/pdf")
    a.add_argument("--where", action="append", metavar="EXPR", help=WHERE_HELP)
    _search_controls(a)
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=search_command.search)

    a = sub.add_parser("dead", help="dead letters grouped by kind and reason")
    a.add_argument("--kind", choices=["transient", "permanent", "user_action_required"])
    a.add_argument("--dataset")
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=commands.dead)


def add_upkeep_commands(sub) -> None:
    """Upkeep of the jobs made: retry, bulk actions, prune, webhook deliveries, cancel, recover."""
    a = sub.add_parser("retry", help="queue failed or cancelled jobs again")
    a.add_argument("job_ids", nargs="*", type=int)
    a.add_argument(
        "--dead", action="store_true", help="all dead letters (narrow with --kind, --dataset)"
    )
    a.add_argument("--kind", choices=["transient", "permanent", "user_action_required"])
    a.add_argument("--dataset")
    a.add_argument("--reason", default="manual retry")
    a.add_argument(
        "--dry-run", action="store_true", help="show what a retry would embed, change nothing"
    )
    a.add_argument("--json", action="store_true")
    a.add_argument(
        "--password-stdin",
        action="store_true",
        help="a locked PDF's job: read its password from stdin (one line), unlock it, retry",
    )
    a.set_defaults(func=commands.retry)

    a = sub.add_parser("bulk", help="retry, cancel, reindex or delete every job a filter matches")
    a.add_argument("action", choices=["retry", "cancel", "reindex", "delete"])
    a.add_argument("--dataset")
    a.add_argument("--status", action="append", choices=STATUSES)
    a.add_argument(
        "--stage",
        action="append",
        choices=["queued", "parsing", "ocr", "chunking", "embedding", "indexing", "done"],
    )
    a.add_argument(
        "--kind", action="append", choices=["transient", "permanent", "user_action_required"]
    )
    a.add_argument("--name", help="file name contains this")
    a.add_argument(
        "--yes",
        action="store_true",
        help="do it; without it, only show what it would change and cost",
    )
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=commands.bulk)

    a = sub.add_parser(
        "prune", help="forget old history that retention allows (SLUICE_RETENTION_DAYS)"
    )
    a.add_argument("--dry-run", action="store_true", help="count what would go, remove nothing")
    a.add_argument(
        "--days", type=int, help="older than this many days (default: SLUICE_RETENTION_DAYS)"
    )
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=commands.prune)

    a = sub.add_parser(
        "webhooks", help="recent webhook deliveries per endpoint (SLUICE_WEBHOOK_URLS)"
    )
    a.add_argument("--endpoint", help="only the deliveries to this URL")
    a.add_argument("--limit", type=int, default=50)
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=commands.webhooks)

    a = sub.add_parser("cancel", help="cancel pending, retrying or running jobs")
    a.add_argument("job_ids", nargs="+", type=int)
    a.set_defaults(func=commands.cancel)

    a = sub.add_parser("recover", help="run one round of recovery now")
    a.set_defaults(func=commands.recover)


def add_serve_command(sub) -> None:
    """serve: one of the Procfile's processes."""
    a = sub.add_parser("serve", help="run one of the Procfile's processes")
    a.add_argument(
        "what", choices=["queue", "cache", "chroma", "worker", "console", "metrics", "api"]
    )
    a.add_argument(
        "--workers",
        type=int,
        default=4,
        help="worker threads (default 4: jobs share the model's lanes, one per core, so more jobs "
        "than cores keep the lanes busy between one job's writes and the next one's parse)",
    )
    a.add_argument("--kind", choices=["thread", "process", "greenlet"], default="thread")
    a.set_defaults(func=serve_commands.serve)
    u = sub.add_parser(
        "console-url", help="a one-time link that opens the console on this machine (no password)"
    )
    u.set_defaults(func=serve_commands.console_url)
    r = sub.add_parser(
        "run", help="every process of the Procfile; Ctrl-C stops them in order (exit 0)"
    )
    r.add_argument("--procfile", type=Path, default=Path("Procfile"))
    r.set_defaults(func=lambda args: supervisor.run(args.procfile))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sluice", description="Durable document ingestion into a vector index."
    )
    sub = p.add_subparsers(dest="command", required=True)
    add_ingest_commands(sub)
    add_read_commands(sub)
    add_upkeep_commands(sub)
    add_serve_command(sub)
    add_integrity_commands(sub)
    add_pause_commands(sub)
    add_priority_commands(sub)
    add_key_commands(sub)
    add_source_commands(sub)
    add_audit_commands(sub)
    add_blob_commands(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    # here, not at the top: building the parser (`sluice --help`) imports nothing beyond the CLI
    # (sluice.errors no longer imports the clients whose errors it classifies, see there)
    from sluice.errors import SettingsError
    from sluice.files import use_private_umask

    use_private_umask()  # also for the servers `sluice serve` execs: their files are private too
    logging.basicConfig(
        level=os.getenv("SLUICE_LOG_LEVEL", "WARNING"), format="%(levelname)s %(name)s: %(message)s"
    )
    args = build_parser().parse_args(argv)
    try:
        new_database = _new_database(args)
        code = int(args.func(args) or 0)
    except SettingsError as exc:
        print(f"sluice: {exc}", file=sys.stderr)
        return 2
    if new_database is not None and new_database.exists():
        print(_NEW_DATABASE.format(path=new_database), file=sys.stderr)
    return code


_NEW_DATABASE = (
    "sluice: made a new job database at {path}: no running Sluice uses it. The running system's "
    "configuration is in its .env (or the file SLUICE_ENV_FILE names): run this command in that "
    "folder, or name that file with SLUICE_ENV_FILE."
)


def _new_database(args: argparse.Namespace) -> Path | None:
    """The SQLite job database this command would make, when there is none yet: a command run
    with another configuration than the running system's would otherwise write to it silently."""
    if args.command in ("serve", "run"):
        return None  # a process of the system itself makes its database
    from sluice.settings import get_settings

    url = get_settings().resolved_database_url
    if not url.startswith("sqlite:///"):
        return None
    path = Path(url.removeprefix("sqlite:///"))
    return None if path.exists() else path


if __name__ == "__main__":
    sys.exit(main())
