"""Reconcile's audit of the lexical index (rows in the job database), judged as the vectors are.

A row's chunk id names its job as a vector's does, so ``snapshot.chunk_standing`` says whether it is
present, in flight or an orphan, and ``snapshot.wrong_fields`` whether the row names the right job,
document and position. Findings go into the same report, counted apart from the vectors'
(``lexical_missing``, ``lexical_orphans``, ``lexical_mismatched``; a report is clean when both are),
and are confirmed against a fresh read of the job database before they are reported or repaired.
Repair deletes orphan rows, rewrites mismatched fields, and has the job of a document with missing
rows rebuilt (the re-run rewrites all its rows), unless the vectors' audit already queued that job.

The audit of the vectors (``audit.DatasetAudit``) hands itself in; this module sees it only as the
``Audit`` protocol below, so the two do not import each other.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Protocol

from sqlmodel import Session

from sluice.pipeline.reconcile.changes import ask_changed
from sluice.pipeline.reconcile.report import DatasetSummary, Finding, ReconcileReport
from sluice.pipeline.reconcile.snapshot import (
    BATCH,
    SAMPLE,
    PromisedJob,
    Snapshot,
    chunk_standing,
    wrong_fields,
)
from sluice.pipeline.running.context import Context
from sluice.storage import lexical
from sluice.storage.models import Dataset


class Audit(Protocol):
    """What the lexical audit needs of the dataset's audit: its state, and where findings go."""

    ctx: Context
    ds: Dataset
    report: ReconcileReport
    summary: DatasetSummary
    repair: bool
    page_size: int

    def finding(self, snap: Snapshot, document_id: int | None) -> Finding: ...

    def note(self, job_id: int, text: str, **counts: int) -> None: ...

    def rebuild(self, f: Finding, job: PromisedJob, missing: int) -> None: ...


def _fields(job: PromisedJob, row: dict) -> dict:
    # The version is in the id itself; a row's metadata is its document's, read by a join in the
    # same database (nothing to drift), so the copy the vectors must carry is taken as it is.
    return {**row, "pipeline_version": job.version, **(job.fields or {})}


def _batches(ids: list[str]):
    for start in range(0, len(ids), BATCH):
        yield ids[start : start + BATCH]


def audit_lexical(audit: Audit, bounds: dict[str, int] | None = None) -> None:
    """The whole lexical index of the dataset, or (``bounds``: the changed prefixes of an
    incremental pass) only the rows of those jobs, asked by id as the vectors are."""
    engine, ds = audit.ctx.engine, audit.ds
    with Session(engine) as session:
        first = Snapshot(session, ds.id)
    # an expected job has its count
    seen = {
        j.id: bytearray(j.chunk_count or 0)
        for prefix, j in first.by_prefix.items()
        if j.expected and (bounds is None or prefix in bounds)
    }
    orphans: list[str] = []
    mismatched: list[str] = []
    for page in _rows(audit, bounds):
        for cid, jid, did, pos in page:
            audit.summary.lexical_rows += 1
            kind, job, p, _ = chunk_standing(first, cid)
            if kind == "orphan":
                orphans.append(cid)
            elif kind == "kept":
                audit.summary.lexical_kept += 1
            elif kind == "present" and job is not None:
                seen[job.id][p] = 1
                if wrong_fields(
                    job, p, _fields(job, {"job_id": jid, "document_id": did, "position": pos})
                ):
                    mismatched.append(cid)
    with Session(engine) as session:
        fresh = Snapshot(session, ds.id)
    for ids in _batches(orphans):
        _orphans(audit, fresh, ids)
    for ids in _batches(mismatched):
        _mismatches(audit, fresh, ids)
    _missing(audit, first, fresh, seen)


def _rows(audit: Audit, bounds: dict[str, int] | None) -> Iterator[list[tuple]]:
    """(chunk_id, job_id, document_id, position) of the rows read, page by page."""
    engine, ds = audit.ctx.engine, audit.ds
    if bounds is None:
        yield from lexical.iter_rows(engine, ds.id, page_size=audit.page_size)
        return
    for _, found in ask_changed(bounds, lambda ids: lexical.get_fields(engine, ds.id, ids)):
        yield [(cid, r["job_id"], r["document_id"], r["position"]) for cid, r in found.items()]


def _count(
    audit: Audit,
    fresh: Snapshot,
    document_id: int | None,
    kind: str,
    n: int = 1,
    *,
    sample: list[str],
):
    f = audit.finding(fresh, document_id)
    f.lexical[kind] = f.lexical.get(kind, 0) + n
    f.lexical_ids = (f.lexical_ids + sample)[:SAMPLE]
    setattr(audit.summary, f"lexical_{kind}", getattr(audit.summary, f"lexical_{kind}") + n)
    return f


def _orphans(audit: Audit, fresh: Snapshot, ids: list[str]) -> None:
    judged = [(cid, *chunk_standing(fresh, cid)) for cid in ids]
    doomed = [(cid, job, why) for cid, kind, job, _, why in judged if kind == "orphan"]
    per_job = Counter(job.id for _, job, _ in doomed if job is not None)
    per_doc: Counter = Counter()
    for cid, job, _ in doomed:
        f = _count(audit, fresh, job.document_id if job else None, "orphans", sample=[cid])
        per_doc[f.document_id] += 1
    if not doomed:
        return
    if not audit.repair:
        for doc_id, n in per_doc.items():
            audit.finding(fresh, doc_id).repair.append(
                f"delete {n} orphan row(s) of the lexical index"
            )
        return
    lexical.delete_ids(audit.ctx.engine, audit.ds.id, [cid for cid, _, _ in doomed])
    for jid, n in per_job.items():
        audit.note(
            jid, f"removed {n} orphan row(s) of the lexical index", lexical_orphans_removed=n
        )
    for doc_id, n in per_doc.items():
        line = f"deleted {n} orphan row(s) of the lexical index"
        audit.finding(fresh, doc_id).repair.append(line)
        who = f"document {doc_id}" if doc_id is not None else "foreign rows"
        audit.report.actions.append(f"[{audit.ds.name}] {who}: {line}")


def _mismatches(audit: Audit, fresh: Snapshot, ids: list[str]) -> None:
    rows = lexical.get_fields(audit.ctx.engine, audit.ds.id, ids)
    fixes: list[tuple[str, dict]] = []
    per_job: Counter = Counter()
    for cid, row in rows.items():
        kind, job, pos, _ = chunk_standing(fresh, cid)
        if kind != "present" or job is None:
            continue
        wrong = wrong_fields(job, pos, _fields(job, row))
        if not wrong:
            continue
        f = _count(audit, fresh, job.document_id, "mismatched", sample=[cid])
        fixes.append((cid, {k: v[1] for k, v in wrong.items()}))
        per_job[job.id] += 1
        line = "rewrote" if audit.repair else "rewrite"
        f.repair.append(f"{line} the fields of lexical row {cid}")
    if audit.repair and fixes:
        lexical.update_fields(audit.ctx.engine, audit.ds.id, fixes)
        for jid, n in per_job.items():
            audit.note(jid, f"rewrote the fields of {n} lexical row(s)", lexical_fixed=n)
        audit.report.actions.append(
            f"[{audit.ds.name}] rewrote the fields of {len(fixes)} lexical row(s)"
        )


def _missing(audit: Audit, first: Snapshot, fresh: Snapshot, seen: dict[int, bytearray]) -> None:
    for prefix, job in first.by_prefix.items():
        marks = seen.get(job.id)
        if marks is None or not marks.count(0):
            continue
        now = fresh.by_prefix.get(prefix)
        if (
            now is None
            or not now.expected
            or now.id != job.id
            or now.chunk_count != job.chunk_count
        ):
            continue  # it changed while we walked: not judged this time
        wanted = [f"{prefix}{pos:06d}" for pos in range(len(marks)) if not marks[pos]]
        found = set()
        for ids in _batches(wanted):
            found |= set(lexical.get_fields(audit.ctx.engine, audit.ds.id, ids))
        missing = [cid for cid in wanted if cid not in found]
        if not missing:
            continue
        f = audit.finding(fresh, job.document_id)
        planned = f.missing > 0  # the vectors' audit already rebuilds this document
        _count(audit, fresh, job.document_id, "missing", len(missing), sample=missing)
        if not planned:
            audit.rebuild(f, now, len(missing))
