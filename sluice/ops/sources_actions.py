"""Sources as the front ends offer them (the console, the CLI, the API): the operator check, the
process's context and the queue, around ``sluice.ops.sources``. A refusal is a ``SourceError``
with a stable code, whichever front end asked."""

from __future__ import annotations

from typing import Any

from sluice.ops import sources
from sluice.ops.access import Operator, ReadOnlyOperator, require_operator
from sluice.ops.keys import ApiPrincipal
from sluice.ops.reads import ctx
from sluice.ops.scoped import Missing, require
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


def add(who: Operator, **source: Any) -> SourceView:
    """``sources.add_source`` (its ``name``, ``dataset``, ``folder`` or ``s3``, ``include``,
    ``exclude``, ``every``) by ``who``, an operator."""
    _may(who, "add a source")
    return sources.add_source(ctx(), actor=who.actor, **source)


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


# -- for an API key: a manage key, within its datasets (sluice.ops.scoped's rules) ---------------


def _dataset_id(name: str) -> int | None:
    from sqlmodel import Session

    from sluice.storage.queries import dataset_by_name

    with Session(ctx().engine) as session:
        ds = dataset_by_name(session=session, name=name)
        return ds.id if ds is not None else None


def _reached(key: ApiPrincipal, view: SourceView) -> SourceView:
    if not key.reaches(_dataset_id(view.dataset)):
        raise Missing(f"no source named {view.name!r}")
    return view


def key_sources(key: ApiPrincipal) -> list[SourceView]:
    require(key, "manage", "listing sources")
    return [v for v in list_sources() if key.reaches(_dataset_id(v.dataset))]


def key_source(key: ApiPrincipal, name: str) -> SourceView:
    require(key, "manage", "reading a source")
    try:
        return _reached(key, get_source(name))
    except SourceError as exc:
        raise Missing(exc.message) from None


def key_add(key: ApiPrincipal, *, name: str, dataset: str, **where: Any) -> SourceView:
    """An S3 source only: a folder is a path on the server's host, added there (``sluice sources
    add``), never by a client (it would index whatever the server may read)."""
    require(key, "manage", "adding a source")
    if where.get("folder") is not None:
        raise SourceError("folder_not_from_api", "folder sources are added on their host")
    ds_id = _dataset_id(dataset)
    if ds_id is None and not key.all_datasets:
        raise Missing(f"no dataset named {dataset!r}")
    if ds_id is not None and not key.reaches(ds_id):
        raise Missing(f"no dataset named {dataset!r}")
    return add(key.operator, name=name, dataset=dataset, **where)


def key_remove(key: ApiPrincipal, name: str, *, keep_documents: bool = False) -> str:
    key_source(key, name)
    return remove(key.operator, name, keep_documents=keep_documents)


def key_sync(key: ApiPrincipal, name: str, *, preview: bool, confirm: bool) -> SyncResult:
    key_source(key, name)
    return sync(key.operator, name, preview=preview, confirm=confirm)
