"""What a reconcile found and did: the report model, and where the last one is kept.

The report is plain data (``to_dict`` is what the CLI prints as JSON and the console draws); the
last report any process on this machine produced is kept as JSON in the data directory.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sluice.pipeline.running.context import Context

log = logging.getLogger(__name__)

REPORT_FILE = "reconcile.json"
KINDS = {
    "full": "full pass",
    "incremental": "incremental pass",
    "mixed": "incremental pass (a full one where a dataset needed it)",
}


@dataclass
class Finding:
    """Problems of one document (``document_id`` None: chunks no job of the dataset made)."""

    dataset: str
    document_id: int | None
    filename: str = ""
    active_job_id: int | None = None
    missing: int = 0
    orphans: int = 0
    mismatched: int = 0
    missing_ids: list[str] = field(default_factory=list)
    orphan_ids: list[str] = field(default_factory=list)
    mismatches: list[dict] = field(default_factory=list)  # {id, fields: {name: [stored, expected]}}
    orphan_sources: dict[str, int] = field(default_factory=dict)  # why they are orphans -> count
    repair: list[str] = field(default_factory=list)  # proposed (dry run) or done (repair)
    # The same problems in the lexical index: {"missing": n, "orphans": n, "mismatched": n}.
    lexical: dict[str, int] = field(default_factory=dict)
    lexical_ids: list[str] = field(default_factory=list)  # a sample of the rows concerned

    @property
    def problems(self) -> int:
        return self.missing + self.orphans + self.mismatched + sum(self.lexical.values())

    def to_dict(self) -> dict:
        return {**asdict(self), "problems": self.problems}


@dataclass
class DatasetSummary:
    name: str
    collection: str
    chunks: int = 0  # chunks in the collection when walked
    present: int = 0  # expected chunks found
    expected: int = 0  # chunks the active jobs promise
    missing: int = 0
    orphans: int = 0
    mismatched: int = 0
    in_flight: int = 0  # chunks of pending, running or retrying jobs (not judged)
    kept: int = 0  # chunks of documents a source tombstoned, kept for an undo (not served)
    disabled: int = 0  # chunks switched off (kept in the index and judged as any other)
    pages: int = 0  # requests for chunks: pages of the walk, or batches of ids asked
    # Which pass: "full" (the whole collection walked) or "incremental" (only the ids of the jobs
    # that changed since the last repairing pass, asked directly), over how many of its jobs.
    kind: str = "full"
    why_full: str = ""  # why a pass asked to be incremental was a full one
    jobs: int = 0  # jobs of the dataset when the pass began
    jobs_checked: int = 0  # the jobs whose chunks were read: all, or those that changed
    ids_asked: int = 0  # incremental: ids asked of the store
    # The lexical index (rows in the job database), judged apart from the vectors above.
    lexical_rows: int = 0
    lexical_missing: int = 0
    lexical_orphans: int = 0
    lexical_mismatched: int = 0
    lexical_kept: int = 0  # rows of tombstoned documents, kept for an undo
    # What the vector index returns (recall.RecallAudit.to_dict), and the same in words.
    index: dict = field(default_factory=dict)
    index_text: str = ""

    @property
    def index_unhealthy(self) -> bool:
        return bool(self.index) and not self.index.get("healthy", True)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class ReconcileReport:
    repair: bool
    actor: str
    started_at: str
    scope: str | None = None  # the dataset checked, or None for all
    changed_only: bool = False  # asked for incremental passes (``reconcile --changed``)
    finished_at: str = ""
    seconds: float = 0.0
    datasets: list[DatasetSummary] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)  # what repair did, in order
    errors: list[str] = field(default_factory=list)
    queued: list[int] = field(default_factory=list)  # jobs repair queued to rebuild missing chunks
    # Live documents whose uploaded bytes the blob store lacks (a sample; the count is complete).
    blobs_checked: int = 0
    blobs_missing_count: int = 0
    blobs_missing: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what this kind of pass leaves out

    @property
    def kind(self) -> str:
        """full, incremental, or mixed (a dataset without a checkpoint had a full pass)."""
        kinds = {d.kind for d in self.datasets}
        if not self.changed_only or kinds == {"full"}:
            return "full"
        return "incremental" if kinds <= {"incremental"} else "mixed"

    @property
    def missing(self) -> int:
        return sum(d.missing for d in self.datasets)

    @property
    def orphans(self) -> int:
        return sum(d.orphans for d in self.datasets)

    @property
    def mismatched(self) -> int:
        return sum(d.mismatched for d in self.datasets)

    @property
    def lexical_problems(self) -> dict[str, int]:
        return {
            kind: sum(getattr(d, f"lexical_{kind}") for d in self.datasets)
            for kind in ("missing", "orphans", "mismatched")
        }

    @property
    def index_problems(self) -> int:
        """Datasets whose vector index returns too little (unreachable chunks, low recall)."""
        return sum(1 for d in self.datasets if d.index_unhealthy)

    @property
    def problems(self) -> int:
        return (
            self.missing
            + self.orphans
            + self.mismatched
            + sum(self.lexical_problems.values())
            + self.blobs_missing_count
            + self.index_problems
        )

    @property
    def clean(self) -> bool:
        return self.problems == 0 and not self.errors

    @property
    def chunks(self) -> int:
        return sum(d.chunks for d in self.datasets)

    def repair_plan(self) -> dict[str, int]:
        """What a repair would do (the preview the console shows before the button)."""
        return {
            "delete_orphans": self.orphans,
            "fix_metadata": self.mismatched,
            "rebuild_documents": sum(
                1
                for f in self.findings
                if (f.missing or f.lexical.get("missing")) and f.document_id is not None
            ),
            "delete_lexical_orphans": self.lexical_problems["orphans"],
            "fix_lexical_fields": self.lexical_problems["mismatched"],
            "missing_chunks": self.missing,
            "rebuild_collections": self.index_problems,
        }

    def to_dict(self) -> dict:
        return {
            "repair": self.repair,
            "actor": self.actor,
            "scope": self.scope,
            "changed_only": self.changed_only,
            "kind": self.kind,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "seconds": self.seconds,
            "clean": self.clean,
            "chunks": self.chunks,
            "missing": self.missing,
            "orphans": self.orphans,
            "mismatched": self.mismatched,
            "lexical": self.lexical_problems,
            "index_problems": self.index_problems,
            "repair_plan": self.repair_plan(),
            "datasets": [d.to_dict() for d in self.datasets],
            "findings": [f.to_dict() for f in self.findings],
            "actions": self.actions,
            "errors": self.errors,
            "queued": self.queued,
            "blobs_checked": self.blobs_checked,
            "blobs_missing_count": self.blobs_missing_count,
            "blobs_missing": self.blobs_missing,
            "notes": self.notes,
        }

    def describe(self) -> str:
        lines = [
            f"reconcile{' --repair' if self.repair else ''}, {KINDS[self.kind]}: {self.chunks:,} "
            f"chunk(s) in {len(self.datasets)} dataset(s) checked in {self.seconds:.1f} s"
        ]
        for d in self.datasets:
            lines.append(
                f"  {d.name}: {_pass(d)}: {d.chunks:,} chunks, {d.present:,}/{d.expected:,} "
                f"expected present, {d.missing:,} missing, {d.orphans:,} orphan(s), "
                f"{d.mismatched:,} metadata mismatch(es), {d.in_flight:,} of jobs in flight"
                + (f", {d.disabled:,} switched off" if d.disabled else "")
                + (f", {d.kept:,} kept for undo (tombstoned by a source)" if d.kept else "")
            )
            if d.index_text:
                below = " (below the threshold: repair rebuilds it)" if d.index_unhealthy else ""
                lines.append(f"    {d.index_text}{below}")
        for f in self.findings:
            who = (
                f"document {f.document_id} {f.filename}"
                + (f" (job {f.active_job_id})" if f.active_job_id else "")
                if f.document_id is not None
                else "no document (foreign chunks)"
            )
            parts = []
            if f.missing:
                parts.append(f"{f.missing} missing, e.g. {', '.join(f.missing_ids[:3])}")
            if f.orphans:
                parts.append(
                    f"{f.orphans} orphan(s): "
                    + "; ".join(f"{n} {why}" for why, n in f.orphan_sources.items())
                )
            if f.mismatched:
                m = f.mismatches[0]
                parts.append(
                    f"{f.mismatched} metadata mismatch(es), e.g. {m['id']} "
                    + ", ".join(
                        f"{k}={v[0]!r} (should be {v[1]!r})" for k, v in m["fields"].items()
                    )
                )
            lines.append(f"  [{f.dataset}] {who}: " + "; ".join(parts))
            for r in f.repair:
                lines.append(f"      {'done' if self.repair else 'repair would'}: {r}")
        if self.blobs_missing_count:
            named = ", ".join(
                f"document {b['document_id']} {b['filename']} ({b['dataset']})"
                for b in self.blobs_missing[:3]
            )
            lines.append(
                f"  blobs: {self.blobs_missing_count:,} of {self.blobs_checked:,} document(s) have "
                f"no uploaded file in the blob store, e.g. {named}: repair cannot bring the bytes "
                "back; upload those files again"
            )
        lines += [f"  error: {e}" for e in self.errors]
        lines += [f"  note: {n}" for n in self.notes]
        in_flight = sum(d.in_flight for d in self.datasets)
        if self.clean and in_flight:
            lines.append(
                f"nothing to repair; {in_flight:,} chunk(s) of queued or running jobs are judged "
                "once those jobs finish"
            )
        elif self.clean and self.kind == "incremental":
            checked = sum(d.jobs_checked for d in self.datasets)
            lines.append(
                f"clean: the chunks of the {checked:,} job(s) that changed since the last pass "
                "are as the job database promises"
            )
        elif self.clean:
            lines.append(
                "clean: the index holds exactly what the job database promises, and returns it"
            )
        elif not self.repair:
            lines.append(f"{self.problems:,} problem(s); `sluice reconcile --repair` fixes them")
        return "\n".join(lines)


def _pass(d: DatasetSummary) -> str:
    """Which pass a dataset had, over how many of its jobs, in words."""
    if d.kind == "incremental":
        return (
            f"incremental pass over the {d.jobs_checked:,} of {d.jobs:,} job(s) that changed "
            f"since the last pass ({d.ids_asked:,} ids asked)"
        )
    return f"full pass over {d.jobs:,} job(s)" + (f" ({d.why_full})" if d.why_full else "")


# --- the last report ------------------------------------------------------------------------------


def report_path(ctx: Context) -> Path:
    return Path(ctx.settings.data_dir) / "reports" / REPORT_FILE


def save_report(ctx: Context, report: ReconcileReport) -> None:
    path = report_path(ctx)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(report.to_dict(), default=str))
        os.replace(tmp, path)
    except OSError as exc:  # the report is a convenience; the JobEvents hold what repair did
        log.warning("could not save the reconcile report to %s: %s", path, exc)


def last_report(ctx: Context) -> dict[str, Any] | None:
    """The last report any process on this machine saved (CLI, periodic task, console), or None."""
    try:
        return json.loads(report_path(ctx).read_text())
    except (OSError, ValueError):
        return None
