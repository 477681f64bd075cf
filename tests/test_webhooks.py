"""Webhooks against a real local HTTP receiver: an event per endpoint written with the transition
that ends a job (none when the transition loses its race), posted signed (the receiver checks the
HMAC and refuses a replayed timestamp), retried with backoff while the receiver is down and
delivered when it comes back (the job unaffected), given up after the maximum age, a slow endpoint
cut by its timeout, and never posted twice by two racing dispatchers.

The dispatcher runs directly in the tests; one test runs it from a real worker.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from sqlalchemy import update
from sqlmodel import Session, select

from sluice import faults
from sluice.errors import JobCancelled
from sluice.pipeline.queueing import webhook_delivery
from sluice.servers.processes import free_loopback_port
from sluice.settings import reset_settings_cache
from sluice.storage import jobs, webhook_records
from sluice.storage.clock import db_now
from sluice.storage.db import ensure_dataset, get_engine
from sluice.storage.models import Document, ErrorKind, Job, JobStatus, WebhookDelivery
from tests.support.helpers import Background, until

SECRET = "test-webhook-secret-9f1c-of-32-bytes-or-more"


class Receiver:
    """A webhook endpoint on loopback: records each request, answers with ``status`` (after holding
    it until ``release`` is set, when ``hold`` is on); ``stop()`` makes it down, ``start()`` up
    again on the same port."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_loopback_port()
        self.requests: list[dict] = []
        self.status = 200
        self.hold = False
        self.release = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.requests.append(
                    {"headers": dict(self.headers), "body": body, "at": time.time()}
                )
                if receiver.hold:
                    receiver.release.wait(10)
                try:
                    self.send_response(receiver.status)
                    self.end_headers()
                    self.wfile.write(b"ok")
                except (BrokenPipeError, ConnectionResetError):
                    pass  # a held answer: the sender gave up at its own timeout, as tested

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self.release.set()
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(5)
            self._server = None


@pytest.fixture
def receivers():
    made: list[Receiver] = []

    def make(port: int | None = None, *, started: bool = True) -> Receiver:
        r = Receiver(port)
        made.append(r)
        return r.start() if started else r

    yield make
    for r in made:
        r.stop()


@pytest.fixture
def hooked(database_url, monkeypatch):
    """An engine whose settings send webhooks to the URLs given: hooked(url, ...)."""

    def configure(*urls: str):
        monkeypatch.setenv("SLUICE_WEBHOOK_URLS", ",".join(urls))
        monkeypatch.setenv("SLUICE_WEBHOOK_SECRET", SECRET)
        reset_settings_cache()
        return get_engine(database_url)

    yield configure
    reset_settings_cache()


def running_job(engine, n: int = 1) -> tuple[int, int]:
    """A claimed job: (job id, lease)."""
    sha = f"{n:064x}"
    with Session(engine, expire_on_commit=False) as session:
        ds = ensure_dataset(session=session, name="default")
        doc = Document(
            dataset_id=ds.id,
            sha256=sha,
            size=10,
            media_type="application/pdf",
            filename=f"report-{n}.pdf",
            blob_key=sha,
        )
        session.add(doc)
        session.flush()
        job, _ = jobs.create_job(
            session=session,
            document=doc,
            pipeline_version="vtest",
            idempotency_key=f"{ds.id}:{sha}:vtest",
            max_attempts=3,
        )
        session.commit()
        claimed = jobs.claim(session=session, job_id=job.id, worker_id="w1", lease_seconds=30)
        assert claimed.claimed
        return job.id, claimed.job.lease


def succeed(engine, job_id: int, lease: int) -> None:
    with Session(engine) as session:
        jobs.succeed(
            session=session,
            job_id=job_id,
            lease=lease,
            worker_id="w1",
            built=jobs.Built(chunks=3, pages=1, embedded=3, cached=0),
        )


def fail(engine, job_id: int, lease: int, kind: ErrorKind) -> None:
    with Session(engine) as session:
        jobs.fail(
            session=session,
            job_id=job_id,
            lease=lease,
            error=jobs.JobError(kind, "bad_pdf", "no text", "upload a text PDF"),
            worker_id="w1",
            retry=jobs.RetryPolicy(base_delay=0.1, max_delay=0.2),
        )


def deliveries(engine, job_id: int | None = None) -> list[WebhookDelivery]:
    with Session(engine) as session:
        query = select(WebhookDelivery).order_by(WebhookDelivery.id)
        if job_id is not None:
            query = query.where(WebhookDelivery.job_id == job_id)
        return list(session.exec(query).all())


def deliver(engine, **kw) -> webhook_delivery.DeliveryReport:
    kw = {
        "secret": SECRET,
        "timeout": 2.0,
        "max_age_seconds": 3600.0,
        "base": 0.05,
        "cap": 0.2,
        **kw,
    }
    return webhook_delivery.deliver_due(engine=engine, **kw)


def check_signed(request: dict, *, now: float | None = None) -> dict:
    """What a receiver does: recompute the HMAC over "<timestamp>.<body>", refuse old timestamps."""
    headers, body = request["headers"], request["body"]
    timestamp = headers["X-Sluice-Timestamp"]
    expected = (
        "v1="
        + hmac.new(SECRET.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    )
    assert hmac.compare_digest(headers["X-Sluice-Signature"], expected)
    assert webhook_records.verify(
        SECRET,
        timestamp=timestamp,
        body=body,
        signature=headers["X-Sluice-Signature"],
        now=now or time.time(),
    )
    return json.loads(body)


# --- events written with the transition ----------------------------------------------------------


def test_final_transitions_write_one_event_per_endpoint_in_their_transaction(hooked):
    engine = hooked("http://127.0.0.1:9/a", "http://127.0.0.1:9/b")
    ok, lease = running_job(engine, 1)
    succeed(engine, ok, lease)
    dead, lease = running_job(engine, 2)
    fail(engine, dead, lease, ErrorKind.permanent)
    again, lease = running_job(engine, 3)
    fail(engine, again, lease, ErrorKind.transient)  # retrying: not final, no event
    with Session(engine) as session:
        jobs.request_cancel(session=session, job_ids=[again], actor="ops")

    rows = deliveries(engine)
    assert sorted((r.job_id, r.event, r.endpoint[-1]) for r in rows) == [
        (ok, "job.succeeded", "a"),
        (ok, "job.succeeded", "b"),
        (dead, "job.failed", "a"),
        (dead, "job.failed", "b"),
        (again, "job.cancelled", "a"),
        (again, "job.cancelled", "b"),
    ]
    for r in rows:
        body = json.loads(r.body)
        assert (
            body["type"] == r.event and body["id"] == r.event_id and body["job"]["id"] == r.job_id
        )
        assert r.delivered_at is None and r.attempts == 0
    assert len({r.event_id for r in rows}) == 3  # one event, the same id for both endpoints
    failed = json.loads(next(r.body for r in rows if r.event == "job.failed"))["job"]
    assert (
        failed["status"],
        failed["error_kind"],
        failed["error_code"],
        failed["fix_hint"],
        failed["dataset"],
    ) == ("failed", "permanent", "bad_pdf", "upload a text PDF", "default")


def test_a_webhook_carries_the_event_log_id_the_stream_gives_the_same_transition(hooked):
    """One event log: a webhook's event id is the job event's id, which the API's stream sends."""
    from sluice.api import event_stream
    from sluice.api.authentication import authenticate
    from tests.support.api_server import make_key

    engine = hooked("http://127.0.0.1:9/a", "http://127.0.0.1:9/b")
    ok, lease = running_job(engine, 1)
    succeed(engine, ok, lease)
    dead, lease = running_job(engine, 2)
    fail(engine, dead, lease, ErrorKind.permanent)
    stopped, lease = running_job(engine, 3)
    with Session(engine) as session:
        jobs.request_cancel(session=session, job_ids=[stopped], actor="ops")
        jobs.acknowledge_cancel(session=session, job_id=stopped, lease=lease, worker_id="w1")
    key = authenticate(make_key("reader", datasets=None, scope="read"))  # a stream checks its key
    assert key is not None
    cursor = event_stream.open_cursor(key, dataset=None, after=0)
    streamed = {
        (e.data["job"]["id"], e.type): e.id
        for e in event_stream.poll(cursor)
        if e.type in webhook_records.EVENTS
    }
    hooks = {(r.job_id, r.event): r.event_id for r in deliveries(engine)}
    assert len(streamed) == 3 and {k: str(v) for k, v in streamed.items()} == hooks
    for r in deliveries(engine):
        assert json.loads(r.body)["id"] == r.event_id  # the body, the header and the row agree


def test_a_success_that_loses_to_a_cancel_writes_no_success_event(hooked):
    """The event is part of the transition: when the success is rolled back, so is its event."""
    engine = hooked("http://127.0.0.1:9/a")
    job_id, lease = running_job(engine)

    def cancel_meanwhile(**info):
        with Session(engine) as other:
            other.execute(
                update(Job)
                .where(Job.id == info["job_id"])
                .values(cancel_requested=True, version=Job.version + 1)
            )
            other.commit()

    with faults.hook("before_supersede", cancel_meanwhile), pytest.raises(JobCancelled):
        succeed(engine, job_id, lease)
    assert deliveries(engine) == []
    with Session(engine) as session:
        jobs.acknowledge_cancel(session=session, job_id=job_id, lease=lease, worker_id="w1")
    assert [r.event for r in deliveries(engine)] == ["job.cancelled"]


def test_no_endpoint_no_rows(database_url):
    engine = get_engine(database_url)
    job_id, lease = running_job(engine)
    succeed(engine, job_id, lease)
    assert deliveries(engine) == []


# --- delivery -------------------------------------------------------------------------------------


def test_delivered_signed_once_and_a_replay_is_refused(hooked, receivers):
    receiver = receivers()
    engine = hooked(receiver.url)
    job_id, lease = running_job(engine)
    succeed(engine, job_id, lease)

    report = deliver(engine)
    assert report.delivered == [deliveries(engine)[0].id]
    [request] = receiver.requests
    body = check_signed(request)
    assert (
        body["type"] == "job.succeeded"
        and body["job"]["id"] == job_id
        and body["job"]["chunk_count"] == 3
    )
    assert request["headers"]["X-Sluice-Event-Id"] == body["id"]
    [row] = deliveries(engine)
    assert row.delivered_at is not None and row.last_status == 200 and row.attempts == 1
    assert deliver(engine).delivered == [] and len(receiver.requests) == 1  # delivered means done

    # A replay of the same request an hour later fails the receiver's timestamp check; a
    # timestamp changed to look fresh fails the signature.
    h = request["headers"]
    assert not webhook_records.verify(
        SECRET,
        timestamp=h["X-Sluice-Timestamp"],
        body=request["body"],
        signature=h["X-Sluice-Signature"],
        now=time.time() + 3600,
    )
    assert not webhook_records.verify(
        SECRET,
        timestamp=str(int(time.time()) + 3600),
        body=request["body"],
        signature=h["X-Sluice-Signature"],
        now=time.time() + 3600,
    )
    assert not webhook_records.verify(
        "another-secret",
        timestamp=h["X-Sluice-Timestamp"],
        body=request["body"],
        signature=h["X-Sluice-Signature"],
        now=time.time(),
    )


def test_a_receiver_down_for_a_while_gets_every_event_once_it_is_back(hooked, receivers):
    down = receivers(started=False)  # its port is free: connections are refused
    erroring = receivers()
    erroring.status = 503
    engine = hooked(down.url, erroring.url)
    job_ids = []
    for n in range(3):
        job_id, lease = running_job(engine, n)
        started = time.monotonic()
        succeed(engine, job_id, lease)
        assert time.monotonic() - started < 2  # the transition never waits for an endpoint
        job_ids.append(job_id)

    report = deliver(engine)
    # One failure per endpoint per round: the endpoint's other rows wait for the next round.
    assert len(report.failed) == 2 and not report.delivered
    assert len(erroring.requests) == 1
    rows = {r.id: r for r in deliveries(engine)}
    for row_id in report.failed:
        row = rows[row_id]
        assert row.attempts == 1 and row.delivered_at is None and row.gave_up_at is None
        assert row.next_attempt_at > row.created_at  # backoff: not due again at once
        assert row.last_error
    assert (
        rows[report.failed[1]].last_status == 503
        and "HTTP 503" in rows[report.failed[1]].last_error
    )
    assert "Connect" in rows[report.failed[0]].last_error

    def round_then(predicate):
        deliver(engine)
        return predicate(deliveries(engine))

    until(
        lambda: round_then(lambda rows: sum(r.attempts for r in rows) >= 8),
        interval=0.05,
        timeout=20,
        what="several rounds of retries while both endpoints fail",
    )
    assert all(r.delivered_at is None for r in deliveries(engine))
    with Session(engine) as session:  # the jobs are done and know nothing of it
        assert {session.get(Job, j).status for j in job_ids} == {JobStatus.succeeded}

    down.start()
    erroring.status = 200
    until(
        lambda: round_then(lambda rows: all(r.delivered_at for r in rows)),
        interval=0.05,
        timeout=20,
        what="every event delivered once the receivers are back",
    )
    for receiver in (down, erroring):
        got = [check_signed(r) for r in receiver.requests if r["headers"].get("X-Sluice-Event")]
        ok_ids = {b["job"]["id"] for b in got}
        assert ok_ids == set(job_ids)
    assert len(down.requests) == 3  # refused connections never reached it; then each event once
    assert deliver(engine).anything is False


def test_given_up_after_the_maximum_age_and_shown_so(hooked, receivers):
    receiver = receivers()
    receiver.status = 500
    engine = hooked(receiver.url)
    job_id, lease = running_job(engine)
    succeed(engine, job_id, lease)
    report = deliver(engine, max_age_seconds=0.001)
    [row] = deliveries(engine)
    assert report.gave_up == [row.id]
    assert row.gave_up_at is not None and row.delivered_at is None and row.last_status == 500
    assert webhook_records.delivery_state(row) == "gave up"
    assert deliver(engine).anything is False and len(receiver.requests) == 1


def test_a_slow_endpoint_is_cut_by_its_timeout(hooked, receivers):
    slow = receivers()
    slow.hold = True  # answers only when released: never, within the timeout
    engine = hooked(slow.url)
    job_id, lease = running_job(engine)
    succeed(engine, job_id, lease)
    started = time.monotonic()
    report = deliver(engine, timeout=0.5)
    took = time.monotonic() - started
    slow.release.set()
    [row] = deliveries(engine)
    assert report.failed == [row.id] and "timed out" in row.last_error
    assert took < 3, f"a delivery round took {took:.1f}s against a 0.5s timeout"


def test_two_dispatchers_never_post_one_row_twice(hooked, receivers):
    """Both dispatchers read the same due row before either claims it; one claim wins."""
    receiver = receivers()
    engine = hooked(receiver.url)
    job_id, lease = running_job(engine)
    succeed(engine, job_id, lease)
    both_read = threading.Barrier(2, timeout=10)

    with faults.hook("webhook_selected", lambda **_: both_read.wait()):
        runs = [Background(lambda: deliver(engine), name=f"dispatcher-{i}") for i in range(2)]
        for run in runs:
            run.start()
        reports = [run.result(timeout=20) for run in runs]
    assert sorted(len(r.delivered) for r in reports) == [0, 1]
    assert sorted(len(r.lost) for r in reports) == [0, 1]
    assert len(receiver.requests) == 1
    [row] = deliveries(engine)
    assert row.attempts == 1 and row.delivered_at is not None


def test_a_dispatcher_that_dies_mid_post_leaves_the_row_to_another_after_the_hold(
    hooked, receivers
):
    receiver = receivers()
    engine = hooked(receiver.url)
    job_id, lease = running_job(engine)
    succeed(engine, job_id, lease)

    def die(**_):
        raise SystemExit("killed after its claim")

    with faults.hook("webhook_claimed", die), pytest.raises(SystemExit):
        deliver(engine, hold_seconds=0.5)
    [row] = deliveries(engine)
    assert row.attempts == 1 and row.delivered_at is None and not receiver.requests
    assert deliver(engine).anything is False  # still held by the dead claim
    until(
        lambda: deliver(engine).delivered,
        interval=0.05,
        timeout=10,
        what="the row posted after the hold",
    )
    assert len(receiver.requests) == 1 and deliveries(engine)[0].attempts == 2


# --- the log, the command, retention --------------------------------------------------------------


@pytest.fixture
def one_delivered_one_waiting(hooked, receivers, make_ctx):
    """A job that succeeded, its event delivered to a live receiver and waiting for a dead URL:
    make(dead_url) -> (receiver, job id)."""

    def make(dead_url: str) -> tuple[Receiver, int]:
        receiver = receivers()
        engine = hooked(receiver.url, dead_url)
        make_ctx()
        job_id, lease = running_job(engine)
        succeed(engine, job_id, lease)
        deliver(engine)
        return receiver, job_id

    return make


def test_cli_webhooks_lists_deliveries_per_endpoint(one_delivered_one_waiting, capsys):
    from sluice.cli.main import main

    receiver, job_id = one_delivered_one_waiting("http://user:pw-hidden@127.0.0.1:9/never")

    assert main(["webhooks", "--json"]) == 0
    log = json.loads(capsys.readouterr().out)
    by_endpoint = {e["endpoint"]: e for e in log["endpoints"]}
    assert by_endpoint[receiver.url]["delivered"] == 1
    assert by_endpoint["http://user:***@127.0.0.1:9/never"]["waiting"] == 1
    states = sorted((d["state"], d["job_id"]) for d in log["deliveries"])
    assert states == [("delivered", job_id), ("retrying", job_id)]
    assert main(["webhooks"]) == 0
    out = capsys.readouterr().out
    assert receiver.url in out and "1 delivered" in out and "pw-hidden" not in out


def test_retention_prunes_finished_deliveries_only(hooked, receivers):
    from datetime import timedelta

    from sluice.storage import retention
    from sluice.storage.models import utcnow

    receiver = receivers()
    engine = hooked(receiver.url, "http://127.0.0.1:9/down")
    job_id, lease = running_job(engine)
    succeed(engine, job_id, lease)
    deliver(engine)
    old = utcnow() - timedelta(days=40)
    with Session(engine) as session:
        session.execute(
            update(WebhookDelivery)
            .where(WebhookDelivery.delivered_at.is_not(None))
            .values(delivered_at=old, created_at=old)
        )
        session.commit()
    cutoff = utcnow() - timedelta(days=30)
    with Session(engine) as session:
        assert retention.prune(session=session, cutoff=cutoff, dry_run=True).webhooks == 1
        assert retention.prune(session=session, cutoff=cutoff, dry_run=False).webhooks == 1
    assert [r.endpoint for r in deliveries(engine)] == [
        "http://127.0.0.1:9/down"
    ]  # still being tried


# --- settings -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "env, message",
    [
        ({"SLUICE_WEBHOOK_URLS": "https://hooks.example/a"}, "SLUICE_WEBHOOK_SECRET"),
        (
            {"SLUICE_WEBHOOK_URLS": "https://hooks.example/a", "SLUICE_WEBHOOK_SECRET": "changeme"},
            "placeholder",
        ),
        (
            {"SLUICE_WEBHOOK_URLS": "ftp://hooks.example/a", "SLUICE_WEBHOOK_SECRET": SECRET},
            "SLUICE_WEBHOOK_URLS",
        ),
        (  # one character was accepted before
            {"SLUICE_WEBHOOK_URLS": "https://hooks.example/a", "SLUICE_WEBHOOK_SECRET": "x"},
            "at least 32",
        ),
        (  # plain http:// across the network was accepted before
            {"SLUICE_WEBHOOK_URLS": "http://hooks.example/a", "SLUICE_WEBHOOK_SECRET": SECRET},
            "SLUICE_WEBHOOK_ALLOW_HTTP",
        ),
    ],
    ids=["no-secret", "placeholder-secret", "not-http", "short-secret", "http-off-loopback"],
)
def test_webhook_settings_are_refused_when_unsafe(store_env, monkeypatch, env, message):
    from sluice.errors import SettingsError
    from sluice.settings import load_settings

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SettingsError, match=message) as info:
        load_settings()
    assert SECRET not in str(info.value)


def test_webhook_settings_parse_a_comma_list(store_env, monkeypatch):
    from sluice.settings import load_settings

    monkeypatch.setenv("SLUICE_WEBHOOK_URLS", " https://a.example/h , http://127.0.0.1:8000/h,")
    monkeypatch.setenv("SLUICE_WEBHOOK_SECRET", SECRET)
    s = load_settings()
    assert s.webhook_urls == ["https://a.example/h", "http://127.0.0.1:8000/h"]
    assert (
        s.public_view()["SLUICE_WEBHOOK_SECRET"] == "set"
        and s.secrets_status()["SLUICE_WEBHOOK_SECRET"]
    )


# --- from a real worker ---------------------------------------------------------------------------


def test_a_real_worker_posts_the_events_of_its_jobs(make_ctx, start_worker, receivers):
    from sluice.ops.ingest import ingest_bytes
    from sluice.pipeline.queueing.publishing import publish
    from tests.support.helpers import wait_for
    from tests.support.pdfmaker import invalid_page_count, text_pdf

    receiver = receivers()
    ctx = make_ctx(SLUICE_WEBHOOK_URLS=receiver.url, SLUICE_WEBHOOK_SECRET=SECRET)
    start_worker(workers=1)
    good = ingest_bytes(
        ctx,
        text_pdf(["webhooks from a real worker"]),
        dataset="default",
        filename="good.pdf",
        publish=publish,
    )
    bad = ingest_bytes(
        ctx, invalid_page_count(), dataset="default", filename="bad.pdf", publish=publish
    )
    done = {j.id: j.status for j in wait_for(ctx, [good.job_id, bad.job_id], timeout=90)}
    assert done == {good.job_id: JobStatus.succeeded, bad.job_id: JobStatus.failed}

    until(lambda: len(receiver.requests) >= 2, timeout=30, what="both events posted by the worker")
    events = {b["job"]["id"]: b["type"] for b in (check_signed(r) for r in receiver.requests)}
    assert events == {good.job_id: "job.succeeded", bad.job_id: "job.failed"}
    assert len(receiver.requests) == 2
    # the worker records a delivery once the receiver has answered: after the POST arrived
    until(
        lambda: [r.delivered_at is not None for r in deliveries(ctx.engine)] == [True, True],
        timeout=30,
        what="both deliveries recorded as delivered",
    )


def test_system_page_shows_the_delivery_log_per_endpoint(one_delivered_one_waiting):
    from tests.support.apptest import open_console, texts

    receiver, job_id = one_delivered_one_waiting(
        "http://ops:hook-pw-77@127.0.0.1:9/[down](javascript:x)"
    )

    at = open_console("system")
    page = texts(at)
    assert f"{receiver.url}: 1 delivered, 0 waiting, 0 given up" in page
    assert "http://ops:***@127.0.0.1:9/[down](javascript:x): 0 delivered, 1 waiting" in page
    assert "hook-pw-77" not in page
    assert not any(
        "](javascript" in m.value for m in at.markdown if "\\]" not in m.value
    )  # escaped, no link
    logs = [df.value for df in at.dataframe if "delivered / next try" in df.value.columns]
    assert sorted((row["state"], row["job"]) for log in logs for _, row in log.iterrows()) == [
        ("delivered", job_id),
        ("retrying", job_id),
    ]
    refused = next(log for log in logs if log["state"][0] == "retrying")
    assert "Connect" in refused["last error"][0]


# --- source events -------------------------------------------------------------------------------


def test_a_sources_events_wait_for_its_earlier_one_and_hold_no_other(hooked, receivers):
    """A ``source.synced`` row names its source in ``source_id`` (``job_id`` holds job ids only):
    an endpoint gets one source's events in order, and a job of the same number waits on none."""
    receiver = receivers()
    engine = hooked(receiver.url)
    with Session(engine) as session:
        now = db_now(session)

        def row(event_id: str, *, due=now, **owner) -> WebhookDelivery:
            event = "source.synced" if "source_id" in owner else "job.succeeded"
            return WebhookDelivery(
                event_id=event_id,
                endpoint=receiver.url,
                event=event,
                body="{}",
                created_at=now,
                next_attempt_at=due,
                **owner,
            )

        session.add(row("source-run-1", source_id=3, due=now + timedelta(hours=1)))  # backing off
        session.add(row("source-run-2", source_id=3))  # waits for it
        session.add(row("source-run-3", source_id=4))
        session.add(row("41", job_id=3))  # job 3 is no source
        session.commit()
    report = deliver(engine)
    sent = sorted(r["headers"]["X-Sluice-Event-Id"] for r in receiver.requests)
    assert sent == ["41", "source-run-3"] and len(report.delivered) == 2


OLD_WEBHOOK_DELIVERY = (  # as a Sluice before webhook_delivery.source_id made it
    "CREATE TABLE webhook_delivery (id INTEGER NOT NULL, event_id VARCHAR(40) NOT NULL, "
    "endpoint VARCHAR(500) NOT NULL, job_id INTEGER NOT NULL, event VARCHAR(40) NOT NULL, "
    "body TEXT NOT NULL, created_at {ts} NOT NULL, attempts INTEGER NOT NULL, "
    "next_attempt_at {ts} NOT NULL, last_status INTEGER, last_error VARCHAR(500), "
    "delivered_at {ts}, gave_up_at {ts}, PRIMARY KEY (id))"
)


def test_negated_source_ids_of_an_older_database_move_to_source_id(database_url):
    """An older Sluice kept a source's events under its id negated in a NOT NULL ``job_id``: the
    schema check (several processes at once) lets ``job_id`` be NULL and moves those ids."""
    from sqlalchemy import inspect, text

    from sluice.storage.db import dispose_engines, init_schema, make_engine

    engine = get_engine(database_url)
    ts = "DATETIME" if database_url.startswith("sqlite") else "TIMESTAMP WITHOUT TIME ZONE"
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE webhook_delivery"))
        conn.execute(text(OLD_WEBHOOK_DELIVERY.format(ts=ts)))
        conn.execute(text("CREATE INDEX ix_webhook_delivery_job_id ON webhook_delivery (job_id)"))
        for row_id, job_id, event in ((1, 7, "job.succeeded"), (2, -3, "source.synced")):
            conn.execute(
                text(
                    "INSERT INTO webhook_delivery (id, event_id, endpoint, job_id, event, body, "
                    "created_at, attempts, next_attempt_at) VALUES "
                    "(:id, :event_id, 'https://h.example/x', :job_id, :event, '{}', :at, 0, :at)"
                ),
                {
                    "id": row_id,
                    "event_id": f"e{row_id}",
                    "job_id": job_id,
                    "event": event,
                    "at": datetime(2026, 1, 1),
                },
            )
    dispose_engines()
    engines = [make_engine(database_url) for _ in range(3)]
    try:
        errors: list[BaseException] = []

        def start(e) -> None:
            try:
                init_schema(e)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=start, args=(e,)) for e in engines]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert errors == []
    finally:
        for e in engines:
            e.dispose()
    again = get_engine(database_url)
    with Session(again) as session:
        rows = session.exec(select(WebhookDelivery).order_by(WebhookDelivery.id)).all()
        assert [(r.id, r.job_id, r.source_id, r.event) for r in rows] == [
            (1, 7, None, "job.succeeded"),
            (2, None, 3, "source.synced"),
        ]
    inspector = inspect(again)
    columns = {c["name"]: c for c in inspector.get_columns("webhook_delivery")}
    assert columns["job_id"]["nullable"] and columns["source_id"]["nullable"]
    indexes = {ix["name"] for ix in inspector.get_indexes("webhook_delivery")}
    assert {
        "ix_webhook_due",
        "ix_webhook_delivery_job_id",
        "ix_webhook_delivery_source_id",
    } <= indexes
    init_schema(again)  # and a second start finds nothing to do
