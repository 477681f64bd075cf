"""Every console page against a real database seeded with jobs in every state (AppTest,
in-process)."""

from __future__ import annotations

import pytest
from sqlmodel import Session

from sluice.pipeline.running.runner import run_job
from sluice.storage.models import Job, JobStatus
from tests.support.apptest import assert_ok, metric, open_console, texts
from tests.support.helpers import until
from tests.support.seed import seed_every_state


@pytest.fixture
def seeded(ctx):
    """Jobs in every state in the default dataset: {label: [job ids]} (see
    tests/support/seed.py)."""
    return seed_every_state(ctx)


def _upload_text(ctx, name: str) -> int:
    from sluice.ops.ingest import ingest_bytes

    return ingest_bytes(
        ctx, f"{name} is a small text file. ".encode() * 50, dataset="default", filename=name
    ).job_id


def test_overview_counts_queue_workers_and_failures(seeded):
    at = open_console()
    assert at.title[0].value == "Overview"
    assert metric(at, "succeeded") == "3"
    assert metric(at, "failed") == "5"
    for status in ("pending", "running", "retrying", "cancelled", "superseded"):
        assert metric(at, status) == "1", status
    assert metric(at, "Queue depth") == "0"  # nothing was published
    assert metric(at, "Workers alive") == "0"
    assert "No worker is alive, and 3 job(s) are waiting" in texts(at)
    assert metric(at, "Oldest pending job").endswith("ago")
    assert metric(at, "needs your action") == "3"
    assert metric(at, "permanent error") == "1"
    assert metric(at, "transient error") == "1"
    # five jobs finished in the last minutes: there is a measured rate, hence an estimate
    assert metric(at, "Queue drains in") not in ("—", "now empty")
    assert len(at.get("vega_lite_chart")) == 2  # jobs per minute, chunks per minute
    from sluice.ops import reads

    day = reads.overview(None).throughput_day  # the last 24 hours, an hour a bar, from the job rows
    assert (
        24 <= len(day) <= 25
        and sum(b["succeeded"] for b in day) == 3
        and sum(b["failed"] for b in day) == 5
    )


def test_first_visit_says_what_to_do_first_and_a_bad_dataset_link_says_so(ctx):
    at = open_console()
    assert "Nothing here yet. Start by uploading documents" in texts(at)
    assert any("Upload documents" in p.proto.label for p in at.get("page_link"))
    at = open_console(query={"dataset": "nosuch"})
    assert "There is no dataset named 'nosuch'; showing all datasets." in texts(at)


def test_overview_sees_a_live_worker_and_queued_messages(ctx, start_worker):
    from sluice.ops.ingest import ingest_bytes
    from sluice.pipeline.queueing.broker import workers_alive
    from sluice.pipeline.queueing.publishing import publish

    start_worker(workers=2)
    # every worker thread counts itself in on start; the presence key says so within a round or two
    until(
        lambda: any(w.get("threads") == 2 for w in workers_alive()),
        timeout=20,
        what="a presence key that counts both worker threads",
    )
    r = ingest_bytes(
        ctx, b"alpha beta gamma. " * 100, dataset="default", filename="a.txt", publish=publish
    )
    assert r.published
    at = open_console()
    assert metric(at, "Workers alive") == "1"
    assert "1 process(es), 2 thread(s)" in texts(at)
    assert "No worker is alive" not in texts(at)
    [fleet] = [d.value for d in at.dataframe if "threads" in d.value.columns]
    assert fleet["threads"].tolist() == [2] and fleet["up for"][0] != "—"


def test_overview_warns_when_the_queue_redis_is_down(seeded, services):
    services.queue.stop()
    try:
        at = open_console()
        assert "The queue Redis is unreachable" in texts(at)
        assert metric(at, "Queue depth") == "unknown"
        assert metric(at, "Workers alive") == "unknown"
        at.switch_page("views/jobs_page.py")
        at.query_params["job"] = str(seeded["pending"][0])
        at.run()
        assert_ok(at)
        assert "queue Redis is unreachable" in texts(at)
        at.switch_page("views/system_page.py").run()
        assert_ok(at)
        assert "queue Redis" in texts(at) and "unreachable" in texts(at)
    finally:
        services.queue.start()


def test_jobs_table_shows_stage_counts_and_a_progress_bar(seeded):
    at = open_console("jobs")
    assert "Jobs 1–13 of 13" in texts(at)
    table = at.dataframe[0].value
    assert len(table) == 13
    running = table[table["job"] == seeded["running"][0]].iloc[0]
    assert running["progress"] == "embedding 320/500 chunks"
    assert running["stage progress"] == 320 / 500
    queued = table[table["job"] == seeded["pending"][0]].iloc[0]
    assert queued["progress"] == "queued"
    assert (
        queued["stage progress"] != queued["stage progress"]
    )  # NaN: no bar while nothing is counted
    failed = table[table["job"] == seeded["failed:password_protected"][0]].iloc[0]
    assert "password-protected" in failed["error"]


def test_jobs_filters_sort_and_pagination_are_done_by_the_database(ctx, seeded):
    from tests.support.seed import seed_jobs

    seed_jobs(ctx.engine, 120, dataset="default", seed=7)
    at = open_console("jobs")
    assert f"of {120 + 13}" in texts(at)
    at.selectbox(key="rows").set_value(25).run()
    assert len(at.dataframe[0].value) == 25
    pager = at.get("pagination")[0]
    assert pager.proto.num_pages == -(-133 // 25)
    first_page = set(at.dataframe[0].value["job"])
    at.session_state["jobs_page"] = 2
    at.run()
    assert_ok(at)
    assert "Jobs 26–50 of 133" in texts(at)
    assert not first_page & set(at.dataframe[0].value["job"])

    at.multiselect(key="status").set_value(["failed"]).run()
    table = at.dataframe[0].value
    with Session(ctx.engine) as session:
        n_failed = session.query(Job).filter(Job.status == JobStatus.failed).count()
    assert f"of {n_failed}" in texts(at)
    assert set(table["status"]) == {"failed"}
    # a dead letter says where it stopped and how many attempts it used, never "1/5" as if more came
    assert all(p.startswith("stopped at ") for p in table["progress"])
    assert all(a.isdigit() for a in table["attempts"])
    at.multiselect(key="kind").set_value(["user_action_required"]).run()
    assert all(e.startswith("needs your action: ") for e in at.dataframe[0].value["error"])
    at.multiselect(key="status").set_value([]).run()
    at.multiselect(key="kind").set_value([]).run()
    at.text_input(key="q").set_value("password_protected").run()
    assert sorted(at.dataframe[0].value["file"]) == [
        "password_protected-0.pdf",
        "password_protected-1.pdf",
    ]
    at.text_input(key="q").set_value("").run()
    at.selectbox(key="sort").set_value("filename").run()
    at.toggle(key="desc").set_value(False).run()
    files = list(at.dataframe[0].value["file"])
    assert files == sorted(files)


def test_failed_job_detail_shows_attempts_error_kind_hint_and_detail(seeded):
    job_id = seeded["failed:chroma_unreachable"][0]
    at = open_console("jobs", query={"job": str(job_id)})
    page = texts(at)
    assert f"Job {job_id}" in page
    assert "gave up after 5 attempts: Chroma did not answer" in page
    assert "transient error" in page and "chroma unreachable" in page
    assert "What to do:" in page
    assert any("Error detail" in e.label for e in at.expander)
    timeline = at.dataframe[0].value
    assert [p for p in timeline["phase"] if p.startswith("attempt")] == [
        f"attempt {i}" for i in range(1, 6)
    ]
    assert list(timeline["phase"]).count("backoff wait") == 4
    assert set(timeline["worker"]) >= {"seed-host:4242"}
    assert at.button(key=f"retry_{job_id}")  # a failed job can be retried
    assert not [b for b in at.button if b.key and b.key.startswith(("cancel_", "reindex_"))]


def test_a_dead_letter_that_a_retry_cannot_fix_leads_with_what_helps(ctx, seeded):
    job_id = seeded["failed:password_protected"][0]
    at = open_console("jobs", query={"job": str(job_id)})
    assert not [b for b in at.button if b.key == f"retry_{job_id}" and b.proto.type == "primary"]
    assert any(
        p.proto.page.endswith("upload") or "upload" in p.proto.label.lower()
        for p in at.get("page_link")
    )
    at.button(
        key=f"retry_{job_id}"
    ).click().run()  # "Retry anyway" asks first, saying what will happen
    assert "fails the same way" in texts(at) and "Remove the password" in texts(at)
    at.button(key=f"retry_{job_id}:yes").click().run()
    assert_ok(at)
    assert "fails the same way" in texts(at)  # and says it again beside the result


def test_pending_job_says_where_it_waits_and_whether_workers_are_alive(ctx, seeded):
    from sluice.pipeline.queueing.broker import queued_job_ids
    from sluice.pipeline.queueing.publishing import publish
    from sluice.storage.outbox import dispatch

    pending = seeded["pending"][0]
    at = open_console("jobs", query={"job": str(pending)})
    assert "Not on the queue yet: its message waits in the outbox" in texts(
        at
    )  # seeded, not published

    later = _upload_text(ctx, "later.txt")
    dispatch(engine=ctx.engine, publish=publish)  # the pending job first, the later one last
    at.run()
    page = texts(at)
    assert f"Waiting in the queue: position 1 of {len(queued_job_ids())}" in page
    assert "no worker is alive" in page
    at.query_params["job"] = str(later)
    at.run()
    n = len(queued_job_ids())  # the seeded retrying job's first message went out too
    assert f"Waiting in the queue: position {n} of {n}" in texts(at)


def test_running_and_retrying_jobs_say_what_they_wait_for(make_ctx):
    # A lease far longer than the page takes to draw on a busy machine: the seeded heartbeat must
    # still be fresh when the page reads it (with the suite's 4 s lease it reads as a lost worker).
    seeded = seed_every_state(make_ctx(SLUICE_LEASE_SECONDS="600"))
    at = open_console("jobs", query={"job": str(seeded["running"][0])})
    assert "Running on seed-host:4242 (embedding 320/500 chunks)" in texts(at)
    assert "**Chunks**  \n500" in texts(at)  # the count the worker reported, not a dash
    at.query_params["job"] = str(seeded["retrying"][0])
    at.run()
    assert "Retrying: attempt 2 of 5 is due" in texts(at)


def test_every_page_can_be_narrowed_to_one_dataset(ctx, seeded):
    from tests.support.seed import seed_jobs

    seed_jobs(ctx.engine, 30, dataset="archive", seed=1)
    at = open_console("jobs")
    assert "of 43" in texts(at)
    at.sidebar.selectbox(key="dataset").set_value("archive").run()
    assert_ok(at)
    assert "of 30" in texts(at) and "dataset archive" in texts(at)
    assert "dataset" not in at.dataframe[0].value.columns
    at.switch_page("views/overview_page.py").run()
    assert (
        sum(
            int(metric(at, s).replace(",", ""))
            for s in (
                "pending",
                "running",
                "retrying",
                "succeeded",
                "failed",
                "cancelled",
                "superseded",
                "deleted",
            )
        )
        == 30
    )
    at.switch_page("views/dead_letters_page.py").run()
    assert all(set(df.value["dataset"]) == {"archive"} for df in at.dataframe)


def test_a_new_dataset_is_created_from_the_sidebar_and_selected(ctx):
    at = open_console()
    at.sidebar.text_input(key="new_dataset_name").set_value("contracts-2024")
    at.sidebar.button(key="create_dataset").click().run()
    assert_ok(at)
    assert at.sidebar.selectbox(key="dataset").value == "contracts-2024"
    assert "dataset 'contracts-2024' is ready" in texts(at)
    at.sidebar.text_input(key="new_dataset_name").set_value("../etc")
    at.sidebar.button(key="create_dataset").click().run()
    assert "A dataset name is 1 to 64" in texts(at)


def test_upload_page_reports_new_duplicate_and_refused_files(ctx, seeded):
    at = open_console("upload")
    # the browser may not drop any file by its name: every chosen file reaches Sluice and gets a
    # line
    assert list(at.get("file_uploader")[0].proto.type) == []
    duplicate = (
        b"Seeded document alpha number 0. "
        + b" ".join(f"alpha0word{j % 37}".encode() for j in range(400))
        + b"\n"
    )
    at.get("file_uploader")[0].set_value(
        [
            ("notes.md", b"# Notes\n\nSome markdown to index. " * 40, "text/markdown"),
            ("report-copy.txt", duplicate, "text/plain"),
            ("photo.pdf", b"\x89PNG\r\n\x1a\n" + b"\x00" * 64, "application/pdf"),
            ("slides.docx", b"PK\x03\x04" + b"\x00" * 64, "application/octet-stream"),
        ]
    )
    at.button[0].click().run()  # the form's Upload button
    assert_ok(at)
    page = texts(at)
    assert "4 file(s) chosen: 1 new job(s), 1 already uploaded, 2 refused." in page
    assert "slides.docx — refused: slides.docx is a damaged ZIP archive" in page  # a header only
    assert "1 of 2 job(s) finished; following them live." in page  # the duplicate is done already
    assert "already indexed as job" in page
    assert "unsupported file type: the bytes are image/png" in page
    assert "Convert the file to one of those" in page
    links = [p.proto.page for p in at.get("page_link")]
    assert links  # every accepted file links to its job
    with Session(ctx.engine) as session:
        assert (
            session.query(Job).filter(Job.filename == "notes.md").one().status == JobStatus.pending
        )
        assert session.query(Job).filter(Job.filename == "photo.pdf").count() == 0
        notes = session.query(Job).filter(Job.filename == "notes.md").one().id

    # The result follows its jobs: once the new one has run, the next refresh says so.
    run_job(notes, ctx=ctx)
    at.run()
    assert "2 of 2 job(s) finished." in texts(at)

    # The duplicate offers a reindex, which asks first.
    existing = seeded["succeeded"][0]
    at.button(key="upload_reindex_1").click().run()
    with Session(ctx.engine) as session:
        assert session.get(Job, existing).status == JobStatus.succeeded
    at.button(key="upload_reindex_1:yes").click().run()
    assert_ok(at)
    with Session(ctx.engine) as session:
        assert session.get(Job, existing).status == JobStatus.pending


def test_search_page_returns_file_page_score_and_text_of_active_chunks_only(ctx, seeded):
    at = open_console("search")
    at.text_input(key="q").set_value("alpha0word5 alpha0word6")
    at.button[0].click().run()
    assert_ok(at)
    page = texts(at)
    assert "report-0.txt" in page and "page 1" in page
    assert "score" in page
    assert any("alpha0word5" in t.value for t in at.text)
    # the superseded run of handbook.txt is never answered, only its newer job
    at.text_input(key="q").set_value("gamma2word1 gamma2word2").run()
    at.button[0].click().run()
    links = [p.proto.query_string for p in at.get("page_link")]
    assert f"job={seeded['superseded'][0]}" not in " ".join(links)


def test_search_keeps_the_query_in_the_url_says_when_empty_spans_all_datasets_min_score(
    ctx,
):
    from sluice.ops.ingest import ingest_bytes
    from sluice.pipeline.running.runner import run_job

    for name, words in (
        ("default", "lighthouse keeper logbook"),
        ("contracts", "lighthouse tender invoice"),
    ):
        r = ingest_bytes(
            ctx, ((words + " entry. ") * 40).encode(), dataset=name, filename=f"{name}.txt"
        )
        assert run_job(r.job_id, ctx=ctx).result == "succeeded"
    at = open_console("search")
    at.button[0].click().run()  # nothing typed
    assert "Type something to search for" in texts(at)

    at.text_input(key="q").set_value("lighthouse")
    at.button[0].click().run()
    assert_ok(at)
    page = texts(at)
    assert "from all datasets" in page and "default.txt" in page and "contracts.txt" in page
    # the query lives in the URL: opening the link again shows the same search
    again = open_console("search", query={"q": "lighthouse", "in": "contracts"})
    assert "from dataset 'contracts'" in texts(again) and "contracts.txt" in texts(again)
    assert "default.txt" not in texts(again)

    # weak hits are never hidden quietly: the threshold is the explicit Minimum score
    at.selectbox(key="mode").set_value("dense")
    at.text_input(key="q").set_value("zzqx unrelated words")
    at.button[0].click().run()
    assert_ok(at)
    assert "weak match" not in texts(at) and "chunk(s) from" in texts(at)
    at.number_input(key="search_min_score").set_value(1.0)
    at.button[0].click().run()
    assert_ok(at)
    assert "0 chunk(s) from all datasets" in texts(at) and "at least 1" in texts(at)


def test_system_page_shows_config_services_versions_and_never_a_secret(make_ctx):
    ctx = make_ctx(
        SLUICE_CONSOLE_READONLY_PASSWORD="peek-only-8d1f", SLUICE_CHROMA_TOKEN="tok-secret-4c2a"
    )
    at = open_console("system")
    page = texts(at)
    assert f"Instance `{ctx.instance_id}`" in page
    assert "queue Redis" in page and "cache Redis" in page and "chroma" in page
    assert page.count(": reachable") == 3
    assert metric(at, "Precision in force") == "fp32"
    config = dict(
        zip(at.dataframe[1].value["variable"], at.dataframe[1].value["value"], strict=True)
    )
    assert config["SLUICE_CHROMA_TOKEN"] == "set"
    assert config["SLUICE_CONSOLE_READONLY_PASSWORD"] == "set"
    assert config["SLUICE_CONSOLE_PASSWORD"] == "not set"
    versions = dict(
        zip(
            at.dataframe[3].value["package (installed here)"],
            at.dataframe[3].value["version"],
            strict=True,
        )
    )
    assert versions["streamlit"].startswith("1.") and "torch" in versions and "huey" in versions
    everything = page + "".join(df.value.to_csv() for df in at.dataframe)
    assert "peek-only-8d1f" not in everything and "tok-secret-4c2a" not in everything


def test_every_page_and_a_bulk_retry_on_each_job_store(database_url, make_ctx):
    """The same pages on SQLite and, with SLUICE_TEST_DATABASE_URL set, on PostgreSQL."""
    from tests.support.seed import seed_jobs

    ctx = make_ctx()
    ids = seed_every_state(ctx)
    seed_jobs(ctx.engine, 200, dataset="archive", seed=3)
    at = open_console()
    assert metric(at, "failed") != "0"
    for page in ("upload", "jobs", "dead_letters", "search", "system"):
        at.switch_page(f"views/{page}_page.py").run()
        assert_ok(at)
    at.switch_page("views/jobs_page.py").run()
    at.text_input(key="q").set_value("protected").run()
    assert sorted(at.dataframe[0].value["file"]) == [
        "password_protected-0.pdf",
        "password_protected-1.pdf",
    ]
    at.switch_page("views/dead_letters_page.py").run()
    at.sidebar.selectbox(key="dataset").set_value("default").run()
    at.button(key="retry_all:user_action_required:password_protected").click().run()
    at.button(key="retry_all:user_action_required:password_protected:yes").click().run()
    assert_ok(at)
    with Session(ctx.engine) as session:
        assert {session.get(Job, i).status for i in ids["failed:password_protected"]} == {
            JobStatus.pending
        }


def test_a_running_job_is_judged_by_the_database_clock_not_the_consoles(seeded, monkeypatch):
    """The console's host runs two minutes ahead: a healthy running job (heartbeat just written with
    the database's clock) must not read as stalled."""
    from datetime import timedelta

    from sluice.storage import models

    real = models.utcnow
    monkeypatch.setattr(models, "utcnow", lambda: real() + timedelta(seconds=120))
    at = open_console("jobs", query={"job": str(seeded["running"][0])})
    page = texts(at)
    assert "Running on seed-host:4242 (embedding 320/500 chunks)" in page and "Stalled" not in page


def test_system_page_says_when_recovery_last_ran_and_when_reaping_is_held(make_ctx):
    """The fleet's reaper tick is on the System page: never run, ran recently, silent too long, and
    the grace after a silence during which no running job is taken back."""
    from datetime import timedelta

    from sqlalchemy import update
    from sqlmodel import select

    from sluice.pipeline.queueing import recovery
    from sluice.storage.models import Instance

    # Beats of 20 s make the grace after a silence a minute (three beats), longer than the console
    # takes to draw on a busy machine; with the suite's 0.5 s beats it is over before it shows.
    ctx = make_ctx(SLUICE_LEASE_SECONDS="240", SLUICE_HEARTBEAT_SECONDS="20")

    def system() -> str:
        at = open_console()
        at.switch_page("views/system_page.py").run()
        assert_ok(at)
        return texts(at)

    assert "no worker's recovery round has run yet" in system()
    recovery.run_once(ctx, publish=lambda _id: None)
    page = system()
    assert "the last round of any worker ran" in page and "is held for" not in page

    with Session(ctx.engine) as session:  # every reaper silent for longer than counts as an outage
        tick = session.exec(select(Instance)).one().reaper_tick_at
        session.execute(
            update(Instance).values(
                reaper_tick_at=tick - timedelta(seconds=recovery.silence_seconds(ctx.settings) + 5)
            )
        )
        session.commit()
    assert "No worker's recovery round has run for" in system()

    recovery.run_once(ctx, publish=lambda _id: None, hold=recovery.ReapHold())  # the tick after it
    page = system()
    assert (
        "Taking stalled jobs back is held for" in page
        and "the last round of any worker ran" in page
    )


def test_system_page_charts_chunks_and_jobs_per_second_over_the_last_hour(ctx):
    from sluice.ops import reads
    from sluice.ops.ingest import ingest_bytes

    assert "No job finished in the last hour" in texts(open_console("system"))
    body = b"Harbour notes. " * 200
    r = ingest_bytes(ctx, body, dataset="default", filename="notes.txt")
    assert run_job(r.job_id, ctx=ctx).result == "succeeded"
    with Session(ctx.engine) as session:
        chunks = session.get(Job, r.job_id).chunk_count
    rates = reads.rates_last_hour()
    assert round(sum(m["jobs per second"] for m in rates) * 60) == 1
    assert round(sum(m["chunks per second"] for m in rates) * 60) == chunks
    at = open_console("system")
    assert_ok(at)
    assert "Chunks and jobs per second over the last hour" in texts(at)
    charts = []

    def walk(node) -> None:
        if getattr(node, "type", "") == "vega_lite_chart":
            charts.append(node)
        for child in getattr(node, "children", {}).values():
            walk(child)

    walk(at.main)
    assert len(charts) == 2  # chunks per second, jobs per second
