"""``sluice documents --external-id ID``: the live document the application calls ID (with its
version and whether a replacement is being built or failed); ``--delete`` deletes every version of
it still there."""

from __future__ import annotations

import sys

from sluice.cli.output import print_json, table
from sluice.ops import actions, reads, replacing
from sluice.ops.access import cli_operator
from sluice.ops.documents import document_info, find_by_external_id


def documents(args) -> int:
    try:
        external_id = replacing.check_external_id(args.external_id)
    except replacing.BadExternalId as err:
        print(f"sluice: {err}. {replacing.EXTERNAL_ID_RULE}", file=sys.stderr)
        return 2
    assert external_id is not None  # the parser requires it
    ctx = reads.ctx()
    if args.delete:
        who = cli_operator()
        done = replacing.delete_by_external_id(
            ctx,
            args.dataset,
            external_id,
            actor=who.actor,
            delete=lambda ref: actions.delete_document(who, ref),
        )
        if args.json:
            print_json(done.to_dict())
        else:
            print(done.message, file=sys.stdout if done.ok else sys.stderr)
        return 0 if done.ok else 1
    found = find_by_external_id(ctx, args.dataset, external_id)
    if found is None:
        if args.json:
            print_json([])
            return 1
        print(f"sluice: no document with external id {external_id!r} in {args.dataset!r}")
        return 1
    info = document_info(ctx, found)
    state = replacing.version_state(ctx, found)
    row = {
        "document_id": found,
        "dataset": info.dataset,
        "filename": info.filename,
        "external_id": external_id,
        "version": state.version,
        "active_job_id": info.active_job_id,
        "state": state.message,
    }
    if args.json:
        print_json([{**row, **state.to_dict()}])
    else:
        table([row], [(k, k.replace("_", " ")) for k in row], empty="")
    return 0
