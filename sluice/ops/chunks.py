"""Chunks switched off and on: a switched-off chunk stays in both stores, shows as disabled in the
document view, and no search mode answers it (one row of ``disabled_chunk`` per chunk id)."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, select

from sluice.errors import OperationError
from sluice.pipeline.running.context import Context
from sluice.storage import lexical
from sluice.storage.models import DisabledChunk

log = logging.getLogger(__name__)


class UnknownChunk(OperationError):
    """No chunk has this id (in the datasets asked)."""

    code, status = "not_found", 404
    hint = "A document's chunks list their ids."


class AmbiguousChunk(OperationError):
    """The same chunk id is in several datasets (the same bytes uploaded to each): name one."""

    code, status = "ambiguous_chunk", 409
    hint = "Name the dataset: --dataset, or a key of that one dataset."


@dataclass
class ChunkState:
    chunk_id: str
    dataset_id: int
    document_id: int
    enabled: bool

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
