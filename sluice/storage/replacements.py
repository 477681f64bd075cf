"""Versions of one external id: which document serves it, and the rows a new version changes.

A document may carry the application's own id (``external_id``, unique per dataset among live
documents). New bytes under a known external id are a new document (its ``doc_version`` one more),
a *candidate* that ``replaces`` the live one: the old version keeps serving until the candidate's
job succeeds; then the success transaction (``storage.jobs``) deletes every other version of the
id (``replaced_by`` names the new one) and makes the candidate's job the one search serves. Search
reads a document's ``deleted_at`` and ``active_job_id`` in one statement, so it sees either the
old version or the new one, never both, never neither.

A candidate uploaded while an earlier candidate of the same id still runs supersedes it: the
earlier one is deleted in the upload's transaction (its job stops), so at most one candidate runs
and no two versions are ever live. A partial unique index on the live documents holds the rule
against uploads at the same moment.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import and_, func, or_, text, update
from sqlmodel import Session, col, select

from sluice.errors import UserActionError
from sluice.storage.db import matched
from sluice.storage.models import Document


def live_clause():
    """A document that answers for its external id: not deleted, not replaced, and not a candidate
    still waiting for its first success."""
    return and_(
        col(Document.deleted_at).is_(None),
        col(Document.replaced_by).is_(None),
        or_(
            col(Document.replaces_document_id).is_(None),
            col(Document.active_job_id).is_not(None),
        ),
    )


def live(session: Session, *, dataset_id: int, external_id: str) -> Document | None:
    """The live document of ``external_id`` in the dataset (the version that serves), or None."""
    return session.exec(
        select(Document)
        .where(
            Document.dataset_id == dataset_id,
            Document.external_id == external_id,
            live_clause(),
        )
        .order_by(col(Document.id).desc())
        .execution_options(populate_existing=True)
    ).first()


def candidate(session: Session, *, dataset_id: int, external_id: str) -> Document | None:
    """The new version of ``external_id`` waiting for its job to succeed, if there is one."""
    return session.exec(
        select(Document)
        .where(
            Document.dataset_id == dataset_id,
            Document.external_id == external_id,
            col(Document.deleted_at).is_(None),
            col(Document.replaced_by).is_(None),
            col(Document.replaces_document_id).is_not(None),
            col(Document.active_job_id).is_(None),
        )
        .order_by(col(Document.id).desc())
    ).first()


def versions(session: Session, *, dataset_id: int, external_id: str) -> list[Document]:
    """Every document ever uploaded under ``external_id`` in the dataset, oldest first."""
    return list(
        session.exec(
            select(Document)
            .where(Document.dataset_id == dataset_id, Document.external_id == external_id)
            .order_by(col(Document.id))
        ).all()
    )


def place(
    session: Session, *, document: Document, external_id: str | None, new: bool
) -> list[Document]:
    """Give an upload's document (``new``: inserted by this upload) its place among the versions
    of ``external_id`` (the caller commits): a first version, a known version (the same bytes
    again: nothing changes), or a new candidate replacing the live one. Returns the earlier
    candidates the new one supersedes: the caller deletes them and their jobs in the same
    transaction.

    Bytes that are already a live document under another external id (or under none, while the id
    has a live document of its own) are refused: one document cannot be two of the application's.
    """
    if external_id is None:
        return []
    alive = not new and document.deleted_at is None and document.replaced_by is None
    if alive and document.external_id == external_id:
        return []  # a version already known: the same bytes again
    current = live(session, dataset_id=document.dataset_id, external_id=external_id)
    if alive and (document.external_id is not None or current is not None):
        raise _conflict(document, external_id)
    earlier = [
        d
        for d in versions(session, dataset_id=document.dataset_id, external_id=external_id)
        if d.id != document.id
        and d.deleted_at is None
        and d.replaced_by is None
        and (current is None or d.id != current.id)
    ]
    top = session.exec(
        select(func.max(Document.doc_version)).where(
            Document.dataset_id == document.dataset_id, Document.external_id == external_id
        )
    ).one()
    document.external_id = external_id
    document.doc_version = (top or 0) + 1
    document.replaces_document_id = current.id if current is not None else None
    document.replaced_by = None
    document.deleted_at = None  # a deleted version back: a candidate (or the first) once more
    session.add(document)
    session.flush()
    return earlier


def _conflict(document: Document, external_id: str) -> UserActionError:
    other = f"external id {document.external_id!r}" if document.external_id else "no external id"
    return UserActionError(
        "external_id_conflict",
        f"these bytes are already document {document.id} of this dataset, with {other}; they "
        f"cannot also be {external_id!r}",
        "Delete that document first, or upload these bytes under its own external id.",
    )


def others_to_retire(session: Session, document: Document) -> list[Document]:
    """At the success of ``document``'s job: the older versions of its external id still there
    (the one serving, and any earlier candidate), which the same transaction deletes. A newer
    candidate stays: a rebuild of the live version (a reindex) does not cancel its replacement."""
    if document.external_id is None or document.doc_version is None:
        return []
    return list(
        session.exec(
            select(Document)
            .where(
                Document.dataset_id == document.dataset_id,
                Document.external_id == document.external_id,
                Document.id != document.id,
                col(Document.doc_version) < document.doc_version,
                col(Document.deleted_at).is_(None),
                col(Document.replaced_by).is_(None),
            )
            .order_by(col(Document.id))
            .execution_options(populate_existing=True)
        ).all()
    )


def retire(session: Session, old: Document, *, by: Document, now: datetime) -> bool:
    """``old`` -> deleted, replaced by ``by`` (compare-and-set on it not being replaced yet); the
    caller has moved its jobs out of search in the same transaction. ``by`` takes over the switch
    (on or off) of the version it replaces."""
    done = (
        matched(
            session,
            update(Document)
            .where(col(Document.id) == old.id, col(Document.replaced_by).is_(None))
            .values(replaced_by=by.id, active_job_id=None, deleted_at=old.deleted_at or now)
            .execution_options(synchronize_session=False),
        )
        == 1
    )
    if done and old.id == by.replaces_document_id:
        inherit_switch(session, old.id, by.id)
    return done


_INHERIT = text(
    "UPDATE document SET disabled_at = (SELECT o.disabled_at FROM document o WHERE o.id = :old), "
    "disabled_by = (SELECT o.disabled_by FROM document o WHERE o.id = :old) WHERE id = :new"
)


def inherit_switch(session: Session, old_id: int, new_id: int) -> None:
    """The new version's switch := the old one's, read after the old row was locked by this
    transaction's UPDATE of it: a switch of the old version commits before or waits for it."""
    session.execute(_INHERIT, {"old": old_id, "new": new_id})
