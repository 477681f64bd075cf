"""The console at size (issue 43): the counts the database keeps as jobs change, the name search
and deep pages, on SQLite and PostgreSQL.

The kept counts (``sluice.storage.tallies``) must never drift from the jobs table, the source of
truth: after any mix of changes, by any path (a hand-written UPDATE included), folded or not, they
equal a count over the rows; a database made before them gets them counted in place. The pages'
reads are checked by their query plans: none of them walks the job rows it counts.
"""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from sqlalchemy import event, text
from sqlmodel import Session, select

from sluice.ops.drain import WorkLeft
from sluice.storage import queries
from sluice.storage.db import dispose_engines, get_engine
from sluice.storage.models import Job, JobStatus, Stage, utcnow
from tests.support.seed import seed_jobs

STATUSES = [s.value for s in JobStatus]
STAGES = [s.value for s in Stage]
KINDS = [None, "transient", "permanent", "user_action_required"]


@pytest.fixture
def engine(database_url):
    return get_engine(database_url)


def _over_rows(session: Session) -> dict:
    """What the console reads, counted over the rows as before the kept counts."""
    status = {
        s: n
        for s, n in session.execute(text("SELECT status, COUNT(*) FROM job GROUP BY status")).all()
    }
    documents = dict(
        session.execute(
            text(
                "SELECT dataset_id, COUNT(*) FROM document WHERE deleted_at IS NULL "
                "GROUP BY dataset_id"
            )
        ).all()
    )
    active = [
        tuple(r)
        for r in session.execute(
            text(
                "SELECT CAST(j.stage AS TEXT), j.done, j.total, d.size FROM job j "
                "JOIN document d ON d.id = j.document_id "
                "WHERE CAST(j.status AS TEXT) IN ('pending', 'running', 'retrying')"
            )
        ).all()
    ]
    return {"status": status, "documents": documents, "work": WorkLeft.of(active)}


def _read(session: Session) -> dict:
    counts = queries.status_counts(session=session)
    return {
        "status": {s: n for s, n in counts.items() if n},
        "documents": {
            d["id"]: d["documents"]
            for d in queries.dataset_summaries(session=session)
            if d["documents"]
        },
        "work": WorkLeft(*queries.remaining_work(session=session)),
    }


def _change(conn, rng: random.Random, ids: list[int], docs: list[int]) -> None:
    """One random change behind the engine's back: the triggers see every path."""
    what = rng.randrange(7)
    job, doc = rng.choice(ids), rng.choice(docs)
    if what == 0:
        conn.execute(
            text(
                "UPDATE job SET status = :s, error_kind = :k, finished_at = :f, chunk_count = :c "
                "WHERE id = :id"
            ),
            {
                "s": rng.choice(STATUSES),
                "k": rng.choice(KINDS),
                "f": utcnow() - timedelta(minutes=rng.randrange(3000))
                if rng.random() < 0.7
                else None,
                "c": rng.choice([None, 0, 5, 40]),
                "id": job,
            },
        )
    elif what == 1:
        conn.execute(
            text("UPDATE job SET stage = :st, done = :d, total = :t WHERE id = :id"),
            {"st": rng.choice(STAGES), "d": rng.randrange(60), "t": rng.randrange(60), "id": job},
        )
    elif what == 2:
        conn.execute(
            text("UPDATE document SET deleted_at = :at WHERE id = :id"),
            {"at": utcnow() if rng.random() < 0.6 else None, "id": doc},
        )
    elif what == 3:
        conn.execute(
            text("UPDATE document SET active_job_id = :j, size = :sz WHERE id = :id"),
            {"j": rng.choice([None, job]), "sz": rng.randrange(1, 10_000), "id": doc},
        )
    elif what == 4 and len(ids) > 10:
        conn.execute(text("DELETE FROM job_event WHERE job_id = :id"), {"id": job})
        conn.execute(text("DELETE FROM outbox WHERE job_id = :id"), {"id": job})
        conn.execute(text("DELETE FROM job WHERE id = :id"), {"id": job})
        ids.remove(job)
    elif what == 5:
        conn.execute(text("UPDATE job SET document_id = :d WHERE id = :id"), {"d": doc, "id": job})
    else:
        conn.execute(
            text("UPDATE job SET dataset_id = (SELECT MIN(id) FROM dataset) WHERE id = :id"),
            {"id": job},
        )


def test_the_kept_counts_are_a_count_over_the_rows_after_any_changes(engine):
    from sluice.storage import tallies

    seed_jobs(engine, 150, dataset="left", seed=1)
    seed_jobs(engine, 90, dataset="right", seed=2)
    with Session(engine) as session:
        ids = [r[0] for r in session.execute(text("SELECT id FROM job ORDER BY id")).all()]
        docs = [r[0] for r in session.execute(text("SELECT id FROM document ORDER BY id")).all()]
        assert tallies.drift(session) == {}
    rng = random.Random(43)
    for round_ in range(12):
        with engine.begin() as conn:
            for _ in range(rng.randrange(1, 25)):
                _change(conn, rng, ids, docs)
        if round_ % 3 == 1:
            tallies.fold(engine)  # as the recovery round does, between changes
        with Session(engine) as session:
            assert tallies.drift(session) == {}, round_
            assert _read(session) == _over_rows(session), round_
    with engine.begin() as conn:  # a rolled-back change leaves no delta behind
        conn.execute(text("UPDATE job SET status = 'failed', finished_at = :f"), {"f": utcnow()})
        conn.rollback()
    tallies.fold(engine)
    with Session(engine) as session:
        assert tallies.drift(session) == {}
        assert session.execute(text("SELECT COUNT(*) FROM tally_delta")).scalar() == 0
        # a count that came to nothing is no row (retention keeps the minutes bounded)
        assert not session.execute(
            text("SELECT COUNT(*) FROM tally WHERE n = 0 AND chunks = 0 AND size = 0")
        ).scalar()


def test_the_recovery_round_folds_the_counts(make_ctx, database_url):
    """The deltas the triggers write are summed by the worker's recovery round, so a read sums
    a row per count plus what changed since the last round."""
    from sluice.pipeline.queueing import recovery

    ctx = make_ctx()
    seed_jobs(ctx.engine, 30, dataset="folded", seed=3)
    with Session(ctx.engine) as session:
        assert session.execute(text("SELECT COUNT(*) FROM tally_delta")).scalar()
    recovery.run_once(ctx, publish=lambda _id: None)
    with Session(ctx.engine) as session:
        assert session.execute(text("SELECT COUNT(*) FROM tally_delta")).scalar() == 0
        assert queries.status_counts(session=session) == {
            s: n for s, n in _status_over_rows(session).items()
        }


def test_the_pages_fold_deltas_that_pile_up_when_no_worker_runs(
    database_url, make_ctx, monkeypatch
):
    """No worker, no recovery round: the overview, the jobs page and the datasets' summaries fold
    the deltas themselves once more than ``PILE`` wait, so their reads stay a few rows; below
    that they read the deltas as they are."""
    from sluice.ops import reads
    from sluice.pipeline.running.context import set_context
    from sluice.storage import tallies

    ctx = make_ctx()
    set_context(ctx)
    monkeypatch.setattr(tallies, "PILE", 40)
    seed_jobs(ctx.engine, 8, dataset="piled", seed=5)

    def waiting() -> int:
        with Session(ctx.engine) as session:
            return session.execute(text("SELECT COUNT(*) FROM tally_delta")).scalar_one()

    few = waiting()
    assert 0 < few <= 40
    reads.overview(None)
    assert waiting() == few  # under the pile: left for the recovery round
    seed_jobs(ctx.engine, 30, dataset="piled", seed=6)
    for seed, read in enumerate(
        (
            lambda: reads.overview(None),
            lambda: reads.jobs_page(
                queries.JobFilter(), sort="created_at", descending=True, page=1, page_size=50
            ),
            reads.dataset_summaries,
        ),
        start=7,
    ):
        assert waiting() > 40
        read()
        assert waiting() == 0
        with Session(ctx.engine) as session:
            assert queries.status_counts(session=session) == _status_over_rows(session)
            assert not tallies.drift(session)
        seed_jobs(ctx.engine, 30, dataset="piled", seed=seed)


def test_a_drift_past_the_triggers_is_counted_again_by_the_recovery_round(
    database_url, make_ctx, monkeypatch
):
    """A change no trigger saw (a trigger dropped by hand, or a PostgreSQL race of a job and its
    document, each changed unseen by the other's trigger) leaves a count wrong for good; the
    recovery round compares the counts with the rows hourly, in one statement, and counts again
    when any differs."""
    from sluice.pipeline.queueing import recovery
    from sluice.storage import tallies

    ctx = make_ctx()
    seed_jobs(ctx.engine, 30, dataset="drifted", seed=12)
    monkeypatch.setattr(recovery, "_last_heal", {})
    recovery.run_once(ctx, publish=lambda _id: None)  # the first round of a process compares
    assert tallies.heal(ctx.engine) == 0
    with ctx.engine.begin() as conn:  # seven pending jobs no row holds: a count gone wrong
        conn.execute(
            text(
                "INSERT INTO tally_delta (what, dataset_id, status, error_kind, minute, n, chunks, "
                "size) VALUES ('job', 1, 'pending', '', 0, 7, 0, 0)"
            )
        )
    with Session(ctx.engine) as session:
        assert tallies.drift(session)
    recovery.run_once(ctx, publish=lambda _id: None)  # within the hour: not compared
    with Session(ctx.engine) as session:
        assert tallies.drift(session)
    monkeypatch.setattr(recovery, "_last_heal", {})  # an hour later
    recovery.run_once(ctx, publish=lambda _id: None)
    with Session(ctx.engine) as session:
        assert not tallies.drift(session)
        assert queries.status_counts(session=session) == _status_over_rows(session)
    assert tallies.heal(ctx.engine) == 0


def _status_over_rows(session: Session) -> dict[str, int]:
    counts = {s.value: 0 for s in JobStatus}
    for s, n in session.execute(text("SELECT status, COUNT(*) FROM job GROUP BY status")).all():
        counts[JobStatus(s).value] = n
    return counts


def test_a_database_made_before_the_kept_counts_gets_them_counted_in_place(database_url):
    from sluice.storage import tallies

    engine = get_engine(database_url)
    seed_jobs(engine, 120, dataset="older", seed=4)
    with engine.begin() as conn:  # as an older Sluice left it: no triggers, no tables
        if engine.dialect.name == "postgresql":
            conn.execute(text("DROP FUNCTION tally_v1_job() CASCADE"))
            conn.execute(text("DROP FUNCTION tally_v1_document() CASCADE"))
        else:
            for (name,) in conn.execute(
                text("SELECT name FROM sqlite_master WHERE type = 'trigger' AND name LIKE 'tally%'")
            ).all():
                conn.execute(text(f"DROP TRIGGER {name}"))
        conn.execute(text("DROP TABLE tally"))
        conn.execute(text("DROP TABLE tally_delta"))
    with engine.begin() as conn:  # and changed since, with nothing counting
        conn.execute(text("UPDATE job SET status = 'cancelled' WHERE id % 4 = 0"))
        conn.execute(text("UPDATE document SET deleted_at = created_at WHERE id % 5 = 0"))
    dispose_engines()
    engine = get_engine(database_url)  # the schema check upgrades it
    with Session(engine) as session:
        assert tallies.drift(session) == {}
        assert _read(session) == _over_rows(session)
    assert tallies.install(engine) is False  # a second start finds them made


# --- the pages' query plans -----------------------------------------------------------------------


def _statements(engine, read) -> list[tuple[str, object]]:
    seen: list[tuple[str, object]] = []

    def record(conn, cursor, statement, params, context, executemany):
        seen.append((statement, params))

    event.listen(engine, "before_cursor_execute", record)
    try:
        with Session(engine) as session:
            read(session)
    finally:
        event.remove(engine, "before_cursor_execute", record)
    return seen


def _plans(engine, read) -> list[str]:
    with engine.connect() as conn:
        return [
            " / ".join(str(row[-1]) for row in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {s}", p))
            for s, p in _statements(engine, read)
        ]


@pytest.fixture
def sqlite_engine(tmp_path, store_env):
    engine = get_engine(f"sqlite:///{tmp_path / 'plans.db'}")
    seed_jobs(engine, 400, dataset="plans", seed=5)
    with engine.begin() as conn:
        conn.exec_driver_sql("ANALYZE")
    return engine


def test_the_overview_and_the_system_page_read_no_job_rows(sqlite_engine):
    """Counts per status, failures per kind, the day's chart, the datasets' summaries and the
    waiting work come from the kept counts: no plan scans the jobs or the documents."""
    now = utcnow()

    def reads(session):
        queries.status_counts(session=session)
        queries.failures_by_kind(session=session)
        queries.throughput(session=session, minutes=24 * 60, now=now, bucket_minutes=60)
        queries.throughput(session=session, minutes=60, now=now)
        queries.dataset_summaries(session=session)
        queries.remaining_work(session=session)

    plans = _plans(sqlite_engine, reads)
    assert plans
    scans = [p for p in plans if "SCAN job" in p or "SCAN document" in p or "SCAN j " in p]
    assert not scans, scans


def test_the_name_search_reads_names_only_and_ignores_case(sqlite_engine):
    """The name search picks its ids from the file name index, then sorts those: walking the
    page's order instead read every row for a name that matches none. Case is ignored, and % and
    _ are plain characters."""
    page = lambda name: (  # noqa: E731
        lambda s: queries.list_jobs(session=s, f=queries.JobFilter(name_contains=name))
    )
    plans = _plans(sqlite_engine, page("no such name"))
    assert any("COVERING INDEX ix_job_filename" in p for p in plans), plans
    assert not any("SCAN job USING INDEX" in p for p in plans), plans  # no row read in order
    with Session(sqlite_engine) as session:
        found = queries.list_jobs(session=session, f=queries.JobFilter(name_contains="DOC-5-00001"))
        assert found and all("doc-5-00001" in j.filename for j in found)
        assert [j.created_at for j in found] == sorted((j.created_at for j in found), reverse=True)
        assert not queries.list_jobs(session=session, f=queries.JobFilter(name_contains="doc_5"))
        assert not queries.list_jobs(session=session, f=queries.JobFilter(name_contains="%"))


def test_a_deep_page_skips_over_the_sort_index_alone(sqlite_engine):
    """The rows before a deep page are skipped in the (created_at, id) index, which holds all
    the skip needs; only the page's own rows are read, and they are the same rows in the same
    order, at any depth and by any sort."""
    deep = lambda s: queries.list_jobs(session=s, page=7, page_size=50)  # noqa: E731
    plans = _plans(sqlite_engine, deep)
    assert any("COVERING INDEX ix_job_created_id" in p for p in plans), plans
    with Session(sqlite_engine) as session:
        for sort in ("created", "updated", "filename", "status", "id"):
            for descending in (True, False):
                every = queries.list_jobs(
                    session=session, sort=sort, descending=descending, page=1, page_size=1000
                )
                pages = [
                    queries.list_jobs(
                        session=session, sort=sort, descending=descending, page=n, page_size=40
                    )
                    for n in range(1, 12)
                ]
                assert [j.id for p in pages for j in p] == [j.id for j in every], sort


def test_postgresql_serves_the_name_search_from_a_trigram_index(database_url):
    if not database_url.startswith("postgresql"):
        pytest.skip("the trigram index is PostgreSQL's")
    engine = get_engine(database_url)
    seed_jobs(engine, 200, dataset="named", seed=7)
    statement, params = _statements(
        engine,
        lambda s: queries.count_jobs(session=s, f=queries.JobFilter(name_contains="-0012")),
    )[-1]
    with engine.connect() as conn:
        # A table this small is read whole, or through the plain index of names: take both away
        # (in a transaction rolled back) to see whether the trigram index can answer the search.
        conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        conn.exec_driver_sql("SET LOCAL enable_indexscan = off")
        conn.exec_driver_sql("DROP INDEX ix_job_filename")
        plan = " ".join(r[0] for r in conn.exec_driver_sql(f"EXPLAIN {statement}", params))
        conn.rollback()
    assert "ix_job_filename_trgm" in plan, plan


def test_the_drain_rate_reads_the_newest_successes_only(engine, monkeypatch):
    """A busy hour is thousands of successes: the rate is measured on the newest of them (a fixed
    number, read from the newest end of the index), not on every one."""
    monkeypatch.setattr(queries, "RECENT_ATTEMPTS", 7)
    seed_jobs(engine, 120, dataset="busy", seed=8, spread_hours=0.5)
    since = utcnow() - timedelta(hours=1)
    with Session(engine) as session:
        got = queries.recent_attempts(session=session, since=since)
        succeeded = select(Job.finished_at).where(Job.status == JobStatus.succeeded)
        finished = sorted(session.exec(succeeded).all(), reverse=True)
    assert len(finished) > 7
    assert [r[1] for r in got] == finished[:7]


def test_the_trigram_index_is_built_concurrently_and_a_dead_build_is_redone(database_url):
    """Built ``CONCURRENTLY`` (writes to a large job table go on meanwhile); a build that died
    leaves an invalid index, which serves no read: the next schema check drops and builds it."""
    if not database_url.startswith("postgresql"):
        pytest.skip("the trigram index is PostgreSQL's")
    from sluice.storage.db import NAME_SEARCH_INDEX, add_name_search_index

    engine = get_engine(database_url)
    which = f"indexrelid = '{NAME_SEARCH_INDEX}'::regclass"
    valid = f"SELECT indisvalid FROM pg_index WHERE {which}"
    with engine.begin() as conn:
        assert conn.exec_driver_sql(valid).scalar() is True
        # what a build that died leaves (only a superuser can write pg_index: the test's role)
        conn.exec_driver_sql(f"UPDATE pg_index SET indisvalid = false WHERE {which}")
    seen: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *a: seen.append(a[2]))
    assert add_name_search_index(engine) is True
    assert any(s.startswith(f"DROP INDEX CONCURRENTLY IF EXISTS {NAME_SEARCH_INDEX}") for s in seen)
    assert any(s.startswith("CREATE INDEX CONCURRENTLY") for s in seen), seen
    with engine.connect() as conn:
        assert conn.exec_driver_sql(valid).scalar() is True
    assert add_name_search_index(engine) is False  # nothing left to make


def test_delta_ids_are_64_bit_on_postgresql_and_an_older_database_is_widened(database_url):
    """Each job change writes several deltas: a 32-bit serial would run out within months on a
    busy database, and every job write with it. A database made with one is widened in place."""
    if not database_url.startswith("postgresql"):
        pytest.skip("SQLite's rowid is 64-bit")
    from sluice.storage import tallies

    engine = get_engine(database_url)
    kind = text(
        "SELECT data_type FROM information_schema.columns WHERE table_schema = current_schema() "
        "AND table_name = 'tally_delta' AND column_name = 'id'"
    )
    top = text("SELECT max_value FROM pg_sequences WHERE sequencename = 'tally_delta_id_seq'")
    with engine.begin() as conn:
        assert conn.execute(kind).scalar() == "bigint" and conn.execute(top).scalar() == 2**63 - 1
        conn.execute(text("ALTER TABLE tally_delta ALTER COLUMN id TYPE INTEGER"))  # as made before
        conn.execute(text("ALTER SEQUENCE tally_delta_id_seq AS INTEGER"))
    seed_jobs(engine, 5, dataset="wide", seed=9)
    tallies.install(engine)  # the schema check's
    with engine.begin() as conn:
        assert conn.execute(kind).scalar() == "bigint" and conn.execute(top).scalar() == 2**63 - 1
    seed_jobs(engine, 5, dataset="wide", seed=10)
    tallies.fold(engine)
    with Session(engine) as session:
        assert not tallies.drift(session)


def test_a_trigger_of_another_version_is_dropped_not_counted_beside(engine):
    """A database holding a counting trigger of an older version (its name names it) gets the
    current set alone: the two would count every change twice."""
    from sluice.storage import tallies

    pg = engine.dialect.name == "postgresql"
    current = tallies._trigger_name("job", "INSERT")
    older = current.replace(f"tally_{tallies.VERSION}_", "tally_v0_")
    with engine.begin() as conn:
        if pg:
            function = f"tally_{tallies.VERSION}_job"
            conn.execute(
                text(
                    f"CREATE TRIGGER {older} AFTER INSERT ON job FOR EACH ROW "
                    f"EXECUTE FUNCTION {function}()"
                )
            )
        else:
            made = conn.execute(
                text("SELECT sql FROM sqlite_master WHERE name = :n"), {"n": current}
            ).scalar_one()
            conn.execute(text(made.replace(current, older, 1)))
    assert tallies.install(engine) is True  # the schema check's: the set was not this version's
    assert tallies.install(engine) is False
    seed_jobs(engine, 20, dataset="versions", seed=11)
    with Session(engine) as session:
        assert not tallies.drift(session)
