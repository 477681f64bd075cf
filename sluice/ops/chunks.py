"""Chunks switched off and on, and their text edited by hand. A switched-off chunk stays in both
stores, shows as disabled in the document view, and no search mode answers it (one row of
``disabled_chunk`` per chunk id). An edited chunk is embedded again and indexed under its id; the
edit is kept by the text the pipeline made (sluice.storage.chunk_edits), so a reindex or a retry
that makes that text again writes the edit instead."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, select

from sluice import faults
from sluice.errors import OperationError, VectorStoreUnavailable
from sluice.pipeline.running import embed
from sluice.pipeline.running.context import Context
from sluice.storage import chunk_edits, lexical
from sluice.storage.db import stored
from sluice.storage.models import Dataset, DisabledChunk, Document
from sluice.storage.vectors import read_failure

log = logging.getLogger(__name__)
MAX_CHUNK_TEXT = chunk_edits.MAX_TEXT  # characters an edited chunk may hold


class UnknownChunk(OperationError):
    """No chunk has this id (in the datasets asked)."""

    code, status = "not_found", 404
    hint = "A document's chunks list their ids."


class AmbiguousChunk(OperationError):
    """The same chunk id is in several datasets (the same bytes uploaded to each): name one."""

    code, status = "ambiguous_chunk", 409
    hint = "Name the dataset: --dataset, or a key of that one dataset."


class BadChunkText(OperationError):
    """An edit's text that cannot be a chunk: empty, too long, or not storable text."""

    code, status = "invalid_chunk_text", 422
    hint = f"A chunk's text is 1 to {chunk_edits.MAX_TEXT:,} characters of text."


class EditConflict(OperationError):
    """Newer edits of the same chunk kept landing while this one was written."""

    code, status = "edit_conflict", 409
    hint = "Read the chunk again and send your edit once more: the newest edit is the one kept."


@dataclass
class ChunkState:
    chunk_id: str
    dataset_id: int
    document_id: int
    enabled: bool
    text: str | None = None  # with an edit: the text the chunk now has
    edited: bool | None = None  # with an edit: whether the text differs from the pipeline's

    def to_dict(self) -> dict:
        return asdict(self)


def locate(ctx: Context, chunk_id: str, dataset_ids: list[int] | None = None) -> tuple[int, int]:
    """(dataset id, document id) of a chunk id, among ``dataset_ids`` (None: every dataset)."""
    places = {
        (ds, doc)
        for ds, doc, _ in lexical.chunk_places(ctx.engine, chunk_id)
        if dataset_ids is None or ds in dataset_ids
    }
    if not places:
        raise UnknownChunk(f"no chunk {chunk_id!r}")
    if len({ds for ds, _ in places}) > 1:
        raise AmbiguousChunk(f"chunk {chunk_id!r} is in several datasets: name the dataset")
    return min(places)


def set_chunk_enabled(
    ctx: Context,
    chunk_id: str,
    enabled: bool,
    *,
    actor: str = "system",
    dataset_ids: list[int] | None = None,
) -> ChunkState:
    """Switch a chunk on or off (doing it twice is the same as once)."""
    dataset_id, document_id = locate(ctx, chunk_id, dataset_ids)
    with Session(ctx.engine) as session:
        row = session.exec(
            select(DisabledChunk).where(
                DisabledChunk.dataset_id == dataset_id, DisabledChunk.chunk_id == chunk_id
            )
        ).first()
        if enabled and row is not None:
            session.delete(row)
        elif not enabled and row is None:
            session.add(
                DisabledChunk(
                    dataset_id=dataset_id,
                    chunk_id=chunk_id,
                    document_id=document_id,
                    disabled_by=actor[:120],
                )
            )
        try:
            session.commit()
        except IntegrityError:  # switched off at the same moment by someone else: so it is
            session.rollback()
    log.info("chunk %s %s by %s", chunk_id, "enabled" if enabled else "disabled", actor)
    return ChunkState(chunk_id, dataset_id, document_id, enabled)


EDIT_WRITE_ROUNDS = 5  # writes of an edit into the serving chunks while newer edits keep landing


def check_text(value: str) -> str:
    """An edit's text as stored (BadChunkText when it cannot be one)."""
    if not isinstance(value, str) or not value.strip():
        raise BadChunkText("the chunk's text is empty")
    if len(value) > chunk_edits.MAX_TEXT:
        raise BadChunkText(
            f"the chunk's text is {len(value):,} characters; at most {chunk_edits.MAX_TEXT:,}"
        )
    if "\x00" in value:
        raise BadChunkText("the chunk's text holds a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadChunkText("the chunk's text holds a lone surrogate, which is not text") from None
    return value


def edit_chunk(
    ctx: Context,
    chunk_id: str,
    new_text: str,
    *,
    actor: str = "system",
    dataset_ids: list[int] | None = None,
) -> ChunkState:
    """Give a chunk new text: recorded against the text the pipeline made, then embedded and
    written under the serving job's ids (both stores). An edit back to the pipeline's text undoes
    the edit. A job building the document meanwhile applies it before it may serve."""
    new_text = check_text(new_text)
    dataset_id, document_id = locate(ctx, chunk_id, dataset_ids)
    with Session(ctx.engine) as session:
        collection = stored(session, Dataset, dataset_id).collection
    with _vector_store("read"):
        got = ctx.vectors.get(collection, [chunk_id], include=["metadatas", "documents"])
    if not got.get("ids"):
        raise UnknownChunk(f"no chunk {chunk_id!r}")
    meta = (got.get("metadatas") or [{}])[0] or {}
    sha = meta.get("source_sha") or chunk_edits.source_sha((got.get("documents") or [""])[0])
    with Session(ctx.engine) as session:
        chunk_edits.record(
            session,
            dataset_id=dataset_id,
            document_id=document_id,
            sha=sha,
            text=new_text,
            actor=actor,
        )
        session.commit()
    faults.hit("after_chunk_edit_recorded", chunk_id=chunk_id)
    with _vector_store("write"):  # the edit is recorded: the next job of the document writes it
        written = _write_serving(ctx, collection, dataset_id, document_id, sha)
    log.info("chunk %s edited by %s (%d chunk(s) rewritten)", chunk_id, actor, written)
    with Session(ctx.engine) as session:
        row = session.exec(
            select(DisabledChunk.id).where(
                DisabledChunk.dataset_id == dataset_id, DisabledChunk.chunk_id == chunk_id
            )
        ).first()
    return ChunkState(
        chunk_id,
        dataset_id,
        document_id,
        row is None,
        text=new_text,
        edited=chunk_edits.source_sha(new_text) != sha,
    )


def _write_serving(ctx: Context, collection: str, dataset_id: int, document_id: int, sha: str):
    """Write the newest edit of ``sha`` into the chunks the document serves now, and look again
    until the stores hold the newest one: edits of two people racing end with the later one. The
    number of chunks written."""
    written = 0
    for _ in range(EDIT_WRITE_ROUNDS):
        with Session(ctx.engine) as session:
            document = stored(session, Document, document_id)
            serving = document.active_job_id
            edits = chunk_edits.current(session, document_id)
        if serving is None:  # nothing serves yet: the job that will applies the edit
            return written
        wanted = edits.texts.get(sha)  # None: the pipeline's own text is back
        stale = []
        for page in ctx.vectors.iter_pages(
            collection, where={"job_id": serving}, include=["metadatas", "documents"]
        ):
            for cid, m, doc in zip(page["ids"], page["metadatas"], page["documents"], strict=True):
                m = m or {}
                source = m.get("source_sha") or chunk_edits.source_sha(doc or "")
                if source != sha:
                    continue
                target = sha if wanted is None else chunk_edits.source_sha(wanted)
                if chunk_edits.source_sha(doc or "") != target or bool(m.get("source_sha")) != (
                    wanted is not None
                ):
                    stale.append((cid, m))
        if not stale:
            return written
        text = wanted if wanted is not None else _source_text(ctx, document_id, sha)
        if text is None:  # the pipeline's text is not at hand: a reindex writes it
            return written
        _rewrite(ctx, collection, dataset_id, serving, stale, text, sha, wanted is not None)
        written += len(stale)
    raise EditConflict(
        f"the chunks of document {document_id} kept being edited while this edit was written"
    )


@contextmanager
def _vector_store(doing: str) -> Iterator[None]:
    """A failure on the way to the vector store is VectorStoreUnavailable (503, Retry-After)."""
    try:
        yield
    except Exception as exc:
        why = read_failure(exc)
        if why is None:
            raise
        log.warning("chunk edit: the vector store failed to %s (%s): %r", doing, why, exc)
        kept = " (the edit is recorded: a reindex of the document writes it)" * (doing == "write")
        raise VectorStoreUnavailable(
            f"the vector store did not answer the edit's {doing} ({why}){kept}"
        ) from exc


def _source_text(ctx: Context, document_id: int, sha: str) -> str | None:
    """The pipeline's own text of ``sha``: an edit back to it recorded it as its text."""
    with Session(ctx.engine) as session:
        for edit in chunk_edits.history(session, document_id, sha):
            if chunk_edits.source_sha(edit["text"]) == sha:
                return str(edit["text"])
    return None


def _rewrite(
    ctx: Context,
    collection: str,
    dataset_id: int,
    job_id: int,
    stale: list[tuple[str, dict]],
    text: str,
    sha: str,
    edited: bool,
) -> None:
    """``stale`` chunks of ``job_id`` with ``text``: a vector made (or taken from the cache),
    each store written under the same ids."""
    import numpy as np

    vector = ctx.cache.get_many([text], dataset_id=dataset_id)[0]
    if vector is None:
        made = embed.submit(ctx.embedder, [text]).result()
        ctx.cache.put_many([text], made, dataset_id=dataset_id)
        vector = made[0]
    ids = [cid for cid, _ in stale]
    metadatas = []
    for _, m in stale:
        m = {k: v for k, v in m.items() if k not in ("source_sha", "edited")}
        metadatas.append({**m, "source_sha": sha, "edited": True} if edited else m)

    ctx.vectors.delete(collection, ids=ids)
    ctx.vectors.add(
        collection,
        ids=ids,
        embeddings=np.asarray([vector] * len(ids), dtype=np.float32),
        documents=[text] * len(ids),
        metadatas=metadatas,
    )
    lexical.set_texts(ctx.engine, dataset_id, job_id, {cid: text for cid in ids})
