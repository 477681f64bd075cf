"""Sources as the front ends offer them (the console, the CLI, the API): the operator check, the
process's context and the queue, around ``sluice.ops.sources``. A refusal is a ``SourceError``
with a stable code, whichever front end asked."""

from __future__ import annotations

from sluice.ops import sources
from sluice.ops.access import Operator, ReadOnlyOperator, require_operator
from sluice.ops.reads import ctx
from sluice.ops.sources import SourceError, SourceView
from sluice.ops.sources_plan import SyncResult
from sluice.pipeline.queueing.publishing import publish


def _may(who: Operator, action: str) -> None:
    try:
        require_operator(who, action)
    except ReadOnlyOperator as exc:
        raise SourceError("read_only", str(exc)) from None


def list_sources() -> list[SourceView]:
    return sources.list_sources(ctx())


def get_source(name: str) -> SourceView:
    return sources.get_source(ctx(), name)


def add(
    who: Operator,
    *,
    name: str,
    dataset: str,
    folder: str | None = None,
    s3: str | None = None,
    include: list[str] | None = None,
    exclude: list[str] | None = None,
    every: str | None = None,
) -> SourceView:
    _may(who, "add a source")
    return sources.add_source(
        ctx(),
        name=name,
        dataset=dataset,
        folder=folder,
        s3=s3,
        include=include,
        exclude=exclude,
        every=every,
        actor=who.actor,
    )


def remove(who: Operator, name: str, *, keep_documents: bool = False) -> str:
    _may(who, "remove a source")
    return sources.remove_source(ctx(), name, keep_documents=keep_documents, actor=who.actor)


def sync(who: Operator, name: str, *, preview: bool = False, confirm: bool = False) -> SyncResult:
    """Sync now (its jobs go on the queue), or only show what it would do (``preview``: read-only
    operators may look)."""
    if not preview:
        _may(who, "sync a source")
    return sources.sync(
        ctx(), name, actor=who.actor, preview=preview, confirm=confirm, publish=publish
    )


def undo(who: Operator, name: str) -> str:
    _may(who, "undo a source's removals")
    return sources.undo(ctx(), name, actor=who.actor)
