"""Seed a job database for console tests and the benchmark.

``seed_every_state`` drives real jobs through the state machine (and the runner, for the succeeded
ones), so every state the console shows is one the system really produces.

``seed_jobs`` bulk-inserts many documents, jobs and events (100,000 in a few seconds) with a
realistic status mix and time spread, for measuring page queries at scale.
"""

from __future__ import annotations

import hashlib
import random
from datetime import timedelta

from sqlalchemy import insert
from sqlalchemy.engine import Engine
from sqlmodel import Session

from sluice.storage import jobs
from sluice.storage.db import ensure_dataset
from sluice.storage.models import Document, ErrorKind, Job, JobEvent, JobStatus, Stage, utcnow

SEED_WORKER = "seed-host:4242"

# Failures as the runner records them: (kind, code, message, hint).
FAILURES = [
    (
        ErrorKind.user_action_required,
        "password_protected",
        "the PDF is password-protected",
        "Remove the password and upload the file again.",
    ),
    (
        ErrorKind.user_action_required,
        "no_text_layer",
        "the file has no extractable text (scanned images only)",
        "The file has no text layer; it needs OCR. Run it through OCR (e.g. ocrmypdf) and upload "
        "again.",
    ),
    (
        ErrorKind.permanent,
        "corrupt_pdf",
        "the PDF is damaged and cannot be read",
        "Export the PDF again from its source and upload it.",
    ),
    (
        ErrorKind.transient,
        "chroma_unreachable",
        "Chroma did not answer",
        "Sluice retries this by itself; if it keeps failing, check the service named above.",
    ),
]


def _text(label: str, i: int, words: int = 400) -> bytes:
    body = " ".join(f"{label}{i}word{j % 37}" for j in range(words))
    return f"Seeded document {label} number {i}. {body}\n".encode()


def _upload(ctx, name: str, data: bytes, dataset: str) -> int:
    from sluice.ops.ingest import ingest_bytes

    r = ingest_bytes(ctx, data, dataset=dataset, filename=name, actor="seed")
    assert r.accepted and not r.duplicate, r
    return r.job_id


def _claim(ctx, job_id: int) -> Job:
    with Session(ctx.engine, expire_on_commit=False) as session:
        result = jobs.claim(
            session=session, job_id=job_id, worker_id=SEED_WORKER, lease_seconds=3600
        )
    assert result.claimed, result
    return result.job


def _fail(ctx, job: Job, failure, *, delay: float = 600) -> None:
    kind, code, message, hint = failure
    with Session(ctx.engine) as session:
        jobs.fail(
            session=session,
            job_id=job.id,
            lease=job.lease,
            error=jobs.JobError(
                kind,
                code,
                message,
                hint,
                f"Traceback (most recent call last):\n  ...\n{code}: {message}",
            ),
            worker_id=SEED_WORKER,
            retry=jobs.RetryPolicy(base_delay=delay, max_delay=delay, rng=random.Random(0)),
        )  # the drawn delay is 0.84 of the ceiling, the same every run


def _fail_for_good(ctx, job_id: int, failure) -> None:
    """Attempts until the job is failed: one for a final kind, the whole budget for a transient
    one."""
    while True:
        job = _claim(ctx, job_id)
        _fail(ctx, job, failure, delay=0.001)
        with Session(ctx.engine) as session:
            if session.get(Job, job_id).status != JobStatus.retrying:
                return


def seed_every_state(
    ctx, *, dataset: str = "default", succeeded_texts: list[bytes] | None = None
) -> dict[str, list[int]]:
    """Jobs in every state the console shows; returns {label: [job ids]}.

    Labels: succeeded, superseded, pending, running, retrying, cancelled, failed:<code>. Nothing is
    published; no worker is needed (succeeded jobs run in this process through the real runner).
    """
    from sluice.pipeline.running.runner import run_job

    out: dict[str, list[int]] = {}

    def add(label: str, job_id: int) -> int:
        out.setdefault(label, []).append(job_id)
        return job_id

    texts = succeeded_texts or [_text("alpha", 0), _text("beta", 1)]
    for i, data in enumerate(texts):
        jid = add("succeeded", _upload(ctx, f"report-{i}.txt", data, dataset))
        assert run_job(jid, ctx=ctx).result == "succeeded"

    # superseded: the same document indexed again under a newer pipeline version
    old = _upload(ctx, "handbook.txt", _text("gamma", 2), dataset)
    assert run_job(old, ctx=ctx).result == "succeeded"
    with Session(ctx.engine, expire_on_commit=False) as session:
        job = session.get(Job, old)
        document = session.get(Document, job.document_id)
        newer, created = jobs.create_job(
            session=session,
            document=document,
            pipeline_version="v-newer",
            idempotency_key=f"{job.idempotency_key}:newer",
            max_attempts=5,
            actor="seed",
        )
        session.commit()
    assert created
    current = ctx.pipeline_version
    ctx.__dict__["pipeline_version"] = "v-newer"  # run it as a worker of that version would
    try:
        assert run_job(newer.id, ctx=ctx).result == "succeeded"
    finally:
        ctx.__dict__["pipeline_version"] = current
    add("superseded", old)
    add("succeeded", newer.id)

    add("pending", _upload(ctx, "waiting.txt", _text("delta", 3), dataset))

    running = _claim(
        ctx, add("running", _upload(ctx, "big-manual.pdf.txt", _text("eps", 4), dataset))
    )
    with Session(ctx.engine) as session:
        jobs.progress(
            session=session,
            job_id=running.id,
            lease=running.lease,
            stage=Stage.embedding,
            done=320,
            total=500,
        )

    retrying = _claim(ctx, add("retrying", _upload(ctx, "flaky.txt", _text("zeta", 5), dataset)))
    _fail(ctx, retrying, FAILURES[3])

    cancelled = add("cancelled", _upload(ctx, "unwanted.txt", _text("eta", 6), dataset))
    with Session(ctx.engine) as session:
        jobs.request_cancel(session=session, job_ids=[cancelled], actor="seed")

    for n, failure in enumerate([FAILURES[0], FAILURES[0], FAILURES[1], FAILURES[2], FAILURES[3]]):
        jid = add(
            f"failed:{failure[1]}",
            _upload(ctx, f"{failure[1]}-{n}.pdf", _text("theta", 10 + n), dataset),
        )
        _fail_for_good(ctx, jid, failure)
    return out


# --- bulk, for scale ------------------------------------------------------------------------------

MIX = [  # status, weight
    (JobStatus.succeeded, 80),
    (JobStatus.failed, 6),
    (JobStatus.pending, 6),
    (JobStatus.running, 1),
    (JobStatus.retrying, 1),
    (JobStatus.cancelled, 3),
    (JobStatus.superseded, 2),
    (JobStatus.deleted, 1),
]


def seed_jobs(
    engine: Engine,
    n: int,
    *,
    dataset: str = "default",
    seed: int = 0,
    pipeline_version: str = "vseed",
    spread_hours: float = 48.0,
    batch: int = 5000,
) -> int:
    """Bulk-insert ``n`` documents with one job each (plus a created event), in a status mix.

    Returns the number of jobs inserted. Idempotent per (dataset, seed, i): run again with another
    ``seed`` to add more.
    """
    rng = random.Random(seed)
    statuses, weights = zip(*MIX, strict=True)
    now = utcnow()
    with Session(engine) as session:
        ds = ensure_dataset(session=session, name=dataset)
        ds_id = ds.id
    inserted = 0
    for start in range(0, n, batch):
        count = min(batch, n - start)
        docs, specs = [], []
        for i in range(start, start + count):
            sha = hashlib.sha256(f"seed:{dataset}:{seed}:{i}".encode()).hexdigest()
            name = f"doc-{seed}-{i:07d}.pdf"
            created = now - timedelta(seconds=rng.uniform(0, spread_hours * 3600))
            docs.append(
                {
                    "dataset_id": ds_id,
                    "sha256": sha,
                    "size": rng.randint(10_000, 5_000_000),
                    "media_type": "application/pdf",
                    "filename": name,
                    "blob_key": sha,
                    "created_at": created,
                }
            )
            specs.append((sha, name, created, rng.choices(statuses, weights)[0]))
        with Session(engine) as session:
            doc_ids = (
                session.execute(
                    insert(Document).returning(Document.id, sort_by_parameter_order=True), docs
                )
                .scalars()
                .all()
            )
            rows = [
                _job_values(rng, ds_id, doc_id, spec, pipeline_version, now)
                for doc_id, spec in zip(doc_ids, specs, strict=True)
            ]
            job_ids = (
                session.execute(insert(Job).returning(Job.id, sort_by_parameter_order=True), rows)
                .scalars()
                .all()
            )
            session.execute(
                insert(JobEvent),
                [
                    {
                        "job_id": jid,
                        "at": row["created_at"],
                        "kind": "created",
                        "actor": "seed",
                        "to_status": "pending",
                        "stage": "queued",
                        "attempt": 0,
                        "message": row["filename"],
                        "data": {},
                    }
                    for jid, row in zip(job_ids, rows, strict=True)
                ],
            )
            session.commit()
        inserted += count
    return inserted


def _job_values(
    rng: random.Random, ds_id: int, doc_id: int, spec, pipeline_version: str, now
) -> dict:
    sha, name, created, status = spec
    chunks = rng.randint(5, 800)
    pages = max(1, chunks // 4)
    v = {
        "document_id": doc_id,
        "dataset_id": ds_id,
        "filename": name,
        "idempotency_key": f"{ds_id}:{sha}:{pipeline_version}",
        "pipeline_version": pipeline_version,
        "status": status,
        "stage": Stage.queued,
        "done": 0,
        "total": 0,
        "attempt": 0,
        "max_attempts": 5,
        "created_at": created,
        "updated_at": created,
        "version": 1,
        "lease": 0,
        "cancel_requested": False,
        "dismissed": False,
        "embedded_count": 0,
        "cached_count": 0,
    }
    took = timedelta(seconds=rng.uniform(2, 120))
    if status in (JobStatus.succeeded, JobStatus.superseded, JobStatus.deleted):
        v.update(
            stage=Stage.done,
            done=chunks,
            total=chunks,
            chunk_count=chunks,
            page_count=pages,
            attempt=1,
            lease=1,
            started_at=created,
            finished_at=min(now, created + took),
            updated_at=min(now, created + took),
        )
    elif status == JobStatus.failed:
        kind, code, message, hint = rng.choice(FAILURES)
        if kind == ErrorKind.transient:
            message = f"gave up after 5 attempts: {message}"
        v.update(
            stage=Stage.parsing,
            attempt=1,
            lease=1,
            error_kind=kind,
            error_code=code,
            error_message=message,
            fix_hint=hint,
            started_at=created,
            finished_at=min(now, created + took),
        )
    elif status == JobStatus.running:
        v.update(
            stage=Stage.embedding,
            done=rng.randint(0, chunks),
            total=chunks,
            attempt=1,
            lease=1,
            started_at=created,
            heartbeat_at=now,
            worker_id=SEED_WORKER,
        )
    elif status == JobStatus.retrying:
        kind, code, message, hint = FAILURES[3]
        v.update(
            attempt=1,
            lease=1,
            error_kind=kind,
            error_code=code,
            error_message=message,
            fix_hint=hint,
            next_attempt_at=now + timedelta(seconds=rng.uniform(5, 300)),
        )
    elif status == JobStatus.cancelled:
        v.update(
            error_code="cancelled",
            error_message="cancelled at queued",
            finished_at=min(now, created + took),
        )
    return v
