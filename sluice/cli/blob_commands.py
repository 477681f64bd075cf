"""``sluice blobs migrate --to s3`` and ``sluice blobs sweep``: the blob store's commands."""

from __future__ import annotations

from sluice.cli.output import print_json

# The operations are imported by the commands that run them: building the parser imports nothing
# heavy (a cold `sluice search` pays only for what it uses).


def migrate(args) -> int:
    from sluice.ops import actions
    from sluice.ops.access import cli_operator

    result = actions.migrate_blobs(cli_operator(), keep_local=args.keep_local)
    if args.json:
        print_json(result.to_dict())
    else:
        print(result.describe())
    return 1 if result.failed else 0


def sweep(args) -> int:
    from sluice.ops.access import cli_operator
    from sluice.ops.blob_migration import sweep_leftovers
    from sluice.ops.reads import ctx

    swept = sweep_leftovers(ctx(), cli_operator(), older_than_seconds=args.older_than)
    if args.json:
        print_json({"store": swept.store, "removed": swept.removed, **vars(swept)})
    else:
        print(swept.describe())
    return 0


def add_blob_commands(sub) -> None:
    blobs = sub.add_parser("blobs", help="the blob store (uploaded files)")
    inner = blobs.add_subparsers(dest="blobs_command", required=True)
    a = inner.add_parser(
        "migrate",
        help="move $SLUICE_DATA_DIR/blobs into the object store (SLUICE_S3_*); run again to resume",
    )
    a.add_argument("--to", choices=["s3"], required=True, help="the backend to move to")
    a.add_argument(
        "--keep-local", action="store_true", help="copy only; leave the local files in place"
    )
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=migrate)
    w = inner.add_parser(
        "sweep",
        help="remove what dead uploads left in the object store's tmp/ (older than the bound)",
    )
    w.add_argument(
        "--older-than",
        type=float,
        default=24 * 3600,
        metavar="SECONDS",
        help="leave anything younger alone: an upload may still be running (default: a day)",
    )
    w.add_argument("--json", action="store_true")
    w.set_defaults(func=sweep)
