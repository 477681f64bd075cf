"""What a source owns: the external id of its files' documents, the versions serving under it, and
whether the source made a document or found it in the dataset already.

A source's file is its document under ``<source>:<path>`` (two sources of one dataset never share
an id); an entry written before that rule names no id of its own and keeps its path as the id. A
document is the source's when the source was its first owner (its first job was made by the
source's upload); one that was in the dataset before (the same bytes uploaded by someone else) is
adopted: the source never hides nor deletes it, and releases it when removed.
"""

from __future__ import annotations

from sqlmodel import Session, col, select

from sluice.storage.models import Document, Job, JobEvent
from sluice.storage.source_records import SourceEntry


def actor_of(source_name: str) -> str:
    """How a source appears as the actor of what its syncs upload."""
    return f"source:{source_name}"


def external_id(source_name: str, path: str) -> str:
    """The external id of a source's file: the source's name and the file's path."""
    return f"{source_name}:{path}"


def entry_external_id(entry: SourceEntry) -> str:
    """The id an entry's documents carry (its path, for an entry of before the rule)."""
    return entry.external_id or entry.path


def first_owner(session: Session, document_id: int) -> str | None:
    """Who made the document: the actor of its first job's ``created`` event (None when retention
    removed it)."""
    return session.exec(
        select(JobEvent.actor)
        .join(Job, col(Job.id) == col(JobEvent.job_id))
        .where(col(Job.document_id) == document_id, col(JobEvent.kind) == "created")
        .order_by(col(JobEvent.id))
        .limit(1)
    ).first()


def made_by(session: Session, document_id: int, source_name: str) -> bool:
    """Whether the source made this document (an unknown first owner counts as the source's, as
    every document of an entry did before ownership was recorded)."""
    owner = first_owner(session, document_id)
    return owner is None or owner == actor_of(source_name)


def owns(session: Session, entry: SourceEntry, document_id: int, source_name: str) -> bool:
    """Whether the entry's source owns ``document_id`` (the entry's document, or another version
    of its external id): the entry's record when it names that document, else its first job."""
    if document_id == entry.document_id and entry.owned is not None:
        return entry.owned
    return made_by(session, document_id, source_name)


def serving_versions(session: Session, dataset_id: int, entry: SourceEntry) -> list[Document]:
    """Every version of the entry's external id not yet replaced and not deleted (the one that
    serves, a candidate being built), and the entry's own document: what follows the entry when
    it moves, and what its source answers for when it is removed."""
    ext = entry_external_id(entry)
    found = list(
        session.exec(
            select(Document)
            .where(
                col(Document.dataset_id) == dataset_id,
                col(Document.external_id) == ext,
                col(Document.replaced_by).is_(None),
                col(Document.deleted_at).is_(None),
            )
            .order_by(col(Document.id))
        ).all()
    )
    if entry.document_id is not None and all(d.id != entry.document_id for d in found):
        own = session.get(Document, entry.document_id)
        if own is not None:
            found.append(own)
    return found
