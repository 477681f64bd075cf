"""The Chroma gate in front of a real upstream socket: a request that meets a kept-alive connection
the upstream closed is sent once more on a new connection; a second failure answers 502 and says
why in the log (before: 502 at once, logging nothing, and the API answered 500)."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading

import httpx
import pytest

from sluice.servers.chroma_gate import LOOPBACK_NAMES, make_app


class DroppingUpstream:
    """A loopback HTTP server that closes the first ``drops`` connections without a byte of
    answer (as a server does with a kept-alive connection it timed out), then answers 200."""

    def __init__(self, drops: int) -> None:
        self.drops = drops
        self.bodies: list[bytes] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(20)
        self.port = self.sock.getsockname()[1]
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            while True:
                try:
                    conn, _ = self.sock.accept()
                except (TimeoutError, OSError):
                    return
                with conn:
                    request = self._read(conn)
                    if self.drops > 0:
                        self.drops -= 1
                        continue  # closed with no answer
                    self.bodies.append(request.split(b"\r\n\r\n", 1)[1])
                    conn.sendall(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                        b"content-length: 2\r\nconnection: close\r\n\r\n{}"
                    )
        except BaseException as exc:  # surfaced by the test
            self.errors.append(exc)

    @staticmethod
    def _read(conn: socket.socket) -> bytes:
        conn.settimeout(10)
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(
            (
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            ),
            0,
        )
        while len(body) < length:
            body += conn.recv(65536)
        return head + b"\r\n\r\n" + body

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept; a bare close would not
        except OSError:
            pass
        self.sock.close()
        self.thread.join(10)
        assert not self.thread.is_alive()
        if self.errors:
            raise self.errors[0]


def _post(upstream: DroppingUpstream) -> httpx.Response:
    app = make_app(
        upstream=f"http://127.0.0.1:{upstream.port}",
        token=None,
        header="authorization",
        allowed_hosts=LOOPBACK_NAMES,
    )

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            return await client.post("/api/v2/query", content=b'{"n": 3}')

    return asyncio.run(asyncio.wait_for(go(), 30))


@pytest.mark.timeout(60)
def test_a_request_on_a_connection_the_upstream_dropped_is_sent_again(caplog):
    upstream = DroppingUpstream(drops=1)
    try:
        with caplog.at_level(logging.WARNING, logger="sluice.servers.chroma_gate"):
            answer = _post(upstream)
    finally:
        upstream.close()
    assert answer.status_code == 200
    assert upstream.bodies == [b'{"n": 3}']  # the whole body, once it reached the upstream
    assert "sending it again" in caplog.text


@pytest.mark.timeout(60)
def test_a_second_failure_answers_502_and_says_why(caplog):
    upstream = DroppingUpstream(drops=2)
    try:
        with caplog.at_level(logging.WARNING, logger="sluice.servers.chroma_gate"):
            answer = _post(upstream)
    finally:
        upstream.close()
    assert answer.status_code == 502
    assert "answering 502" in caplog.text and "POST /api/v2/query" in caplog.text
