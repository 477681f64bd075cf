"""The blob audit: live documents whose uploaded bytes are missing from the blob store.

Documents are read before the store is listed, and every document found missing is looked up
once more on its own, so an upload that lands during the walk is never reported.
"""

from __future__ import annotations

from sqlmodel import Session, col, select

from sluice.pipeline.reconcile.report import ReconcileReport
from sluice.pipeline.running.context import Context
from sluice.storage.models import Dataset, Document

SAMPLE = 100  # documents named in the report at most; the count is complete


def audit_blobs(ctx: Context, report: ReconcileReport, dataset: str | None = None) -> None:
    """Add to ``report`` the live documents (of ``dataset``, or all) whose blob is missing."""
    with Session(ctx.engine) as session:
        stmt = (
            select(Document.id, Document.blob_key, Document.filename, Dataset.name)
            .join(Dataset, col(Dataset.id) == Document.dataset_id)
            .where(col(Document.deleted_at).is_(None))
            .order_by(col(Document.id))
        )
        if dataset:
            stmt = stmt.where(Dataset.name == dataset)
        rows = list(session.exec(stmt).all())
    present = set(ctx.blobs.keys())
    report.blobs_checked = len(rows)
    missing = 0
    for document_id, key, filename, ds in rows:
        if key in present or ctx.blobs.exists(key):
            continue
        missing += 1
        if len(report.blobs_missing) < SAMPLE:
            report.blobs_missing.append(
                {"document_id": document_id, "dataset": ds, "filename": filename, "blob": key}
            )
    report.blobs_missing_count = missing
