"""The HTTP API against a real ``sluice serve api`` process, a real worker and the session's Redis
and Chroma servers: keys and their reach, uploads, polls, idempotency, problem+json."""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import httpx
import pytest
from sqlmodel import Session, func, select

from sluice import faults
from sluice.api.rate_limit import RateLimiter
from sluice.ops import actions
from sluice.ops.access import cli_operator
from sluice.storage.models import Document, Job, JobEvent
from tests.support.api_server import ApiServer, InProcessApi, auth, make_key

FINAL = ("succeeded", "failed", "cancelled")


@pytest.fixture
def api(database_url, sluice_env, tmp_path):
    server = ApiServer(dict(os.environ), tmp_path / "api.log")
    server.start()
    yield server
    server.stop()


def _upload_text(url: str, token: str, dataset: str, filename: str, text: str, **headers):
    return httpx.post(
        f"{url}/v1/datasets/{dataset}/documents",
        json={"filename": filename, "text": text},
        headers={**auth(token), **headers},
        timeout=30,
    )


def _wait_final(url: str, token: str, job_id: int, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = httpx.get(f"{url}/v1/jobs/{job_id}", headers=auth(token), timeout=10).json()
        if state["status"] in FINAL:
            return state
        time.sleep(0.2)
    raise TimeoutError(f"job {job_id} not final: {state}")


def _world(url: str):
    """Two datasets, a manage key of each, a document indexed in each."""
    for name in ("alpha", "beta"):
        assert actions.create_dataset(cli_operator(), name)[0]
    keys = {n: make_key(f"key-{n}", datasets=[n], scope="manage") for n in ("alpha", "beta")}
    secret = {"alpha": "albatross quartz", "beta": "bumblebee zircon"}
    made = {}
    for name in ("alpha", "beta"):
        r = _upload_text(url, keys[name], name, f"{name}-secret-plan.txt", secret[name] * 50)
        assert r.status_code == 202, r.text
        made[name] = r.json()["jobs"][0]
    for name in ("alpha", "beta"):
        assert _wait_final(url, keys[name], made[name]["job_id"])["status"] == "succeeded"
    return keys, made, secret


def _attempts(url: str, token: str, other: str, job: dict) -> dict[str, httpx.Response]:
    """Every read and write of one key against the other dataset's things."""
    h = auth(token)
    jid, did = job["job_id"], job["document_id"]
    c = httpx.Client(base_url=url, headers=h, timeout=30)
    return {
        "dataset": c.get(f"/v1/datasets/{other}"),
        "upload": c.post(
            f"/v1/datasets/{other}/documents", json={"filename": "x.txt", "text": "x"}
        ),
        "search": c.post(f"/v1/datasets/{other}/search", json={"query": "zircon quartz"}),
        "jobs of dataset": c.get("/v1/jobs", params={"dataset": other}),
        "job": c.get(f"/v1/jobs/{jid}"),
        "retry": c.post(f"/v1/jobs/{jid}/retry"),
        "cancel": c.post(f"/v1/jobs/{jid}/cancel"),
        "unlock": c.post(f"/v1/jobs/{jid}/unlock", json={"password": "pw"}),
        "document": c.get(f"/v1/documents/{did}"),
        "chunks": c.get(f"/v1/documents/{did}/chunks"),
        "delete": c.delete(f"/v1/documents/{did}"),
        "events of dataset": c.get("/v1/events", params={"dataset": other, "seconds": 1}),
    }


def _missing(url: str, token: str) -> dict[str, httpx.Response]:
    """The same requests about things that do not exist at all."""
    return _attempts(url, token, "no-such-dataset", {"job_id": 987654, "document_id": 987655})


def _same_404(
    got: httpx.Response, missing: httpx.Response, secrets: list[str], asked: dict[str, str]
) -> None:
    """The answer about another dataset's thing is the answer about a thing that does not exist,
    but for the name or id the client itself asked for (``asked``: missing's word -> this one's)."""
    assert got.status_code == 404, got.text
    assert sorted(got.headers.keys()) == sorted(missing.headers.keys())
    assert got.headers["content-type"] == missing.headers["content-type"]
    expected = missing.text
    for word, theirs in asked.items():
        expected = expected.replace(word, theirs)
    assert got.text == expected
    for s in secrets:
        assert s not in json.dumps(dict(got.headers)), s
        assert s not in got.text.replace(asked["no-such-dataset"], ""), s


def test_a_key_sees_nothing_of_another_datasets_things(api, start_worker):
    start_worker()
    keys, made, secret = _world(api.url)
    for mine, other in (("alpha", "beta"), ("beta", "alpha")):
        theirs = made[other]
        words = [other, theirs["filename"], *secret[other].split()]
        asked = {
            "no-such-dataset": other,
            "987654": str(theirs["job_id"]),
            "987655": str(theirs["document_id"]),
        }
        missing = _missing(api.url, keys[mine])
        for what, got in _attempts(api.url, keys[mine], other, theirs).items():
            _same_404(got, missing[what], words, asked)
        c = httpx.Client(base_url=api.url, headers=auth(keys[mine]), timeout=30)
        listed = c.get("/v1/datasets").json()["datasets"]
        assert [d["name"] for d in listed] == [mine]
        assert theirs["job_id"] not in [j["id"] for j in c.get("/v1/jobs").json()["jobs"]]
        stream = c.get("/v1/events", headers={"Last-Event-ID": "0"}, params={"seconds": 1.5})
        assert stream.status_code == 200
        assert f'"id":{made[mine]["job_id"]}' in stream.text  # its own events are there
        for w in words:
            assert w not in stream.text
    with Session(_engine()) as session:  # nothing was written by the refused writes
        assert session.exec(select(func.count()).select_from(Document)).one() == 2
        assert all(j.status.value == "succeeded" for j in session.exec(select(Job)).all())


def _engine():
    from sluice.ops.reads import ctx

    return ctx().engine


def test_scopes_and_keys_answer_401_and_403(api):
    read = make_key("reader", datasets=["default"], scope="read")
    ingest = make_key("ingester", datasets=["default"], scope="ingest")
    c = httpx.Client(base_url=api.url, timeout=30)
    assert c.get("/v1/datasets").status_code == 401
    assert c.get("/v1/datasets", headers=auth("sluice_000000000000_" + "x" * 43)).status_code == 401
    assert c.get("/v1/health").status_code == 200
    r = _upload_text(api.url, read, "default", "a.txt", "words here")
    assert r.status_code == 403 and r.json()["code"] == "scope_missing"
    r = _upload_text(api.url, ingest, "default", "a.txt", "words here")
    assert r.status_code == 202
    doc = r.json()["jobs"][0]["document_id"]
    r = c.delete(f"/v1/documents/{doc}", headers=auth(ingest))
    assert r.status_code == 403, r.text
    r = c.post("/v1/datasets", json={"name": "new"}, headers=auth(ingest))
    assert r.status_code == 403
    assert actions  # the ops the API uses are the console's
    from sluice.ops.keys import revoke_key

    assert revoke_key(cli_operator(), "ingester")[0]
    r = c.get("/v1/datasets", headers=auth(ingest))
    assert r.status_code == 401 and r.headers["content-type"] == "application/problem+json"


def test_upload_poll_and_conditional_poll(api, start_worker):
    token = make_key("app", datasets=None, scope="manage")
    first = _upload_text(api.url, token, "default", "note.txt", "the quick brown fox " * 40)
    assert first.status_code == 202
    job = first.json()["jobs"][0]
    assert first.headers["location"] == f"/v1/jobs/{job['job_id']}"
    assert int(first.headers["retry-after"]) >= 1
    assert job["existing"] is False
    c = httpx.Client(base_url=api.url, headers=auth(token), timeout=30)
    pending = c.get(f"/v1/jobs/{job['job_id']}")
    # no worker yet: no start promised, and it says so (sluice.ops.diagnosis)
    assert pending.json()["waiting"]["reason"] == "no_worker" and "retry-after" in pending.headers
    assert pending.json()["waiting_for"] == "a worker: none is alive"
    again = c.get(f"/v1/jobs/{job['job_id']}", headers={"If-None-Match": pending.headers["etag"]})
    assert again.status_code == 304 and again.content == b""
    start_worker()
    done = _wait_final(api.url, token, job["job_id"])
    assert done["status"] == "succeeded" and done["progress"] == "done"
    final = c.get(f"/v1/jobs/{job['job_id']}")
    assert "retry-after" not in final.headers and final.headers["etag"] != pending.headers["etag"]
    same = _upload_text(api.url, token, "default", "note.txt", "the quick brown fox " * 40)
    assert same.json()["jobs"][0] == {**job, "existing": True, "status": "succeeded"}
    chunks = c.get(f"/v1/documents/{job['document_id']}/chunks", params={"limit": 1}).json()
    assert chunks["chunks"][0]["position"] == 0 and "quick brown fox" in chunks["chunks"][0]["text"]
    hits = c.post("/v1/datasets/default/search", json={"query": "brown fox", "mode": "lexical"})
    assert hits.json()["hits"][0]["document_id"] == job["document_id"]


def test_jobs_are_paged_by_cursor(api):
    token = make_key("app", datasets=None, scope="ingest")
    ids = [
        _upload_text(api.url, token, "default", f"f{i}.txt", f"file number {i}").json()["jobs"][0][
            "job_id"
        ]
        for i in range(5)
    ]
    c = httpx.Client(base_url=api.url, headers=auth(token), timeout=30)
    seen, cursor = [], None
    while True:
        page = c.get("/v1/jobs", params={"limit": 2, **({"cursor": cursor} if cursor else {})})
        body = page.json()
        seen += [j["id"] for j in body["jobs"]]
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert seen == sorted(ids, reverse=True)
    assert c.get("/v1/jobs", params={"cursor": "abc"}).status_code == 422


def test_errors_are_problems_even_from_routing_and_validation(api):
    token = make_key("app", datasets=None, scope="manage")
    c = httpx.Client(base_url=api.url, headers=auth(token), timeout=30)
    answers = {
        404: c.get("/v1/nothing-here"),
        405: c.put("/v1/jobs"),
        422: c.post("/v1/datasets/default/search", json={"query": "", "k": 0}),
    }
    for status, r in answers.items():
        assert r.status_code == status
        assert r.headers["content-type"] == "application/problem+json"
        assert {"type", "title", "status", "detail", "code"} <= set(r.json())
        assert r.headers["x-frame-options"] == "DENY"
        assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
    r = c.post(
        "/v1/datasets/default/documents", content=b"\x89PNG", headers={"content-type": "image/png"}
    )
    assert r.status_code == 415
    r = _upload_text(api.url, token, "default", "a.png", "")
    assert r.status_code == 422
    png = b"\x89PNG\r\n\x1a\n" + b"\0" * 100
    r = c.post("/v1/datasets/default/documents", files={"file": ("a.txt", png)})
    assert r.status_code == 415 and r.json()["code"] == "unsupported_type"
    r = c.get("/v1/health", headers={"Host": "rebound.example"})
    assert r.status_code == 403
    r = c.get("/v1/health", headers={"Origin": "https://evil.example"})
    assert r.status_code == 403
    page = httpx.get(f"{api.url}/reference")
    assert (
        page.status_code == 200
        and "/reference.js" in page.text
        and "http" not in page.text.split("<body>")[0]
    )


def test_idempotency_key_replays_refuses_another_body(api):
    token = make_key("app", datasets=None, scope="ingest")
    key = {"Idempotency-Key": "upload-1"}
    first = _upload_text(api.url, token, "default", "a.txt", "first body", **key)
    again = _upload_text(api.url, token, "default", "a.txt", "first body", **key)
    assert first.status_code == again.status_code == 202
    assert again.json() == first.json() and again.headers["idempotent-replayed"] == "true"
    assert again.headers["location"] == first.headers["location"]
    other = _upload_text(api.url, token, "default", "a.txt", "another body", **key)
    assert other.status_code == 422 and other.json()["code"] == "idempotency_key_reused"
    with Session(_engine()) as session:
        assert session.exec(select(func.count()).select_from(Job)).one() == 1
    theirs = make_key("someone", datasets=None, scope="ingest")  # keys are per API key
    assert _upload_text(api.url, theirs, "default", "b.txt", "other", **key).status_code == 202


def test_two_requests_with_one_idempotency_key_at_once_make_one_job(database_url, sluice_env):
    """Both requests find no record and stop at the same point before adding theirs (forced by a
    barrier at the fault point); one adds it, the other is told the first is in flight or replays
    it."""
    token = make_key("app", datasets=None, scope="ingest")
    meet = threading.Barrier(2, timeout=20)
    answers: list[httpx.Response] = []

    def send() -> None:
        answers.append(
            _upload_text(api.url, token, "default", "a.txt", "same", **{"Idempotency-Key": "k"})
        )

    with InProcessApi() as api, faults.hook("idempotency_before_insert", lambda **_: meet.wait()):
        threads = [threading.Thread(target=send) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    codes = sorted(r.status_code for r in answers)
    assert codes in ([202, 409], [202, 202]), [r.text for r in answers]
    if codes == [202, 202]:  # the second replayed the first answer
        assert answers[0].json() == answers[1].json()
    with Session(_engine()) as session:
        assert session.exec(select(func.count()).select_from(Job)).one() == 1
        assert session.exec(select(func.count()).select_from(JobEvent)).one() == 1


def _send_chunked_until_refused(
    url: str, path: str, token: str, chunk: bytes, most: int
) -> tuple[bytes, int]:
    """Stream a chunked multipart body chunk by chunk; stop as soon as an answer arrives. Returns
    the answer and how many bytes had been sent by then."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    boundary = "b0undary"
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer "
        f"{token}\r\nContent-Type: multipart/form-data; boundary={boundary}\r\nTransfer-Encoding: "
        "chunked\r\n\r\n"
    )
    sock.sendall(head.encode())
    part = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="big.txt"\r\n\r\n'
    )
    sent, body = 0, [part.encode()] + [chunk] * (most // len(chunk))
    sock.settimeout(0.05)
    answer = b""
    for piece in body:
        try:
            sock.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        except (BrokenPipeError, ConnectionResetError):
            break
        sent += len(piece)
        try:
            answer = sock.recv(65536)
        except TimeoutError:
            continue
        if answer:
            break
    sock.settimeout(10)
    while b"\r\n\r\n" not in answer:
        more = sock.recv(65536)
        if not more:
            break
        answer += more
    sock.close()
    return answer, sent


def test_an_upload_over_the_limit_is_refused_while_it_streams_and_nothing_is_stored(
    database_url, sluice_env, monkeypatch, tmp_path
):
    limit = 200_000
    monkeypatch.setenv("SLUICE_MAX_UPLOAD_BYTES", str(limit))
    server = ApiServer(dict(os.environ), tmp_path / "api.log")
    server.start()
    try:
        token = make_key("app", datasets=None, scope="ingest")
        answer, sent = _send_chunked_until_refused(
            server.url, "/v1/datasets/default/documents", token, b"a" * 16384, 20 * limit
        )
        assert answer.startswith(b"HTTP/1.1 413"), answer[:300]
        assert sent < 2 * limit  # answered while the body was still coming, long before its end
        declared = httpx.post(
            f"{server.url}/v1/datasets/default/documents",
            files={"file": ("big.txt", b"a" * (2 * limit))},
            headers=auth(token),
        )
        assert declared.status_code == 413 and declared.json()["code"] == "too_large"
    finally:
        server.stop()
    blobs = tmp_path / "data" / "blobs"
    assert not blobs.exists() or not [p for p in blobs.rglob("*") if p.is_file()]
    with Session(_engine()) as session:
        assert session.exec(select(func.count()).select_from(Document)).one() == 0


def test_a_key_over_its_rate_is_told_when_to_come_back(
    database_url, sluice_env, monkeypatch, tmp_path
):
    monkeypatch.setenv("SLUICE_API_RATE_PER_MINUTE", "3")
    server = ApiServer(dict(os.environ), tmp_path / "api.log")
    server.start()
    try:
        token = make_key("app", datasets=None, scope="read")
        codes = [httpx.get(f"{server.url}/v1/datasets", headers=auth(token)) for _ in range(4)]
        assert [r.status_code for r in codes] == [200, 200, 200, 429]
        assert 1 <= int(codes[-1].headers["retry-after"]) <= 60
        assert codes[-1].json()["code"] == "rate_limited"
    finally:
        server.stop()


def test_every_keyed_answer_tells_what_is_left_of_the_budget(
    database_url, sluice_env, monkeypatch, tmp_path
):
    """RateLimit-Policy and RateLimit (the IETF draft's fields) on each keyed answer, the 429 too,
    so a client slows down before it is refused; an answer that needs no key has none."""
    monkeypatch.setenv("SLUICE_API_RATE_PER_MINUTE", "3")
    server = ApiServer(dict(os.environ), tmp_path / "api.log")
    server.start()
    try:
        token = make_key("app", datasets=None, scope="read")
        answers = [httpx.get(f"{server.url}/v1/datasets", headers=auth(token)) for _ in range(4)]
        assert {r.headers["ratelimit-policy"] for r in answers} == {'"per-key";q=3;w=60'}
        left = [r.headers["ratelimit"] for r in answers]
        assert [v.split(";")[1] for v in left] == ["r=2", "r=1", "r=0", "r=0"]
        assert all(1 <= int(v.split(";t=")[1]) <= 60 for v in left)
        assert answers[-1].status_code == 429
        other = auth(make_key("b", datasets=None, scope="read"))
        missing = httpx.get(f"{server.url}/v1/jobs/999999", headers=other)
        assert missing.status_code == 404
        assert missing.headers["ratelimit"].startswith('"per-key";r=2;')
        health = httpx.get(f"{server.url}/v1/health")
        assert "ratelimit" not in health.headers and "ratelimit-policy" not in health.headers
    finally:
        server.stop()


def test_the_budget_comes_back_as_the_window_slides():
    """``t`` counts down to the moment the oldest request leaves the minute."""
    now = [100.0]
    limiter = RateLimiter(2, clock=lambda: now[0])
    assert limiter.spend(7).headers()["RateLimit"] == '"per-key";r=1;t=60'
    now[0] = 130.0
    assert limiter.spend(7).headers()["RateLimit"] == '"per-key";r=0;t=30'
    refused = limiter.spend(7)
    assert refused.wait == 30.0 and refused.headers()["RateLimit"] == '"per-key";r=0;t=30'
    now[0] = 160.5
    assert limiter.spend(7).headers()["RateLimit"] == '"per-key";r=0;t=30'
    assert RateLimiter(0).spend(7).headers() == {}
