"""What a real ``sluice serve api`` lets one connection and one client address hold, and whose
address it writes in the audit log.

- a client that sends its request head a byte at a time is cut off after
  ``SLUICE_API_HEADER_TIMEOUT_SECONDS`` while another client is served (before: held for ever);
- one address holds at most ``SLUICE_API_CONNECTIONS_PER_ADDRESS`` connections; the next gets 429
  while another address is served (before: no bound);
- a head over h11's 16 KiB is 431 problem+json, an unreadable one 400 problem+json (before:
  ``text/plain``);
- ``X-Forwarded-For`` is believed from ``SLUICE_API_TRUSTED_PROXIES`` only, for the audit rows
  (before: every row had the proxy's address), and a trusted proxy is not capped per address.

And the Chroma gate beside it: ``sluice serve chroma`` without ``SLUICE_CHROMA_TOKEN`` makes a
token on first start (0600 in the data directory) and refuses every request without it, while the
clients of that data directory send it (before: any local user read and wrote every chunk).

Each attack goes over a raw socket, from a loopback address of its own (all of 127/8 is
loopback)."""

from __future__ import annotations

import json
import os
import select
import socket
import stat
import sys
import time

import httpx
import pytest
from sqlmodel import Session, col
from sqlmodel import select as sql_select

from sluice.pipeline.running.context import Context
from sluice.settings import get_settings
from sluice.storage.audit_log import AuditEntry
from tests.support.api_server import ApiServer, auth, make_key
from tests.support.servers import ManagedProcess, free_port, wait_port

pytestmark = pytest.mark.timeout(180)
HEAD_SECONDS = 1.5
PER_ADDRESS = 4


def _start(env: dict[str, str], log) -> ApiServer:
    server = ApiServer({**os.environ, **env}, log)
    server.start()
    return server


@pytest.fixture(scope="module")
def api(services, tmp_path_factory):
    """One ``sluice serve api`` for the attacks that need no settings of their own (each test
    attacks from addresses of its own, so what one leaves open is not counted against another)."""
    data = tmp_path_factory.mktemp("api-connections")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env.update(
        {
            "SLUICE_ENV_FILE": "",
            "SLUICE_DATA_DIR": str(data / "data"),
            "SLUICE_QUEUE_REDIS_URL": services.queue.url,
            "SLUICE_CACHE_REDIS_URL": services.cache.url,
            "SLUICE_CHROMA_URL": services.chroma.url,
            "SLUICE_QUEUE_NAME": os.environ["SLUICE_QUEUE_NAME"],
            "SLUICE_EMBEDDER": "hash",
            "SLUICE_API_HEADER_TIMEOUT_SECONDS": str(HEAD_SECONDS),
            "SLUICE_API_CONNECTIONS_PER_ADDRESS": str(PER_ADDRESS),
        }
    )
    server = ApiServer(env, data / "api.log")
    server.start()
    yield server
    server.stop()


def _connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _closed(sock: socket.socket, wait: float) -> bool:
    """Whether the server closed ``sock`` within ``wait`` seconds (EOF or a reset)."""
    readable, _, _ = select.select([sock], [], [], wait)
    if not readable:
        return False
    try:
        return sock.recv(65536) == b""
    except ConnectionError:
        return True


def _answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One whole answer read from ``sock``: (status, headers, body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed without an answer: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "the answer was cut short"
        body += chunk
    return int(lines[0].split()[1]), headers, body[:length]


def _ask_health(sock: socket.socket, port: int) -> tuple[int, dict[str, str], bytes]:
    sock.sendall(f"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    return _answer(sock)


def _health(port: int, source: str = "127.0.0.1") -> int:
    with _connect(port, source) as sock:
        return _ask_health(sock, port)[0]


def _held(port: int, n: int, source: str = "127.0.0.1") -> list[socket.socket]:
    """``n`` connections the server has surely taken (each answered once), left open idle (its
    keep-alive lasts 5 s)."""
    held = [_connect(port, source) for _ in range(n)]
    for sock in held:
        assert _ask_health(sock, port)[0] == 200
    return held


def test_a_head_sent_a_byte_at_a_time_is_cut_off_while_others_are_served(api):
    slow = _connect(api.port, "127.0.0.11")
    start = time.monotonic()
    head = f"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1:{api.port}\r\nX-Drip: ".encode()
    cut_at = None
    sent = 0
    while time.monotonic() - start < 12:  # the attacker's pace: a byte every 0.2 s
        try:
            slow.sendall(head[sent : sent + 1] if sent < len(head) else b"a")
        except ConnectionError:
            cut_at = time.monotonic() - start
            break
        sent += 1
        if _closed(slow, 0.2):
            cut_at = time.monotonic() - start
            break
        if sent == 5:  # meanwhile another client is served at once
            assert _health(api.port, "127.0.0.11") == 200
    slow.close()
    assert cut_at is not None, f"a head dripped for 12 s ({sent} bytes) was never cut off"
    assert HEAD_SECONDS - 0.1 <= cut_at <= HEAD_SECONDS + 3, cut_at
    # an ordinary client on a kept-alive connection: two requests, the second after a pause
    with httpx.Client(base_url=api.url, timeout=10) as client:
        assert client.get("/v1/health").status_code == 200
        time.sleep(0.5)
        assert client.get("/v1/health").status_code == 200


def test_one_address_holds_at_most_its_connections(api):
    held = _held(api.port, PER_ADDRESS, source="127.0.0.12")
    try:
        with _connect(api.port, "127.0.0.12") as fifth:
            try:
                status, headers, body = _ask_health(fifth, api.port)
            except (AssertionError, ConnectionError) as exc:
                pytest.fail(f"the fifth connection got no answer: {exc}")
        assert status == 429, body
        assert headers["content-type"] == "application/problem+json"
        assert json.loads(body)["code"] == "too_many_connections"
        assert _health(api.port, source="127.0.0.13") == 200  # another address is served
        held.pop().close()
        deadline = time.monotonic() + 10
        while True:  # the closed one is given back as soon as the server sees it go
            try:
                if _health(api.port, "127.0.0.12") == 200:
                    break
            except (AssertionError, ConnectionError):
                pass
            assert time.monotonic() < deadline, "a place never came free"
            time.sleep(0.05)
    finally:
        for sock in held:
            sock.close()


HEADS = {  # what an attacker sends -> the status and code it is answered with
    # unended: h11 refuses a head it still waits for once it holds more than 16 KiB
    "long-request-line": (b"GET /v1/health?" + b"a" * 20_000, 431, "request_head_too_large"),
    "long-header": (
        b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX: " + b"b" * 20_000,
        431,
        "request_head_too_large",
    ),
    "garbage": (b"\x00\x01 not http at all\r\n\r\n", 400, "bad_request"),
    "bad-header-line": (b"GET /v1/health HTTP/1.1\r\nno colon here\r\n\r\n", 400, "bad_request"),
}


def test_a_head_h11_refuses_is_answered_as_a_problem(api):
    for name, (head, status, code) in HEADS.items():
        with _connect(api.port, "127.0.0.14") as sock:
            sock.sendall(head)
            got, headers, body = _answer(sock)
        assert got == status, (name, body)
        assert headers["content-type"] == "application/problem+json", (name, headers, body)
        problem = json.loads(body)
        assert (problem["status"], problem["code"]) == (status, code), name
        assert headers["x-content-type-options"] == "nosniff", name
    assert _health(api.port, "127.0.0.14") == 200  # and the API serves on


def _addresses(context: Context) -> list[str | None]:
    with Session(context.engine) as session:
        rows = session.exec(sql_select(AuditEntry).order_by(col(AuditEntry.id))).all()
        return [row.address for row in rows]


def test_a_forwarded_address_is_believed_only_from_a_trusted_proxy(
    database_url, sluice_env, tmp_path
):
    api = _start(
        {"SLUICE_API_TRUSTED_PROXIES": "127.0.0.2", "SLUICE_API_CONNECTIONS_PER_ADDRESS": "2"},
        tmp_path / "api.log",
    )
    context = Context(get_settings())
    proxy = httpx.HTTPTransport(local_address="127.0.0.2")
    bad = auth("sluice_0123456789ab_" + "x" * 43)
    try:
        with httpx.Client(transport=proxy, base_url=api.url, timeout=10) as behind:
            # through the trusted proxy: the client's address is the last one it forwarded
            answer = behind.get(
                "/v1/datasets", headers={**bad, "X-Forwarded-For": "10.1.1.1, 203.0.113.9"}
            )
            assert answer.status_code == 401
            token = make_key("maker", datasets=None, scope="manage")
            made = behind.post(
                "/v1/datasets",
                json={"name": "forwarded"},
                headers={**auth(token), "X-Forwarded-For": "198.51.100.20"},
            )
            assert made.status_code == 201, made.text
        with httpx.Client(base_url=api.url, timeout=10) as direct:
            # from anyone else the header is a header: the peer's address is written
            answer = direct.get("/v1/datasets", headers={**bad, "X-Forwarded-For": "192.0.2.66"})
            assert answer.status_code == 401
        rows = _addresses(context)
        assert "203.0.113.9" in rows and "198.51.100.20" in rows, rows
        assert "127.0.0.1" in rows and "192.0.2.66" not in rows, rows
        assert "127.0.0.2" not in rows and "10.1.1.1" not in rows, rows
        # the proxy carries every client's connections: it is not capped per address
        held = _held(api.port, 3, source="127.0.0.2")
        try:
            assert _health(api.port, source="127.0.0.2") == 200
        finally:
            for sock in held:
                sock.close()
    finally:
        api.stop()


def test_the_chroma_gate_makes_a_token_on_first_start_and_requires_it(tmp_path, monkeypatch):
    import numpy as np

    from sluice.settings import reset_settings_cache
    from sluice.storage.vectors import VectorStore

    data, port = tmp_path / "data", free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env.update({"SLUICE_ENV_FILE": "", "SLUICE_DATA_DIR": str(data), "SLUICE_CHROMA_URL": url})
    gate = ManagedProcess(
        [sys.executable, "-m", "sluice.cli.main", "serve", "chroma"], env=env, log=tmp_path / "g"
    )
    gate.start()
    try:
        wait_port(port, 60)
        token_file = data / "chroma-gate" / "token"
        assert token_file.is_file(), f"no token was made on first start: {gate.output()[-1000:]}"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert stat.S_IMODE(token_file.parent.stat().st_mode) == 0o700
        token = token_file.read_text().strip()
        assert len(token) >= 40
        collections = f"{url}/api/v2/tenants/default_tenant/databases/default_database/collections"
        for headers in ({}, {"Authorization": "Bearer guessed"}, {"Host": "localhost"}):
            anonymous = httpx.get(collections, headers=headers, timeout=10)
            assert anonymous.status_code == 401, (headers, anonymous.status_code, anonymous.text)
        bearer = httpx.get(collections, headers=auth(token), timeout=10)
        assert bearer.status_code == 200, bearer.text
        # a client of the same data directory, with no token set, sends the one made
        for key, value in {"SLUICE_DATA_DIR": str(data), "SLUICE_CHROMA_URL": url}.items():
            monkeypatch.setenv(key, value)
        monkeypatch.delenv("SLUICE_CHROMA_TOKEN", raising=False)
        reset_settings_cache()
        store = VectorStore.from_settings(get_settings())
        store.add(
            "made_token",
            ids=["a"],
            embeddings=np.eye(1, 3),
            documents=["x"],
            metadatas=[{"job_id": 1}],
        )
        assert store.count("made_token") == 1
    finally:
        gate.stop()
        reset_settings_cache()
