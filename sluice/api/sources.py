"""Sources for an API key: a manage key, within its datasets (``sluice.api.scoped``'s rules),
around the front ends' calls of ``sluice.ops.sources.manage``."""

from __future__ import annotations

from typing import Any

from sqlmodel import Session

from sluice.api.scoped import Missing, require
from sluice.ops.keys import ApiPrincipal
from sluice.ops.reads import ctx
from sluice.ops.sources.listing import parse_s3
from sluice.ops.sources.manage import add, get_source, list_sources, remove, sync
from sluice.ops.sources.plan import SyncResult
from sluice.ops.sources.syncing import (
    RemovedSource,
    SourceError,
    SourceExists,
    SourceView,
    UnknownSource,
)
from sluice.settings import get_settings
from sluice.storage.queries import dataset_by_name


def _dataset_id(name: str) -> int | None:
    with Session(ctx().engine) as session:
        ds = dataset_by_name(session=session, name=name)
        return ds.id if ds is not None else None


def _reached(key: ApiPrincipal, view: SourceView) -> SourceView:
    if not key.reaches(_dataset_id(view.dataset)):
        raise Missing(
            f"no source named {view.name!r} (sluice sources list)"
        )  # a missing one's words
    return view


def key_sources(key: ApiPrincipal) -> list[SourceView]:
    require(key, "manage", "listing sources")
    return [v for v in list_sources() if key.reaches(_dataset_id(v.dataset))]


def key_source(key: ApiPrincipal, name: str) -> SourceView:
    require(key, "manage", "reading a source")
    try:
        return _reached(key, get_source(name))
    except UnknownSource as exc:
        raise Missing(exc.message) from None


def key_add(key: ApiPrincipal, *, name: str, dataset: str, **where: Any) -> SourceView:
    """An S3 source only: a folder is a path on the server's host, added there (``sluice sources
    add``), never by a client (it would index whatever the server may read). The answer is the
    source, ``confirmed`` false, with the plan of its first sync (``preview``): nothing is
    uploaded until a sync with ``confirm``."""
    require(key, "manage", "adding a source")
    if where.get("folder") is not None:
        raise SourceError(
            "folder sources are added on their host",
            code="folder_not_from_api",
            hint="Add it on its host: sluice sources add NAME --dataset D --folder PATH.",
        )
    if where.get("s3") is not None and not s3_allowed(str(where["s3"])):
        raise SourceError(
            "S3 sources may be added from the API only where SLUICE_API_SOURCE_S3_ALLOWED allows",
            code="source_location_refused",
            hint="Ask the operator to list the bucket (or bucket/prefix/) in "
            "SLUICE_API_SOURCE_S3_ALLOWED, or add the source on the host: sluice sources add.",
        )
    ds_id = _dataset_id(dataset)
    if ds_id is None and not key.all_datasets:
        raise Missing(f"no dataset named {dataset!r}")
    if ds_id is not None and not key.reaches(ds_id):
        raise Missing(f"no dataset named {dataset!r}")
    try:
        return add(key.operator, name=name, dataset=dataset, **where)
    except SourceExists:  # the same words whether the key can see the source or not
        raise SourceExists(f"the name {name!r} cannot be used: choose another") from None


def s3_allowed(location: str) -> bool:
    """Whether ``s3://bucket/prefix/`` lies within an entry of SLUICE_API_SOURCE_S3_ALLOWED (a
    bucket, or a bucket/prefix/); never the blob store's bucket."""
    try:
        bucket, prefix = parse_s3(location)
    except ValueError:
        return True  # add_source refuses it with its own words
    s = get_settings()
    if s.blob_store == "s3" and bucket == s.s3_bucket:
        return False
    for entry in s.api_source_s3_allowed:
        allowed_bucket, _, allowed_prefix = entry.strip().removeprefix("s3://").partition("/")
        if bucket == allowed_bucket and (prefix or "").startswith(allowed_prefix):
            return True
    return False


def key_remove(key: ApiPrincipal, name: str, *, keep_documents: bool = False) -> RemovedSource:
    """Remove a source of the key's datasets (409 ``sync_running`` while a change of it runs)."""
    key_source(key, name)
    return remove(key.operator, name, keep_documents=keep_documents)


def key_sync(key: ApiPrincipal, name: str, *, preview: bool, confirm: bool) -> SyncResult:
    """Sync (or preview) a source of the key's datasets; a new source's first sync runs only
    with ``confirm``."""
    key_source(key, name)
    return sync(key.operator, name, preview=preview, confirm=confirm)
