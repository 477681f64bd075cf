"""Documents switched off and on: a switched-off document keeps its chunks in both stores, shows as
disabled in the document view, and no search mode answers any of its chunks.

The switch is the document row's ``disabled_at``: one UPDATE, read by search in the statement that
reads the document's active job, so a search answers all of a document's chunks or none. It belongs
to the document, not to a job: a reindex (a new job of the same document) and a re-upload of the
same bytes (the same document) keep it, and a new version by external id takes it over from the
version it replaces in the transaction that makes it serve (sluice.storage.replacements).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

from sqlalchemy import update
from sqlmodel import Session, col

from sluice import faults
from sluice.ops.metadata import UnknownDocument
from sluice.pipeline.running.context import Context
from sluice.storage.clock import db_now
from sluice.storage.db import matched
from sluice.storage.models import Document

log = logging.getLogger(__name__)

MAX_FOLLOWS = 8  # versions replaced while a switch was on its way (each one a success meanwhile)


@dataclass
class DocumentState:
    document_id: int
    dataset_id: int
    enabled: bool
    disabled_at: str | None = None
    disabled_by: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def state(ctx: Context, document_id: int) -> DocumentState:
    """A document's switch as stored (UnknownDocument when there is no such document)."""
    with Session(ctx.engine) as session:
        doc = session.get(Document, document_id)
        if doc is None:
            raise UnknownDocument(f"no document {document_id}")
        return _state(doc)


def _state(doc: Document) -> DocumentState:
    at = doc.disabled_at.isoformat(timespec="seconds") if doc.disabled_at else None
    return DocumentState(doc.id, doc.dataset_id, doc.disabled_at is None, at, doc.disabled_by)


def set_document_enabled(
    ctx: Context,
    document_id: int,
    enabled: bool,
    *,
    actor: str = "system",
    dataset_ids: list[int] | None = None,
) -> DocumentState:
    """Switch a live document on or off (twice is once), among ``dataset_ids`` (None: any).

    A version replaced by a new one between the read and the UPDATE passes the switch on: the
    UPDATE matched nothing, and the one that replaced it is switched instead."""
    with Session(ctx.engine) as session:
        doc = session.get(Document, document_id)
        if doc is None or doc.deleted_at is not None:
            raise UnknownDocument(f"no document {document_id}")
        if dataset_ids is not None and doc.dataset_id not in dataset_ids:
            raise UnknownDocument(f"no document {document_id}")
    target = document_id
    for _ in range(MAX_FOLLOWS):
        faults.hit("before_document_switch", document_id=target)
        with Session(ctx.engine) as session:
            values = (
                {"disabled_at": None, "disabled_by": None}
                if enabled
                else {"disabled_at": db_now(session), "disabled_by": actor[:120]}
            )
            changed = matched(
                session,
                update(Document)
                .where(
                    col(Document.id) == target,
                    col(Document.deleted_at).is_(None),
                    col(Document.disabled_at).is_not(None)
                    if enabled
                    else col(Document.disabled_at).is_(None),
                )
                .values(**values)
                .execution_options(synchronize_session=False),
            )
            session.commit()
            doc = session.get(Document, target, populate_existing=True)
        if doc is None:
            break
        if changed or (doc.deleted_at is None and (doc.disabled_at is None) == enabled):
            log.info("document %d %s by %s", target, "enabled" if enabled else "disabled", actor)
            return _state(doc)
        if doc.replaced_by is None:
            break
        target = doc.replaced_by  # replaced meanwhile: the version serving now takes the switch
    raise UnknownDocument(f"no document {document_id}")
