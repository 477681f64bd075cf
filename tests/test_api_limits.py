"""What a request may make a real ``sluice serve api`` read: without a live key nothing of its body
(401 at once, also while the client is still sending), with one a JSON body of at most
``SLUICE_API_MAX_JSON_BYTES`` (413 ``json_too_large`` at once for a larger ``Content-Length``,
and as soon as a chunked body passes it). Each request is sent by hand over a socket: the headers
and a little of the body, then the test waits for the answer without sending the rest."""

from __future__ import annotations

import json
import os
import socket

import pytest

from tests.support.api_server import ApiServer, make_key

pytestmark = pytest.mark.timeout(180)
ANSWER_WITHIN = 10.0  # the answer comes at once; before the change it never came (body awaited)
HUGE = 80 * 1024 * 1024
CAP = 64 * 1024


def _request(port: int, method: str, path: str, headers: dict[str, str], body: bytes):
    """Send the head and ``body`` (not necessarily all the head announces), then read one answer:
    (status, headers, parsed body). A socket timeout means no answer came."""
    with socket.create_connection(("127.0.0.1", port), timeout=ANSWER_WITHIN) as sock:
        head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        sock.sendall(head.encode() + body)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, f"the connection closed without an answer: {data!r}"
            data += chunk
        raw_head, _, rest = data.partition(b"\r\n\r\n")
        lines = raw_head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        got = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(got.get("content-length", "0"))
        while len(rest) < length:
            chunk = sock.recv(65536)
            assert chunk, "the answer was cut short"
            rest += chunk
    return status, got, json.loads(rest[:length]) if length else None


@pytest.fixture
def api(sluice_env, tmp_path):
    server = ApiServer({**os.environ, "SLUICE_API_MAX_JSON_BYTES": str(CAP)}, tmp_path / "a.log")
    server.start()
    yield server
    server.stop()


@pytest.mark.parametrize(
    "path",
    ["/v1/datasets/default/search", "/v1/datasets", "/v1/datasets/default/documents"],
    ids=["search", "new-dataset", "upload"],
)
@pytest.mark.parametrize("token", [None, "sluice_0123456789ab_" + "x" * 43], ids=["none", "bad"])
def test_a_request_without_a_live_key_is_refused_before_its_body_is_read(api, path, token):
    headers = {"Content-Type": "application/json", "Content-Length": str(HUGE)}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    status, got, body = _request(api.port, "POST", path, headers, b'{"query": "' + b"a" * 1000)
    assert status == 401, body
    assert got["content-type"].startswith("application/problem+json")
    assert body["code"] == "unauthorized"
    assert got["www-authenticate"].startswith("Bearer")


def test_a_json_body_over_the_cap_is_refused_before_it_is_read(api):
    token = make_key("maker", datasets=None, scope="manage")
    auth = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    # a Content-Length above the cap: 413 before a byte of the body is read
    headers = {**auth, "Content-Length": str(HUGE)}
    status, got, body = _request(api.port, "POST", "/v1/datasets", headers, b'{"name": "')
    assert (status, body["code"]) == (413, "json_too_large"), body
    assert got["content-type"].startswith("application/problem+json")

    # chunked, no length said: read up to the cap, refused there (the rest is never sent)
    def chunk(piece: bytes) -> bytes:
        return f"{len(piece):x}\r\n".encode() + piece + b"\r\n"

    headers = {**auth, "Transfer-Encoding": "chunked"}
    over = chunk(b'{"name": "') + chunk(b"x" * 16384) * (CAP // 16384 + 2)
    status, _, body = _request(api.port, "POST", "/v1/datasets", headers, over)
    assert (status, body["code"]) == (413, "json_too_large"), body
    # under the cap: the route reads it as before
    small = json.dumps({"name": "limits"}).encode()
    headers = {**auth, "Content-Length": str(len(small))}
    status, _, body = _request(api.port, "POST", "/v1/datasets", headers, small)
    assert status == 201, body
    # an upload keeps its own limit (SLUICE_MAX_UPLOAD_BYTES): a JSON text above the JSON cap
    text = json.dumps({"filename": "big.txt", "text": "word " * (CAP // 2)}).encode()
    headers = {**auth, "Content-Length": str(len(text))}
    status, _, body = _request(api.port, "POST", "/v1/datasets/limits/documents", headers, text)
    assert status == 202, body
