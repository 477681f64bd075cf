"""Chunk text edited by hand (``PATCH /v1/chunks/{id}`` with ``text``): one row per edit, keyed by
the sha256 of the text the pipeline made (the chunk's source text), not by the chunk id, which a
reindex changes; a run that makes that text again writes the edit instead. The newest row per
source is the edit in force; an edit back to the source text is no edit.

An edit commits with an UPDATE of its document's row (``Document.last_edit_id``), and a job's
success makes its document serve the job by a compare-and-set on that row that also wants the
``last_edit_id`` the run read (sluice.storage.jobs.success): an edit landing while a run builds a
new version is either seen by that success (which then refuses, ``ChunkEdited``, so the run applies
it and tries again) or made after it, when the edit finds the new version serving and writes to
it. A document never edited costs its jobs no read of this table."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Column, Index, Text, update
from sqlmodel import Field, Session, SQLModel, col, select

from sluice.errors import TransientError


def _now() -> datetime:
    return datetime.now(UTC)


MAX_TEXT = 20_000  # characters of an edited chunk


class ChunkEdit(SQLModel, table=True):
    __tablename__ = "chunk_edit"
    __table_args__ = (Index("ix_chunk_edit_document_source", "document_id", "source_sha"),)

    id: int = Field(default=None, primary_key=True)
    # no foreign keys: a dataset's delete removes its rows in steps, and this row must not block it
    dataset_id: int = Field(index=True)
    document_id: int
    source_sha: str = Field(max_length=64)
    text: str = Field(sa_column=Column(Text, nullable=False))
    edited_by: str = Field(default="system", max_length=120)
    edited_at: datetime = Field(default_factory=_now)


class ChunkEdited(TransientError):
    """A chunk of the document was edited while this run built it: apply the edit, then succeed."""

    def __init__(self, document_id: int, newest: int) -> None:
        super().__init__(
            "chunk_edited",
            f"a chunk of document {document_id} was edited while this job built it",
            "Sluice applies the edit and retries this by itself.",
        )
        self.newest = newest


def source_sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class Edits:
    """A document's edits as read at one moment."""

    seen: int = 0  # the newest edit's id (0: none yet)
    texts: dict[str, str] = field(default_factory=dict)  # source sha -> the text in force
    touched: frozenset[str] = frozenset()  # every source sha ever edited (also back to itself)

    def edit_of(self, made: str) -> tuple[str, str] | None:
        """The edit in force of the text the pipeline ``made``: (its text, the made text's sha),
        or None when it is not edited."""
        sha = source_sha(made)
        edited = self.texts.get(sha)
        return None if edited is None else (edited, sha)


def current(session: Session, document_id: int) -> Edits:
    """The document's edits in force now."""
    rows = session.exec(
        select(ChunkEdit.id, ChunkEdit.source_sha, ChunkEdit.text)
        .where(ChunkEdit.document_id == document_id)
        .order_by(col(ChunkEdit.id))
    ).all()
    texts: dict[str, str] = {}
    for _, sha, text in rows:  # the newest row of each source wins
        texts[sha] = text
    return Edits(
        seen=rows[-1][0] if rows else 0,
        texts={sha: text for sha, text in texts.items() if source_sha(text) != sha},
        touched=frozenset(texts),
    )


def record(
    session: Session, *, dataset_id: int, document_id: int, sha: str, text: str, actor: str
) -> int:
    """Add an edit in the caller's transaction, its id then the document's ``last_edit_id`` (what a
    success compares); the edit's id. Commit it."""
    row = ChunkEdit(
        dataset_id=dataset_id,
        document_id=document_id,
        source_sha=sha,
        text=text,
        edited_by=actor[:120],
    )
    session.add(row)
    session.flush()
    document = SQLModel.metadata.tables["document"]  # by name: models imports this module
    session.execute(
        update(document).where(document.c.id == document_id).values(last_edit_id=row.id)
    )
    return row.id


def history(session: Session, document_id: int, sha: str) -> list[dict[str, Any]]:
    """Every edit of one source of the document, oldest first."""
    rows = session.exec(
        select(ChunkEdit)
        .where(ChunkEdit.document_id == document_id, ChunkEdit.source_sha == sha)
        .order_by(col(ChunkEdit.id))
    ).all()
    return [
        {"id": r.id, "text": r.text, "edited_by": r.edited_by, "edited_at": r.edited_at}
        for r in rows
    ]
