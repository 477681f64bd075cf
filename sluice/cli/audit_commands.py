"""``sluice audit``: who changed what, newest first (the audit log, sluice.ops.audit_trail)."""

from __future__ import annotations

import sys

from sluice.cli.output import print_json, table


def show(args) -> int:
    from sluice.ops import audit_trail

    try:
        rows = audit_trail.rows(
            since=args.since,
            actor=args.actor,
            action=args.action,
            dataset=args.dataset,
            outcome=args.outcome,
            limit=args.limit,
        )
    except audit_trail.BadAuditQuery as exc:
        print(f"sluice: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print_json(rows)
        return 0
    for row in rows:
        row["who"] = f"{row['actor_kind']}:{row['actor_name']}" + (
            f" ({row['address']})" if row["address"] else ""
        )
        row["target"] = f"{row['target_kind']} {row['target_id'] or ''}".strip()
        row["result"] = row["outcome"] + (f": {row['reason']}" if row["outcome"] != "done" else "")
    table(
        rows,
        [
            ("at", "WHEN"),
            ("who", "WHO"),
            ("action", "ACTION"),
            ("target", "TARGET"),
            ("dataset", "DATASET"),
            ("result", "OUTCOME"),
        ],
        empty="no audit rows match",
    )
    return 0


def add_audit_commands(sub) -> None:
    p = sub.add_parser("audit", help="the audit log: who changed what, when, from where")
    p.add_argument("--since", help="a span back (2h, 30m, 7d) or an ISO time")
    p.add_argument("--actor", help="the actor's name (a console user, an OS user, a key)")
    p.add_argument("--action", help="an action (job.retry) or a family (job)")
    p.add_argument("--dataset")
    p.add_argument("--outcome", choices=["done", "refused"])
    p.add_argument("--limit", type=int, default=100, help="at most this many rows (up to 500)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=show)
