"""Sources as the front ends offer them (the console, the CLI, the API): the operator check, the
process's context and the queue, around ``syncing``. A refusal is an ``OperationError`` with a
stable code and status (a ``SourceError``, or ``ReadOnlyOperator``), whichever front end asked."""

from __future__ import annotations

from typing import Any

from sluice.ops.access import Operator, require_operator
from sluice.ops.reads import ctx
from sluice.ops.sources import syncing
from sluice.ops.sources.plan import SyncResult
from sluice.ops.sources.syncing import SourceView
from sluice.pipeline.queueing.publishing import publish


def list_sources() -> list[SourceView]:
    return syncing.list_sources(ctx())


def get_source(name: str) -> SourceView:
    return syncing.get_source(ctx(), name)


def add(who: Operator, **source: Any) -> SourceView:
    """``syncing.add_source`` (its ``name``, ``dataset``, ``folder`` or ``s3``, ``include``,
    ``exclude``, ``every``) by ``who``, an operator."""
    require_operator(who, "add a source")
    return syncing.add_source(ctx(), actor=who.actor, **source)


def remove(who: Operator, name: str, *, keep_documents: bool = False) -> str:
    require_operator(who, "remove a source")
    return syncing.remove_source(ctx(), name, keep_documents=keep_documents, actor=who.actor)


def sync(who: Operator, name: str, *, preview: bool = False, confirm: bool = False) -> SyncResult:
    """Sync now (its jobs go on the queue), or only show what it would do (``preview``: read-only
    operators may look)."""
    if not preview:
        require_operator(who, "sync a source")
    return syncing.sync(
        ctx(), name, actor=who.actor, preview=preview, confirm=confirm, publish=publish
    )


def undo(who: Operator, name: str) -> str:
    require_operator(who, "undo a source's removals")
    return syncing.undo(ctx(), name, actor=who.actor)
