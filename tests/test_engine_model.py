"""A model-based test of the whole job engine (hypothesis's stateful testing).

Rules are what can happen in any order: uploads (new bytes, the same bytes, the same bytes to
another dataset), a worker's step on a job whose message it took (success, a transient or
permanent failure, death without a word, a cancel midway, the document's metadata replaced
midway), time passing and the outbox dispatched, recovery rounds (reaping, redelivery, a dataset
delete that stopped finished), retry, cancel, delete, reindex, a dataset's settings change and its
revert, pause and resume, prune with the clock moved on, reconcile with and without repair, a
document's metadata replaced, a chunk switched off and on, new bytes under an external id (a
replacement), a dataset deleted, and a search that checks what it answers. They drive the real job
store (SQLite, and PostgreSQL), the session's Chroma server and the lexical index, through the
same ops functions the front ends call, with the deterministic hash embedder; workers are stepped
in the test's thread (``run_job`` called directly, fault points stopping it mid-job), the queue is
a set of job ids.

After every step the invariants of issue 25 hold (see each ``@invariant``). Examples are
derandomized, so CI explores the same sequences every run; every sequence it ever failed on is
kept below it as a plain regression test.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import delete, text, update
from sqlmodel import Session, SQLModel, select

from sluice import faults
from sluice.errors import PermanentError, TransientError
from sluice.ops.access import Operator
from sluice.storage import jobs, lexical, replacements, vectors
from sluice.storage.models import (
    Dataset,
    DisabledChunk,
    Document,
    Instance,
    Job,
    JobEvent,
    JobStatus,
    Outbox,
)

DATASETS = ("default", "beta")
TEXTS = [
    "".join(
        f"Note {n}.{i}: the {word} of ward {i} is logged, with its tides and its lights. " * 6
        + "\n\n"
        for i in range(4)
    ).encode()
    for n, word in enumerate(("harbour", "orchard", "glacier"))
]
# new bytes under one external id: versions of one document of the application's
VERSIONS = [
    b"Version %d of the charter: the tides of the harbour are logged. " % v * 30 for v in (1, 2)
]
EXTERNAL_ID = "charter"
TAGS = ("red", "blue")
OWN_FAILURES = {"injected_fault", "worker_lost"}  # the only failures the model makes
STEPS = {"sqlite": 30, "postgres": 30}
EXAMPLES = {"sqlite": 40, "postgres": 25}


OPERATOR = Operator("model", "operator", "cli")
PICK = st.integers(
    0, 7
)  # which of the candidates (modulo their number: draws never depend on state)


def pick(items: list[int], i: int) -> int | None:
    return items[i % len(items)] if items else None


class Died(BaseException):
    """The worker's process ends here, without a word (nothing in the runner handles it)."""


class EngineModel(RuleBasedStateMachine):
    ctx = None  # set by the test before the machine runs
    tally: Counter[str] = Counter()  # what the runs did, so a test sees that the model works

    def __init__(self) -> None:
        super().__init__()
        self.queued: set[int] = set()  # the queue: job ids whose message is there
        self.settings_changed: dict[str, bool] = dict.fromkeys(DATASETS, False)
        self.tags = 0  # metadata changes so far: each sets the next tag
        self.dataset_deleted = False  # one dataset delete an example (it ends most other work)

    # --- set-up -----------------------------------------------------------------------------------

    @initialize()
    def empty_engine(self) -> None:
        """Every example starts from an empty job database and empty collections."""
        ctx = self.ctx
        with Session(ctx.engine) as session:
            names = [d.collection for d in session.exec(select(Dataset)).all()]
            session.execute(text("DELETE FROM lexical_chunk"))
            for table in reversed(SQLModel.metadata.sorted_tables):
                if table.name not in ("instance", "api_key", "api_idempotency"):
                    session.execute(delete(table))
            session.execute(update(Instance).values(reaper_tick_at=None, reap_after=None))
            session.commit()
        for name in names:
            try:
                ctx.vectors.drop_collection(name)
            except Exception:  # never created (no chunk was written)
                pass
        self.upload(0, "default")  # every example starts with work for the workers
        self.upload(1, "beta")

    # --- helpers ----------------------------------------------------------------------------------

    def _jobs(self, *statuses: JobStatus) -> list[int]:
        with Session(self.ctx.engine) as session:
            query = select(Job.id).order_by(Job.id)
            if statuses:
                query = query.where(Job.status.in_(statuses))
            return list(session.exec(query).all())

    def _documents(self) -> list[int]:
        with Session(self.ctx.engine) as session:
            return list(
                session.exec(
                    select(Document.id).where(Document.deleted_at.is_(None)).order_by(Document.id)
                ).all()
            )

    def _dataset(self, name: str) -> Dataset | None:
        with Session(self.ctx.engine) as session:
            return session.exec(select(Dataset).where(Dataset.name == name)).first()

    def _usable(self, name: str) -> bool:
        """The dataset takes work (is not being deleted); it is made again when it was deleted."""
        ds = self._dataset(name)
        return ds is None or ds.deleting_at is None

    def _set_metadata(self, document_id: int) -> None:
        from sluice.ops.metadata import set_document_metadata

        self.tags += 1
        set_document_metadata(
            self.ctx, document_id, {"tag": TAGS[self.tags % 2], "n": self.tags}, actor="op"
        )

    def _time_passes(self) -> None:
        """Every retry is due now (the clock moved on)."""
        from sluice.storage.clock import db_now

        with Session(self.ctx.engine) as session:
            now = db_now(session) - timedelta(seconds=1)
            session.execute(
                update(Job).where(Job.status == JobStatus.retrying).values(next_attempt_at=now)
            )
            session.execute(update(Outbox).where(Outbox.sent_at.is_(None)).values(available_at=now))
            session.commit()

    # --- rules ------------------------------------------------------------------------------------

    @rule(n=st.integers(0, len(TEXTS) + len(VERSIONS) - 1), dataset=st.sampled_from(DATASETS))
    def upload(self, n: int, dataset: str) -> None:
        """An upload of one of the texts, or (past them) of a version under the external id."""
        from sluice.ops.ingest import ingest_bytes

        if n >= len(TEXTS):
            self.replace(n - len(TEXTS), dataset)
            return
        r = ingest_bytes(
            self.ctx,
            TEXTS[n],
            dataset=dataset,
            filename=f"notes-{n}.txt",
            publish=self.queued.add,
        )
        assert r.accepted or (r.error_code == "dataset_deleting" and not self._usable(dataset)), (
            r.message
        )

    def replace(self, v: int, dataset: str) -> None:
        """Bytes under the application's external id: its first version, the same bytes again, or
        new bytes that replace the live version once their job succeeds."""
        from sluice.ops.ingest import ingest_bytes

        r = ingest_bytes(
            self.ctx,
            VERSIONS[v],
            dataset=dataset,
            filename="charter.txt",
            publish=self.queued.add,
            external_id=EXTERNAL_ID,
        )
        assert r.accepted or (r.error_code == "dataset_deleting" and not self._usable(dataset)), (
            r.message
        )
        self.tally[f"replace:{'duplicate' if r.duplicate else 'new'}"] += r.accepted

    @rule()
    def dispatch(self) -> None:
        from sluice.storage.outbox import dispatch

        self._time_passes()
        dispatch(engine=self.ctx.engine, publish=self.queued.add)

    @rule(
        i=PICK,
        how=st.sampled_from(
            ["success", "success", "transient", "permanent", "die", "cancel", "metadata"]
        ),
    )
    def worker(self, i: int, how: str) -> None:
        """A worker takes a message from the queue (the dispatcher has put the due ones there
        first, when it was empty) and runs that job."""
        from sluice.pipeline.running.runner import run_job

        if not self.queued:
            self.dispatch()
        if not self.queued:
            return  # every waiting job is paused
        job_id = pick(sorted(self.queued), i)
        self.queued.discard(job_id)
        batches: list[int] = []

        def midway(**_) -> None:
            batches.append(1)
            if len(batches) != 1:
                return
            if how == "transient":
                raise TransientError("injected_fault", "injected transient failure", "")
            if how == "permanent":
                raise PermanentError("injected_fault", "injected permanent failure", "")
            if how == "die":
                raise Died()
            if how == "cancel":
                with Session(self.ctx.engine) as session:
                    jobs.request_cancel(session=session, job_ids=[job_id], actor="op")
            if how == "metadata":  # the document's metadata replaced while its job runs
                with Session(self.ctx.engine) as session:
                    document_id = session.get(Job, job_id).document_id
                if document_id in self._documents():
                    self._set_metadata(document_id)

        with faults.hook("embed_batch", midway):
            try:
                outcome = run_job(job_id, ctx=self.ctx).result
            except Died:
                outcome = "died"
        self.tally[f"{how}:{outcome}"] += 1
        if outcome != "noop":  # what search answers now
            self.search(i, ("hybrid", "lexical", "dense")[i % 3])

    @rule()
    def recover(self) -> None:
        """A recovery round after a lease went by: dead workers' jobs are taken back, lost
        messages published again, the outbox dispatched."""
        from sluice.pipeline.queueing import recovery

        self._time_passes()
        from sluice.pipeline.running.dataset_deletion import STALE_SECONDS

        lease = self.ctx.settings.lease_seconds
        with Session(self.ctx.engine) as session:
            for job in session.exec(select(Job).where(Job.status == JobStatus.running)).all():
                job.heartbeat_at -= timedelta(seconds=2 * lease)
                session.add(job)
            for ds in session.exec(select(Dataset).where(Dataset.deleting_at.is_not(None))).all():
                ds.deleting_at -= timedelta(seconds=2 * STALE_SECONDS)  # its process died
                session.add(ds)
            session.commit()
        report = recovery.run_once(
            self.ctx, publish=self.queued.add, queued_job_ids=lambda: sorted(self.queued)
        )
        assert report.publish_error is None, report.publish_error

    @rule(i=PICK)
    def retry(self, i: int) -> None:
        job_id = pick(self._jobs(JobStatus.failed, JobStatus.cancelled), i)
        if job_id is None:
            return
        with Session(self.ctx.engine) as session:
            jobs.retry(session=session, job_ids=[job_id], actor="op")

    @rule(i=PICK)
    def cancel(self, i: int) -> None:
        from sluice.ops import actions

        job_id = pick(self._jobs(*jobs.CANCELLABLE), i)
        if job_id is None:
            return
        actions.cancel(OPERATOR, [job_id])

    @rule(i=PICK, what=st.sampled_from(["metadata", "delete", "off", "dataset", "on", "delete"]))
    def change(self, i: int, what: str) -> None:
        """A document deleted, or (once an example: it ends most other work) a whole dataset; a
        live document's metadata replaced; a chunk switched off, or on again."""
        if what == "dataset" and not self.dataset_deleted:
            self.delete_dataset(DATASETS[i % len(DATASETS)])
        elif what in ("metadata", "off", "on"):
            self.edit(i, what)
        else:
            self.delete(i)

    def delete(self, i: int) -> None:
        from sluice.ops.documents import delete_document

        document_id = pick(self._documents(), i)
        if document_id is None:
            return
        assert delete_document(self.ctx, f"doc:{document_id}", actor="op").ok

    @rule(i=PICK)
    def reindex(self, i: int) -> None:
        job_id = pick(self._jobs(JobStatus.succeeded), i)
        if job_id is None:
            return
        with Session(self.ctx.engine) as session:
            jobs.reindex(session=session, job_ids=[job_id], actor="op")

    @rule(dataset=st.sampled_from(DATASETS))
    def change_settings(self, dataset: str) -> None:
        """A dataset's chunk size changes, or goes back to the default (its revert)."""
        from sluice.ops import settings_changes
        from sluice.storage.db import ensure_dataset

        if not self._usable(dataset):
            return
        with Session(self.ctx.engine) as session:
            ensure_dataset(session=session, name=dataset)
        changed = self.settings_changed[dataset]
        value = None if changed else "300"
        done = settings_changes.apply(self.ctx, dataset, {"chunk_size": value}, actor="op")
        assert done.ok, done.message
        self.settings_changed[dataset] = not changed

    @rule(dataset=st.sampled_from(DATASETS), paused=st.booleans())
    def pause(self, dataset: str, paused: bool) -> None:
        from sluice.storage import pauses
        from sluice.storage.db import ensure_dataset

        if not self._usable(dataset):
            return
        with Session(self.ctx.engine) as session:
            ds = ensure_dataset(session=session, name=dataset)
            if paused:
                pauses.pause(session=session, dataset_id=ds.id, actor="op")
            else:
                pauses.resume(session=session, dataset_id=ds.id)

    @rule()
    def prune(self) -> None:
        """Retention, with the clock moved ten days on: everything finished looks old."""
        from sluice.storage import retention
        from sluice.storage.clock import db_now

        with Session(self.ctx.engine) as session:
            cutoff = db_now(session) + timedelta(days=10)
            retention.prune(session=session, cutoff=cutoff, dry_run=False)

    @rule(repair=st.booleans())
    def reconcile(self, repair: bool) -> None:
        from sluice.pipeline.reconcile.audit import reconcile

        reconcile(self.ctx, repair=repair, actor="op", save=False)

    def edit(self, i: int, what: str) -> None:
        """A live document's metadata replaced, or a chunk of the lexical index (any job's)
        switched off, or on again."""
        from sluice.ops.chunks import set_chunk_enabled

        self.tally["rule:edit"] += 1
        if what == "metadata":
            document_id = pick(self._documents(), i)
            if document_id is not None:
                self._set_metadata(document_id)
            return
        with self.ctx.engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT chunk_id, dataset_id FROM lexical_chunk "
                    "ORDER BY dataset_id, job_id, position"
                )
            ).all()
        if not rows:
            return
        chunk, dataset_id = rows[i * 7 % len(rows)]
        set_chunk_enabled(self.ctx, chunk, what == "on", actor="op", dataset_ids=[dataset_id])
        self.tally[f"chunk:{what}"] += 1

    def delete_dataset(self, dataset: str) -> None:
        """A dataset deleted as the console, the CLI and the API do it, waiting for no running
        job: one whose worker died keeps the delete from ending until recovery takes it back."""
        from sluice.ops import dataset_admin

        self.dataset_deleted = True
        done = dataset_admin.delete(self.ctx, OPERATOR, dataset, wait=0)
        assert done.ok or done.code == "jobs_still_running", done
        self.search(0, "hybrid", dataset)  # it must refuse
        self.tally[f"dataset_delete:{done.code or 'ok'}"] += 1

    def search(self, i: int, mode: str, dataset: str | None = None) -> None:
        """What a search answers: only the active job's chunks of live documents, never a chunk
        switched off, nothing of a dataset deleted or being deleted. It asks ``dataset``, else one
        that serves a document, else one deleted or being deleted (it must refuse), else none."""
        from sluice.ops.search import UnknownDataset, search

        self.tally["rule:search"] += 1
        with Session(self.ctx.engine) as session:
            serving = session.exec(
                select(Dataset.name)
                .join(Document, Document.dataset_id == Dataset.id)
                .where(Document.active_job_id.is_not(None), Document.deleted_at.is_(None))
                .distinct()
                .order_by(Dataset.name)
            ).all()
        dataset = (
            dataset
            or pick(list(serving), i)
            or next(
                (
                    name
                    for name in DATASETS
                    if not self._usable(name) or self._dataset(name) is None
                ),
                None,
            )
        )
        if dataset is None:
            return
        try:
            hits = search(self.ctx, query="tides harbour ward", dataset=dataset, k=20, mode=mode)
        except UnknownDataset:
            assert not self._usable(dataset) or self._dataset(dataset) is None
            return
        ds = self._dataset(dataset)
        assert ds is not None and ds.deleting_at is None, f"{dataset} is deleted yet answers"
        with Session(self.ctx.engine) as session:
            off = set(
                session.exec(
                    select(DisabledChunk.chunk_id).where(DisabledChunk.dataset_id == ds.id)
                ).all()
            )
            for hit in hits:
                doc = session.get(Document, hit.document_id)
                assert doc is not None and doc.dataset_id == ds.id, hit
                assert doc.deleted_at is None, f"deleted document {doc.id} answers {hit.chunk_id}"
                assert hit.job_id == doc.active_job_id, (hit.chunk_id, hit.job_id, doc)
                assert hit.chunk_id not in off, f"switched-off chunk {hit.chunk_id} answers"
        self.tally["search:hits" if hits else "search:none"] += 1

    # --- invariants -------------------------------------------------------------------------------

    def _state(self):
        with Session(self.ctx.engine) as session:
            return (
                {j.id: j for j in session.exec(select(Job)).all()},
                {d.id: d for d in session.exec(select(Document)).all()},
                {d.id: d for d in session.exec(select(Dataset)).all()},
                {
                    r.job_id
                    for r in session.exec(select(Outbox).where(Outbox.sent_at.is_(None))).all()
                },
            )

    def _chunks(self, dataset: Dataset) -> list[dict]:
        try:
            pages = list(self.ctx.vectors.iter_pages(dataset.collection, include=["metadatas"]))
        except Exception:  # the collection was never made
            return []
        return [m for page in pages for m in page["metadatas"]]

    @invariant()
    def each_document_serves_one_version_and_exactly_its_active_jobs_chunks(self) -> None:
        self.tally["steps"] += 1
        all_jobs, documents, datasets, _ = self._state()
        for ds in datasets.values():
            chunks = self._chunks(ds)
            for doc in (d for d in documents.values() if d.dataset_id == ds.id):
                mine = [m for m in chunks if m["document_id"] == doc.id]
                if doc.deleted_at is not None:  # nothing, but what a job uploaded again writes
                    gone = [m for m in mine if all_jobs[m["job_id"]].status == JobStatus.deleted]
                    assert not gone, f"deleted document {doc.id} still has chunks"
                    continue
                if doc.active_job_id is None:
                    continue
                active = all_jobs[doc.active_job_id]
                served = [m for m in mine if m["job_id"] == active.id]
                versions = {m["pipeline_version"] for m in served}
                assert versions <= {active.pipeline_version}, (doc.id, active.id, versions)
                if active.status == JobStatus.succeeded:
                    assert len(served) == active.chunk_count, (doc.id, len(served), active)
                    assert lexical.count_job(self.ctx.engine, active.id) == active.chunk_count

    @invariant()
    def every_change_of_a_jobs_status_is_an_event(self) -> None:
        """The status each job is in is the one its last event that changed a status says (what
        the event stream and the timeline show): no transition went without its event."""
        all_jobs, _, _, _ = self._state()
        with Session(self.ctx.engine) as session:
            rows = session.exec(
                select(JobEvent.job_id, JobEvent.to_status)
                .where(JobEvent.to_status.is_not(None))
                .order_by(JobEvent.id)
            ).all()
        last = {job_id: status for job_id, status in rows}
        for job in all_jobs.values():
            assert last.get(job.id) == job.status.value, (
                f"job {job.id} is {job.status.value}, its last transition event says "
                f"{last.get(job.id)}"
            )

    @invariant()
    def at_most_one_live_version_per_external_id(self) -> None:
        with Session(self.ctx.engine) as session:
            rows = session.exec(
                select(Document.dataset_id, Document.external_id).where(
                    Document.external_id.is_not(None), replacements.live_clause()
                )
            ).all()
        twice = [key for key, n in Counter(rows).items() if n > 1]
        assert not twice, f"more than one live version of {twice}"

    @invariant()
    def every_job_not_final_has_a_way_forward(self) -> None:
        all_jobs, _, datasets, unsent = self._state()
        with Session(self.ctx.engine) as session:
            for job in all_jobs.values():
                if job.status not in jobs.CLAIMABLE:
                    continue
                assert job.id in self.queued or job.id in unsent, (
                    f"job {job.id} ({job.status.value}) has no message and no outbox row"
                )
                ds = datasets[job.dataset_id]
                if job.pipeline_version != self.ctx.version_for(ds):
                    assert jobs.stamped_before(
                        session=session, job=job, moment=ds.settings_changed_at
                    ), (
                        f"job {job.id} waits for pipeline {job.pipeline_version}, "
                        "which no worker makes"
                    )

    @invariant()
    def attempts_are_spent_only_by_the_jobs_own_failures(self) -> None:
        all_jobs, _, _, _ = self._state()
        for job in all_jobs.values():
            assert job.attempt <= job.max_attempts, job
            if job.status in (JobStatus.retrying, JobStatus.failed):
                assert job.error_code in OWN_FAILURES and job.waiting_for is None, (
                    f"job {job.id} {job.status.value}: {job.error_code} {job.error_message}"
                )

    @invariant()
    def once_quiet_the_index_holds_no_chunk_no_job_may_claim(self) -> None:
        all_jobs, documents, datasets, _ = self._state()
        if any(j.status in (*jobs.CLAIMABLE, JobStatus.running) for j in all_jobs.values()):
            return
        for ds in datasets.values():
            for m in self._chunks(ds):
                job = all_jobs.get(m["job_id"])
                assert job is not None, f"chunk of job {m['job_id']}, which does not exist"
                doc = documents[job.document_id]
                assert m["pipeline_version"] == job.pipeline_version, (job.id, m)
                assert job.status not in (JobStatus.deleted, JobStatus.superseded), (job.id, m)
                if job.status == JobStatus.cancelled:
                    assert doc.active_job_id == job.id, f"cancelled job {job.id} left chunks"
                if doc.deleted_at is None and doc.active_job_id == job.id:
                    carried = vectors.stored_metadata_fields(m)
                    assert carried == vectors.metadata_fields(doc.metadata_), (
                        f"chunk of document {doc.id} carries {carried}, its document "
                        f"{doc.metadata_}"
                    )


WORKER_STEPS = ("success", "transient", "permanent", "die", "cancel", "metadata")


def run_model(ctx, backend: str, monkeypatch) -> None:
    from sluice.pipeline.queueing import recovery

    monkeypatch.setattr(recovery, "_sleep", lambda _s: None)  # a grace passes at once
    EngineModel.ctx = ctx
    EngineModel.tally.clear()
    run_state_machine_as_test(
        EngineModel,
        settings=settings(
            max_examples=EXAMPLES[backend],
            stateful_step_count=STEPS[backend],
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
            print_blob=True,
        ),
    )


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_job_engine_keeps_its_invariants_under_any_sequence(
    database_url, make_ctx, monkeypatch
):
    backend = "postgres" if database_url.startswith("postgresql") else "sqlite"
    ctx = make_ctx(SLUICE_EMBED_BATCH_SIZE="2", SLUICE_MAX_ATTEMPTS="3")
    run_model(ctx, backend, monkeypatch)
    tally = EngineModel.tally
    print(dict(tally))
    runs = sum(n for what, n in tally.items() if what.split(":")[0] in WORKER_STEPS)
    assert tally["success:succeeded"] and runs >= 10, tally  # the workers did run jobs
    # and the ways to change the index added later were taken, and search answered
    assert tally["replace:new"] and (tally["dataset_delete:ok"] or tally["rule:edit"]), tally
    assert tally["search:hits"], tally


# --- every sequence the model ever failed on, kept as a plain test --------------------------------


def replay(ctx, monkeypatch, *steps: tuple[str, dict]) -> None:
    """Run ``steps`` (rule, arguments) on a fresh machine, checking the invariants after each."""
    from sluice.pipeline.queueing import recovery

    monkeypatch.setattr(recovery, "_sleep", lambda _s: None)
    EngineModel.ctx = ctx
    state = EngineModel()
    checks = [
        getattr(state, name)
        for name in dir(EngineModel)
        if getattr(getattr(EngineModel, name), "hypothesis_stateful_invariant", None) is not None
    ]
    assert checks
    state.empty_engine()
    for name, kwargs in steps:
        getattr(state, name)(**kwargs)
        for check in checks:
            check()


@pytest.fixture
def model_ctx(database_url, make_ctx):
    return make_ctx(SLUICE_EMBED_BATCH_SIZE="2", SLUICE_MAX_ATTEMPTS="3")


def test_found_a_failed_job_restamped_by_a_settings_change_leaves_no_chunk_of_its_old_version(
    model_ctx, monkeypatch
):
    replay(
        model_ctx,
        monkeypatch,
        ("upload", {"dataset": "default", "n": 0}),
        ("worker", {"how": "permanent", "i": 0}),
        ("change_settings", {"dataset": "default"}),
    )


def test_found_a_cancel_of_a_job_retrying_after_it_wrote_chunks_removes_them(
    model_ctx, monkeypatch
):
    replay(
        model_ctx,
        monkeypatch,
        ("upload", {"dataset": "default", "n": 0}),
        ("worker", {"how": "transient", "i": 0}),
        ("cancel", {"i": 0}),
    )


def test_found_a_metadata_change_while_its_job_runs_reaches_the_chunks_it_writes_later(
    model_ctx, monkeypatch
):
    replay(
        model_ctx,
        monkeypatch,
        ("worker", {"how": "metadata", "i": 0}),
        ("worker", {"how": "success", "i": 0}),
    )
