"""What a reindex changes in what search serves, shown before it is run: for a sample of the
documents it would rebuild, the chunks served today beside the chunks the pipeline in force makes
of the same file (parsed in a child process, nothing embedded or written), and what moved: table
rows kept as rows, heading paths in front of the chunks, the number of chunks."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from sqlmodel import Session

from sluice.errors import PipelineError
from sluice.ops import reindex
from sluice.ops.preview import document_texts
from sluice.pipeline.running.chunk import heading_of
from sluice.pipeline.running.context import Context
from sluice.storage import lexical
from sluice.storage.db import stored
from sluice.storage.models import Dataset, Document

SAMPLE = 5  # documents parsed again for the comparison
MAX_CHUNKS = 2_000  # chunks read of one document's served version


def table_rows(texts: list[str]) -> int:
    """Lines that are Markdown table rows (``| a | b |``), the separator rows left out."""
    return sum(
        1
        for t in texts
        for line in heading_of(t)[1].split("\n")
        if line.startswith("|") and line.endswith("|") and len(line) > 2 and line.strip("|-: ")
    )


def headed(texts: list[str]) -> int:
    """Chunks that begin with their heading path."""
    return sum(1 for t in texts if heading_of(t)[0])


@dataclass
class DocumentChange:
    """One document's chunks served today and after the reindex."""

    document_id: int
    dataset: str
    filename: str
    from_version: str
    to_version: str
    before: list[str]
    after: list[str]
    error: str | None = None  # the file cannot be parsed now: the reindex fails for it

    @property
    def table_rows(self) -> tuple[int, int]:
        return table_rows(self.before), table_rows(self.after)

    @property
    def headed(self) -> tuple[int, int]:
        return headed(self.before), headed(self.after)

    @property
    def changed(self) -> bool:
        return self.error is not None or self.before != self.after

    def describe(self) -> str:
        if self.error is not None:
            return f"{self.filename}: cannot be parsed now ({self.error})"
        (tb, ta), (hb, ha) = self.table_rows, self.headed
        parts = [f"{len(self.before)} -> {len(self.after)} chunks"]
        if (tb, ta) != (0, 0):
            parts.append(f"table rows {tb} -> {ta}")
        if (hb, ha) != (0, 0):
            parts.append(f"chunks with a heading path {hb} -> {ha}")
        if not self.changed:
            parts.append("the same text")
        return f"{self.filename}: " + ", ".join(parts)

    def to_dict(self) -> dict:
        return {
            **asdict(self),
            "table_rows": list(self.table_rows),
            "headed": list(self.headed),
            "changed": self.changed,
        }


@dataclass
class ReindexChanges:
    """What a reindex would change for the sampled documents, the most telling one first."""

    documents: int  # documents the reindex would rebuild
    sampled: list[DocumentChange] = field(default_factory=list)

    def describe(self) -> str:
        if not self.sampled:
            return "nothing to compare: every document is on the pipeline version in force"
        changed = sum(1 for d in self.sampled if d.changed)
        gained = sum(1 for d in self.sampled if d.table_rows[1] > d.table_rows[0])
        return (
            f"{changed} of {len(self.sampled)} sampled document(s) change"
            + (f"; {gained} gain table rows" if gained else "")
            + f" ({self.documents:,} to rebuild)"
        )

    def to_dict(self) -> dict:
        return {"documents": self.documents, "sampled": [d.to_dict() for d in self.sampled]}


def _telling(change: DocumentChange) -> tuple:
    """Sort key: documents whose tables or headings change come first, then any change."""
    (tb, ta), (hb, ha) = change.table_rows, change.headed
    return (-(ta - tb), -(ha - hb), not change.changed, change.document_id)


def changes(
    ctx: Context, *, dataset: str | None = None, sample: int = SAMPLE, prefer_tables: bool = True
) -> ReindexChanges:
    """Each sampled document's served chunks beside what the pipeline in force makes of it."""
    todo = [c for c in reindex.candidates(ctx, dataset=dataset) if c.action != "underway"]
    # a few more parsed than shown, so that a document whose tables change is among those shown
    picked = todo[: sample * 2] if prefer_tables else todo[:sample]
    out = []
    for c in picked:
        before = [r.text for r in lexical.job_chunks(ctx.engine, c.active_job_id, limit=MAX_CHUNKS)]
        with Session(ctx.engine) as session:
            document = stored(session, Document, c.document_id)
            settings = ctx.settings_for(stored(session, Dataset, document.dataset_id))
        try:
            after, error = document_texts(ctx, document, settings), None
        except PipelineError as exc:
            after, error = [], exc.message
        out.append(
            DocumentChange(
                c.document_id,
                c.dataset,
                c.filename,
                c.from_version,
                c.to_version,
                before,
                after,
                error,
            )
        )
    out.sort(key=_telling)
    return ReindexChanges(len(todo), out[:sample])
