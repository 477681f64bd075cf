"""``sluice datasets rename OLD NEW`` and ``sluice datasets delete NAME [--yes]``
(sluice.ops.dataset_admin); every other form of ``sluice datasets`` is in ``commands``."""

from __future__ import annotations

import sys

from sluice.cli.output import print_json

ADMIN = {"rename": 2, "delete": 1}  # the word after `datasets`, and how many names follow it


def datasets(args) -> int:
    """``sluice datasets [NAME]``, or the rename and delete forms."""
    if args.name in ADMIN and args.rest:
        if len(args.rest) != ADMIN[args.name]:
            usage = "OLD NEW" if args.name == "rename" else "NAME [--yes]"
            print(f"sluice: usage: sluice datasets {args.name} {usage}", file=sys.stderr)
            return 2
        return rename(args) if args.name == "rename" else delete(args)
    if args.rest:
        print(f"sluice: unexpected arguments: {' '.join(args.rest)}", file=sys.stderr)
        return 2
    from sluice.cli import commands

    return commands.datasets(args)


def _answer(result, as_json: bool) -> int:
    if as_json:
        print_json(result.to_dict())
    else:
        print(
            result.message if result.ok else f"sluice: {result.message}",
            file=sys.stdout if result.ok else sys.stderr,
        )
    return 0 if result.ok else 1


def rename(args) -> int:
    from sluice.ops import dataset_admin
    from sluice.ops.access import cli_operator
    from sluice.pipeline.running.context import get_context

    old, new = args.rest
    return _answer(dataset_admin.rename(get_context(), cli_operator(), old, new), args.json)


def delete(args) -> int:
    from sluice.ops import dataset_admin
    from sluice.ops.access import cli_operator
    from sluice.pipeline.running.context import get_context

    (name,) = args.rest
    ctx = get_context()
    if not args.yes:
        plan = dataset_admin.plan_delete(ctx, name)
        if plan is None:
            print(f"sluice: no dataset named {name!r}", file=sys.stderr)
            return 1
        if args.json:
            print_json(plan.to_dict())
        else:
            print(plan.describe())
            print("(nothing deleted; add --yes to delete the dataset)")
        return 0
    return _answer(dataset_admin.delete(ctx, cli_operator(), name), args.json)
