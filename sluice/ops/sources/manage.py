"""Sources as the front ends offer them (the console, the CLI, the API): the operator check, the
process's context and the queue, around ``syncing``. A refusal is an ``OperationError`` with a
stable code and status (a ``SourceError``, or ``ReadOnlyOperator``), whichever front end asked,
and leaves its audit row; what a change does writes its own (``syncing``, ``tombstones``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from sluice.errors import OperationError
from sluice.ops import audit_trail
from sluice.ops.access import Operator, require_operator
from sluice.ops.reads import ctx
from sluice.ops.sources import syncing
from sluice.ops.sources.plan import SyncResult
from sluice.ops.sources.syncing import RemovedSource, SourceView
from sluice.pipeline.queueing.publishing import publish

T = TypeVar("T")


def list_sources() -> list[SourceView]:
    return syncing.list_sources(ctx())


def get_source(name: str) -> SourceView:
    return syncing.get_source(ctx(), name)


def _audited(who: Operator, action: str, name: str | None, change: Callable[[], T]) -> T:
    """``change()``, its refusal recorded in the audit log."""
    try:
        return change()
    except OperationError as exc:
        audit_trail.refused(
            who, action, exc.message, target_kind="source", target_id=name, code=exc.code
        )
        raise


def add(who: Operator, **source: Any) -> SourceView:
    """``syncing.add_source`` (its ``name``, ``dataset``, ``folder`` or ``s3``, ``include``,
    ``exclude``, ``every``) by ``who``, an operator: the answer carries the first sync's plan,
    which waits for a confirmed sync."""

    def change() -> SourceView:
        require_operator(who, "add a source")
        return syncing.add_source(ctx(), who=who, preview=True, **source)

    return _audited(who, "source.add", source.get("name"), change)


def remove(who: Operator, name: str, *, keep_documents: bool = False) -> RemovedSource:
    def change() -> RemovedSource:
        require_operator(who, "remove a source")
        return syncing.remove_source(ctx(), name, keep_documents=keep_documents, who=who)

    return _audited(who, "source.remove", name, change)


def sync(who: Operator, name: str, *, preview: bool = False, confirm: bool = False) -> SyncResult:
    """Sync now (its jobs go on the queue), or only show what it would do (``preview``: read-only
    operators may look). ``confirm``: the guard's held removals go, and a new source's first sync
    runs."""

    def change() -> SyncResult:
        if not preview:
            require_operator(who, "sync a source")
        return syncing.sync(ctx(), name, who=who, preview=preview, confirm=confirm, publish=publish)

    return _audited(who, "source.sync", name, change)


def undo(who: Operator, name: str) -> str:
    def change() -> str:
        require_operator(who, "undo a source's removals")
        return syncing.undo(ctx(), name, who=who)

    return _audited(who, "source.undo", name, change)
