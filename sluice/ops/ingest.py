"""Upload: check, store by hash, and write Document + Job + Outbox in one transaction.

Bad input is refused here, before anything is stored: over the size limit, or a type the bytes
show Sluice cannot read. The display name is sanitised; the blob's path comes from its hash.

The dataset is resolved once, at the start, and named by id from then on: a dataset renamed while
the bytes come in still gets them, and one deleted meanwhile refuses the upload; neither is made
again under the name it had. Only a name no dataset had at the start makes one, when the rows are
written.
"""

from __future__ import annotations

import io
import logging
import os
import re
import unicodedata
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import BinaryIO

from sqlmodel import Session, select

from sluice import faults
from sluice.errors import PipelineError, UserActionError, WaitingError
from sluice.ops import metadata as meta
from sluice.ops import replacing
from sluice.ops.documents import remove_blob_if_unused
from sluice.pipeline.parsing.formats import ZIP
from sluice.pipeline.parsing.parse import ParseLimits, archive_type, sniff_type
from sluice.pipeline.queueing.publishing import dispatch_now
from sluice.pipeline.running.context import Context, get_context
from sluice.storage import jobs
from sluice.storage.blobs import BlobTooLarge
from sluice.storage.db import ensure_dataset, refuse_if_deleting
from sluice.storage.models import Dataset, JobStatus

log = logging.getLogger(__name__)

SUPPORTED_SUFFIXES = {
    ".pdf",
    ".txt",
    ".md",
    ".markdown",
    ".docx",
    ".pptx",
    ".html",
    ".htm",
    ".xhtml",
    ".epub",
    ".csv",
    ".tsv",
}
SNIFF_BYTES = 8192
MAX_NAME = 200


@dataclass
class IngestResult:
    filename: str
    accepted: bool
    job_id: int | None = None
    document_id: int | None = None
    dataset: str = ""
    duplicate: bool = False
    status: str = ""
    published: bool = False
    error_kind: str | None = None
    error_code: str | None = None
    message: str = ""
    fix_hint: str = ""
    external_id: str | None = None
    version: int | None = None  # of the document under its external id (1, 2, ...)
    replaces_document_id: int | None = None  # the version this one replaces once it succeeds
    dataset_id: int | None = None  # the dataset it went into (or was resolved to), by id
    metadata_changed: bool = False  # the same bytes were there; this upload's metadata replaced

    def to_dict(self) -> dict:
        return asdict(self)


def sanitize_filename(name: str) -> str:
    """A display name safe to show: no directories, control or bidi-override characters."""
    name = name.replace("\\", "/").split("/")[-1]
    cleaned = "".join(
        ch if unicodedata.category(ch) not in ("Cc", "Cf", "Cs", "Co", "Zl", "Zp") else " "
        for ch in name
    )
    cleaned = " ".join(cleaned.split()).strip(" .")
    return cleaned[:MAX_NAME] or "unnamed"


@dataclass(frozen=True)
class _Target:
    """The dataset an upload writes into: its id once resolved (None: no dataset had the name, so
    the upload makes it), and its name as last read."""

    id: int | None
    name: str


def ingest_stream(
    ctx: Context,
    *,
    dataset: str = "",
    dataset_id: int | None = None,
    filename: str,
    stream: BinaryIO,
    actor: str = "system",
    publish: Callable[[int], None] | None = None,
    metadata: dict | None = None,
    external_id: str | None = None,
    declared_type: str = "",
    dispatch: Callable[[], object] | None = None,
) -> IngestResult:
    """Store the bytes and queue their job. ``metadata`` (sluice.ops.metadata) replaces the
    document's (None keeps it); new bytes under a known ``external_id`` are a new version;
    ``declared_type``: the media type the client gave (``text/...`` makes text-like bytes text).
    ``publish`` queues the job in this call; ``dispatch`` is told to instead (the API's thread).

    ``dataset_id`` names the dataset as the caller resolved it (``dataset`` is then only its name
    for the answer); without it ``dataset`` is resolved here, once."""
    s = ctx.settings
    display = sanitize_filename(filename)
    found = _resolve(ctx, dataset, dataset_id, display)
    if isinstance(found, IngestResult):
        return found
    dataset = found.name
    refused = _external_id_refusal(external_id, display, dataset)
    if refused is not None:
        return refused
    faults.hit("upload_resolved", dataset_id=found.id, dataset=dataset)
    try:
        clean = None if metadata is None else meta.validate(metadata)
    except meta.MetadataError as err:
        return _refused(display, dataset, UserActionError(err.code, str(err), err.hint))
    head = stream.read(SNIFF_BYTES)
    try:
        media_type = sniff_type(head, display, declared_type)
    except PipelineError as err:
        return _refused(display, dataset, err)
    try:
        got = ctx.blobs.receive(_Prepend(head, stream), max_bytes=s.max_upload_bytes)
    except BlobTooLarge:
        return IngestResult(
            display,
            False,
            dataset=dataset,
            error_kind="user_action_required",
            error_code="too_large",
            message="the file is larger than the upload limit of "
            f"{s.max_upload_bytes // (1024 * 1024)} MB",
            fix_hint="Split the file, or raise SLUICE_MAX_UPLOAD_BYTES.",
        )
    except WaitingError as err:  # the object store does not answer: nothing was stored
        return _refused(display, dataset, err)
    # got.held keeps the bytes for this upload: a delete of the same bytes cannot take them.
    key, size = got.key, got.size
    try:
        if media_type == ZIP:  # which archive it is, or a bomb, shows in its directory
            with ctx.blobs.local_copy(key) as path:
                media_type = archive_type(path, name=display, limits=ParseLimits.from_settings(s))
        made = _commit_upload(ctx, found, key, size, media_type, display, actor, external_id)
        document, job, created, dataset = made
    except PipelineError as err:  # refused archives are not kept (unless another document has them)
        ctx.blobs.release(got.held)
        remove_blob_if_unused(ctx, key)
        return _refused(display, dataset, err)
    except BaseException:
        ctx.blobs.release(got.held)
        raise
    changed = _replace_metadata(ctx, document, clean, actor, created)
    try:
        ctx.blobs.keep(key, got.held)
    except WaitingError as err:  # committed; only the upload's second name may be left over
        log.warning("upload of %s: the blob store did not confirm it (%s)", key[:12], err.message)
    result = _answer(ctx, dataset, display, document, job, created, publish, dispatch)
    if changed and not created:  # the same bytes again, under other metadata: say so
        result.metadata_changed = True
        result.message += "; its metadata was replaced by this upload's"
    return result


def _replace_metadata(
    ctx: Context, document, clean: dict | None, actor: str, created: bool
) -> bool:
    """Give the document the upload's metadata when it has other; whether it changed (an event
    says so, unless the document is new and this is its first)."""
    if clean is None or clean == (document.metadata_ or {}):
        return False
    document.metadata_ = meta.set_document_metadata(
        ctx, document.id, clean, actor=actor, event=not created
    )
    return True


DATASET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _.-]{0,63}$")
DATASET_NAME_RULE = (
    "A dataset name is 1 to 64 letters, digits, spaces, '.', '_' or '-', starting with a letter "
    "or digit."
)


def _resolve(
    ctx: Context, dataset: str, dataset_id: int | None, display: str
) -> _Target | IngestResult:
    """The upload's dataset, read once: by id (a dataset renamed since is still the one; one
    deleted, or being deleted, refuses the upload), else by name. A name no dataset has makes one
    when the rows are written, and follows the one rule for names (every front end: the console's
    Create, the CLI's --dataset, the API), so no name can carry Markdown or a code span onto a
    page; a dataset that already exists is taken as it is."""
    with Session(ctx.engine) as session:
        if dataset_id is not None:
            ds = session.get(Dataset, dataset_id)
        else:
            ds = session.exec(select(Dataset).where(Dataset.name == dataset)).first()
    if ds is not None:
        try:
            refuse_if_deleting(ds)
        except PipelineError as err:
            return _refused(display, ds.name, err)
        assert ds.id is not None
        return _Target(ds.id, ds.name)
    if dataset_id is not None:
        return _refused(display, dataset, _gone(dataset, dataset_id))
    if DATASET_NAME.match(dataset):
        return _Target(None, dataset)
    return IngestResult(
        display,
        False,
        dataset=dataset,
        error_kind="user_action_required",
        error_code="bad_dataset_name",
        message=f"{dataset!r} is not a dataset name",
        fix_hint=DATASET_NAME_RULE,
    )


def _gone(dataset: str, dataset_id: int) -> UserActionError:
    """The dataset the caller resolved was deleted before the upload's rows were written."""
    return UserActionError(
        "not_found",
        f"no dataset named {dataset!r}" if dataset else f"no dataset {dataset_id}",
        "The dataset was deleted: make it again (or choose another), then upload again.",
    )


def _refused(display: str, dataset: str, err: PipelineError) -> IngestResult:
    return IngestResult(
        display,
        False,
        dataset=dataset,
        error_kind=err.kind.value,
        error_code=err.code,
        message=err.message,
        fix_hint=err.hint,
    )


def _external_id_refusal(
    external_id: str | None, display: str, dataset: str
) -> IngestResult | None:
    try:
        replacing.check_external_id(external_id)
    except replacing.BadExternalId as err:
        return IngestResult(
            display,
            False,
            dataset=dataset,
            error_kind="user_action_required",
            error_code=err.code,
            message=str(err),
            fix_hint=err.hint,
        )
    return None


def _commit_upload(
    ctx: Context,
    target: _Target,
    key: str,
    size: int,
    media_type: str,
    display: str,
    actor: str,
    external_id: str | None = None,
):
    """Document + Job + Outbox in the dataset ``target`` names (by id once resolved; the name
    only when no dataset had it); also the dataset's name as this transaction read it."""
    s = ctx.settings
    with Session(ctx.engine, expire_on_commit=False) as session:
        if target.id is None:
            ds = ensure_dataset(session=session, name=target.name)
        else:
            # held (PostgreSQL: FOR SHARE) until the rows are in: a delete cannot remove it between
            found = session.get(Dataset, target.id, with_for_update={"read": True})
            if found is None:
                raise _gone(target.name, target.id)
            refuse_if_deleting(found)
            ds = found
        assert ds.id is not None
        document, job, created = jobs.create_upload(
            session=session,
            dataset_id=ds.id,
            sha256=key,
            size=size,
            media_type=media_type,
            filename=display,
            pipeline_version=ctx.version_for(ds),
            max_attempts=s.max_attempts,
            actor=actor,
            external_id=external_id,
        )
        return document, job, created, ds.name


def _answer(
    ctx: Context,
    dataset: str,
    display: str,
    document,
    job,
    created: bool,
    publish: Callable[[int], None] | None,
    dispatch: Callable[[], object] | None = None,
) -> IngestResult:
    result = IngestResult(
        display,
        True,
        job_id=job.id,
        document_id=document.id,
        dataset=dataset,
        duplicate=not created,
        status=job.status.value,
        external_id=document.external_id,
        version=document.doc_version,
        replaces_document_id=document.replaces_document_id,
        dataset_id=document.dataset_id,
    )
    if created and document.external_id is not None:
        replacing.remove_superseded(ctx, document.id)
    if not created:
        result.message = f"already uploaded as job {job.id} ({job.status.value}); not indexed again"
        if job.status == JobStatus.succeeded:
            result.message = f"already indexed as job {job.id}; not indexed again"
        return result
    result.message = f"queued as job {job.id}"
    if dispatch is not None:  # published by the caller's dispatcher, after this answer
        dispatch()
    elif publish is not None:
        sent, note = dispatch_now(ctx.engine, via=publish)
        # Another dispatcher (a worker's recovery loop) may have taken the row first and published
        # it.
        result.published = job.id in sent.sent or sent.error is None
        if note:
            result.message += f" ({note})"
    return result


def dispatch_queued() -> None:
    """Publish the outbox's due rows now, as an upload given ``publish`` does (the API's
    dispatcher thread calls this for the uploads it was told of)."""
    dispatch_now(get_context().engine)


@dataclass
class FileList:
    files: list[Path]
    skipped: list[tuple[Path, str]]  # (path, why)


def collect_files(
    paths: list[str | Path], *, suffixes: set[str], follow_links: bool = False
) -> FileList:
    """The files to ingest from files and folders (folders recursively, only ``suffixes``).

    A symbolic link in a folder is taken only when it points inside that folder: a link to a private
    file elsewhere would otherwise be indexed and served by search to whoever can search. With
    ``follow_links`` links are followed anywhere (each real folder is walked once). Files named
    directly are taken as named.
    """
    out = FileList([], [])
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            _walk(path, out, suffixes=suffixes, follow_links=follow_links)
        elif path.exists():
            out.files.append(path)
        else:
            out.skipped.append((path, "no such file or folder"))
    return out


def _walk(top: Path, out: FileList, *, suffixes: set[str], follow_links: bool) -> None:
    root = top.resolve()
    seen: set[Path] = set()
    for folder, dirs, files in os.walk(top, followlinks=follow_links):
        real = Path(folder).resolve()
        if real in seen:  # a link loop, or a folder reached twice through links
            dirs[:] = []
            continue
        seen.add(real)
        for name in sorted(dirs):
            entry = Path(folder) / name
            if entry.is_symlink() and not follow_links:
                inside = entry.resolve().is_relative_to(root)
                out.skipped.append(
                    (
                        entry,
                        "a link to a folder inside (already walked)"
                        if inside
                        else f"a link out of {top} (to follow it: --follow-links)",
                    )
                )
        dirs.sort()
        for name in sorted(files):
            entry = Path(folder) / name
            if entry.suffix.lower() not in suffixes:
                continue
            if entry.is_symlink() and not follow_links and not entry.resolve().is_relative_to(root):
                out.skipped.append((entry, f"a link out of {top} (to follow it: --follow-links)"))
                continue
            if entry.is_file():
                out.files.append(entry)


def ingest_path(
    ctx: Context,
    path: Path,
    *,
    dataset: str = "",
    dataset_id: int | None = None,
    actor: str = "cli",
    publish: Callable[[int], None] | None = None,
    metadata: dict | None = None,
    external_id: str | None = None,
) -> IngestResult:
    with open(path, "rb") as fh:
        return ingest_stream(
            ctx,
            dataset=dataset,
            dataset_id=dataset_id,
            filename=path.name,
            stream=fh,
            actor=actor,
            publish=publish,
            metadata=metadata,
            external_id=external_id,
        )


def ingest_bytes(
    ctx: Context,
    data: bytes,
    *,
    dataset: str = "",
    dataset_id: int | None = None,
    filename: str,
    actor: str = "system",
    publish: Callable[[int], None] | None = None,
    metadata: dict | None = None,
    external_id: str | None = None,
) -> IngestResult:
    return ingest_stream(
        ctx,
        dataset=dataset,
        dataset_id=dataset_id,
        filename=filename,
        stream=io.BytesIO(data),
        actor=actor,
        publish=publish,
        metadata=metadata,
        external_id=external_id,
    )


class _Prepend(io.RawIOBase):
    """A stream that yields ``head`` and then the rest of ``stream``."""

    def __init__(self, head: bytes, stream: BinaryIO) -> None:
        self.head = head
        self.stream = stream

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if self.head:
            out, self.head = (
                (self.head, b"") if n < 0 or n >= len(self.head) else (self.head[:n], self.head[n:])
            )
            return out
        return self.stream.read(n)
