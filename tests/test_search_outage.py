"""A search whose read of Chroma fails on the way answers 503 ``vector_store_unavailable`` with
``Retry-After``, never a 500, and the CLI says the same words: against a real ``sluice serve
chroma`` whose Chroma behind the gate is killed (the gate answers 502), then with the gate stopped
(connection refused). Before, both answered 500 ``internal_error`` and the CLI printed a
traceback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from sluice.errors import VectorStoreUnavailable
from sluice.storage.vectors import ChromaAnswered, VectorStore, read_failure
from tests.support.api_server import ApiServer, auth, make_key
from tests.support.helpers import run_file, until
from tests.support.servers import ManagedProcess, free_port, wait_port

pytestmark = [pytest.mark.servers, pytest.mark.timeout(240)]

TEXT = b"The tide tables of the northern harbour are printed every autumn. " * 40
SLUICE = str(Path(sys.executable).with_name("sluice"))


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _heartbeat(settings) -> int | None:
    """The gate's status for Chroma's heartbeat, asked with the system's token."""
    headers = {}
    if settings.chroma_token is not None:
        token, header = settings.chroma_token.get_secret_value(), settings.chroma_auth_header
        headers[header] = f"Bearer {token}" if header.lower() == "authorization" else token
    try:
        return httpx.get(
            f"{settings.chroma_url}/api/v2/heartbeat", headers=headers, timeout=5
        ).status_code
    except httpx.HTTPError:
        return None


def _search(api: ApiServer, token: str, mode: str) -> httpx.Response:
    return httpx.post(
        f"{api.url}/v1/datasets/default/search",
        json={"query": "tide tables harbour", "k": 3, "mode": mode},
        headers=auth(token),
        timeout=60,
    )


def _cli_search(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [SLUICE, "search", "tide tables", "--dataset", "default", "--mode", "dense"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _assert_unavailable(answer: httpx.Response, why: str) -> None:
    assert answer.status_code == 503, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    assert answer.headers["retry-after"] == "5"
    body = answer.json()
    assert body["code"] == "vector_store_unavailable", body
    assert f"({why})" in body["detail"] and body["hint"] == VectorStoreUnavailable.hint


def test_a_search_against_a_failing_or_stopped_chroma_gate_answers_503(make_ctx, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    ctx = make_ctx(SLUICE_CHROMA_URL=url)
    gate = ManagedProcess([SLUICE, "serve", "chroma"], log=tmp_path / "gate.log", env=os.environ)
    gate.start()
    api = ApiServer(dict(os.environ), tmp_path / "api.log")
    try:
        wait_port(port, 60)
        assert run_file(ctx, TEXT, "tides.txt").status == "succeeded"
        api.start()
        token = make_key("reader", datasets=None, scope="read")
        ok = _search(api, token, "dense")
        assert ok.status_code == 200 and ok.json()["hits"], ok.text

        # Chroma behind the gate dies; the gate stays and answers 502 (after its one retry)
        for child in _children(gate.pid):
            os.kill(child, signal.SIGKILL)
        until(lambda: _heartbeat(ctx.settings) == 502, timeout=30, what="the gate answering 502")
        for mode in ("dense", "hybrid"):
            _assert_unavailable(_search(api, token, mode), "HTTP 502")
        with pytest.raises(Exception) as made:  # chromadb's client: a bare Exception of ""
            VectorStore.from_settings(ctx.settings).heartbeat()
        assert read_failure(made.value) == "HTTP 502"
        cli = _cli_search(dict(os.environ))
        assert cli.returncode == 1 and "Traceback" not in cli.stderr, cli.stderr
        assert "the vector store did not answer the search (HTTP 502)" in cli.stderr

        gate.stop()  # now nothing listens there
        _assert_unavailable(_search(api, token, "hybrid"), "connection refused")
        cli = _cli_search(dict(os.environ))
        assert cli.returncode == 1 and "Traceback" not in cli.stderr, cli.stderr
        assert "(connection refused)" in cli.stderr and VectorStoreUnavailable.hint in cli.stderr
    finally:
        api.stop()
        gate.stop()
    log = api.output()
    assert "internal_error" not in log and "Traceback" not in log, log[-3000:]
    assert "the vector store failed (HTTP 502)" in log  # the operator's side of it


def test_a_store_that_never_answers_is_unavailable_too():
    """A server that takes the connection and never answers: the read's own timeout."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])  # kept open, never answered
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        store = VectorStore(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout=0.5)
        with pytest.raises(TimeoutError) as late:
            store.count("anything")
        assert read_failure(late.value) == "no answer in time"
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        listener.close()


def test_what_the_store_refused_is_not_an_outage():
    assert read_failure(ChromaAnswered("HTTP 500 to POST .../query", 500)) is None
    assert read_failure(ChromaAnswered("HTTP 503", 503)) == "HTTP 503"
    assert read_failure(ValueError("bad where clause")) is None
    try:
        try:
            raise ConnectionResetError(104, "Connection reset by peer")
        except ConnectionResetError:
            raise RuntimeError("wrapped by a client") from None
    except RuntimeError as wrapped:
        assert read_failure(wrapped) is None  # `from None`: nothing said it was the connection
    try:
        try:
            raise ConnectionResetError(104, "Connection reset by peer")
        except ConnectionResetError as exc:
            raise RuntimeError("wrapped by a client") from exc
    except RuntimeError as wrapped:
        assert read_failure(wrapped) == "connection dropped"
