"""``sluice keys create|list|revoke``: the HTTP API's keys. A new key's token is printed once, on
stdout alone (for ``$(...)``); only its hash is kept."""

from __future__ import annotations

import sys
from dataclasses import asdict

from sluice.cli.output import listing, print_json

# sluice.ops.keys.SCOPES, written here so that building the parser imports no operation (a test
# checks that the two agree)
SCOPES = ("read", "ingest", "manage")


def create(args) -> int:
    from sluice.ops import keys
    from sluice.ops.access import cli_operator

    if bool(args.dataset) == bool(args.all_datasets):
        print(
            "sluice: name the key's datasets (--dataset D ...) or give it --all-datasets",
            file=sys.stderr,
        )
        return 2
    try:
        view, token = keys.create_key(
            cli_operator(),
            args.name,
            datasets=None if args.all_datasets else list(args.dataset),
            scope=args.scope,
        )
    except keys.KeyRefused as exc:
        print(f"sluice: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print_json({**asdict(view), "token": token})
    else:
        print(token)
    where = "every dataset" if view.datasets == ["*"] else ", ".join(view.datasets)
    print(
        f"key {view.name!r} ({view.scope}, {where}); the token above is shown only now",
        file=sys.stderr,
    )
    return 0


def list_(args) -> int:
    from sluice.ops import keys

    views = [asdict(v) for v in keys.list_keys()]
    return listing(
        [{**v, "datasets": ", ".join(v["datasets"])} for v in views],
        "name scope datasets created_at:CREATED last_used_at:LAST_USED revoked_at:REVOKED",
        empty="no API keys (make one: sluice keys create NAME --dataset D --scope read)",
        as_json=args.json,
        json_rows=views,
    )


def revoke(args) -> int:
    from sluice.ops import keys
    from sluice.ops.access import cli_operator

    ok, message = keys.revoke_key(cli_operator(), args.name)
    print(message if ok else f"sluice: {message}", file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


def add_key_commands(sub) -> None:
    p = sub.add_parser("keys", help="keys of the HTTP API: create, list, revoke")
    keys_sub = p.add_subparsers(dest="keys_command", required=True)
    a = keys_sub.add_parser("create", help="make a key; its token is printed once")
    a.add_argument("name")
    a.add_argument("--dataset", action="append", default=[], help="a dataset it reaches (repeat)")
    a.add_argument("--all-datasets", action="store_true", help="every dataset, also later ones")
    a.add_argument("--scope", choices=list(SCOPES), default="read")
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=create)
    a = keys_sub.add_parser(
        "list",
        help="keys with their scope, datasets and last use (written at most once a minute per key)",
    )
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=list_)
    a = keys_sub.add_parser("revoke", help="revoke a key: its requests answer 401 from now on")
    a.add_argument("name")
    a.set_defaults(func=revoke)
