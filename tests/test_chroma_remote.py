"""Chroma on another host: https, a token header, and failures that are classified and retried.

The suite's Chroma server speaks plain HTTP without auth, as `chroma run` does; a small proxy in
front of it plays the remote host: TLS with a certificate made for the test (trusted through
SSL_CERT_FILE, as a private CA would be), a token it checks on every request, and on demand
silence (accepts, never answers).
"""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import ssl
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from sqlmodel import Session

from sluice.errors import classify
from sluice.ops.ingest import ingest_path
from sluice.pipeline.running.runner import run_job
from sluice.storage.models import Document, ErrorKind, JobStatus
from sluice.storage.vectors import VectorStore, chunk_id
from tests.support.helpers import collection, events, ids_of_job, job, wait_for

TOKEN = "chroma-Token-31337"


class ChromaProxy:
    """Forwards to the real Chroma server when the request carries ``header: value``; else 401."""

    def __init__(
        self,
        target: str,
        *,
        header: str = "Authorization",
        value: str = f"Bearer {TOKEN}",
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.target = urlsplit(target)
        self.header, self.value = header, value
        self.served = self.refused = 0
        self.silent = threading.Event()
        self.released = threading.Event()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        scheme = "https" if tls else "http"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> ChromaProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()

    def _handler(self):
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if proxy.silent.is_set():
                    proxy.released.wait(120)  # accept, read, never answer
                    return
                if self.headers.get(proxy.header) != proxy.value:
                    proxy.refused += 1
                    self._reply(401, {"error": "Unauthorized", "message": "missing or wrong token"})
                    return
                proxy.served += 1
                conn = http.client.HTTPConnection(
                    proxy.target.hostname, proxy.target.port, timeout=60
                )
                headers = {
                    k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")
                }
                conn.request(self.command, self.path, body=body or None, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for key, value in resp.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                conn.close()

            def _reply(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _forward

            def log_message(self, *args) -> None:
                pass

        return Handler


@pytest.fixture
def certificate(tmp_path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (the test's own CA, trusted via SSL_CERT_FILE)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is needed to make the test certificate")
    cert, key = tmp_path / "chroma-cert.pem", tmp_path / "chroma-key.pem"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


def expected_ids(ctx, j) -> list[str]:
    with Session(ctx.engine) as session:
        sha = session.get(Document, j.document_id).sha256
    return [chunk_id(sha, j.pipeline_version, i) for i in range(j.chunk_count)]


def test_https_and_a_bearer_token_end_to_end(
    make_ctx, start_worker, services, samples, certificate, monkeypatch
):
    cert, key = certificate
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    with ChromaProxy(services.chroma.url, tls=tls) as proxy:
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        ctx = make_ctx(SLUICE_CHROMA_URL=proxy.url, SLUICE_CHROMA_TOKEN=TOKEN)
        from sluice.pipeline.queueing.publishing import publish

        worker = start_worker(workers=1)
        result = ingest_path(
            ctx, samples / "004-pdflatex-4-pages.pdf", dataset="default", publish=publish
        )
        done = wait_for(ctx, [result.job_id], timeout=90)[0]
        assert done.status == JobStatus.succeeded, done.error_message
        assert ids_of_job(ctx, done.id) == expected_ids(ctx, done)
        # The reads a cold search and reconcile make over http.client trust SSL_CERT_FILE too.
        reader = VectorStore(proxy.url, token=TOKEN)
        assert reader.count(collection(ctx)) == done.chunk_count
        assert proxy.served > 0 and proxy.refused == 0
    # The vectors are on the server behind the proxy.
    direct = VectorStore(services.chroma.url).get(collection(ctx), ids=expected_ids(ctx, done))
    assert sorted(direct["ids"]) == expected_ids(ctx, done)
    assert TOKEN not in worker.output()


def test_a_raw_token_header(services, sluice_env):
    with ChromaProxy(services.chroma.url, header="X-Chroma-Token", value=TOKEN) as proxy:
        store = VectorStore(proxy.url, token=TOKEN, auth_header="X-Chroma-Token")
        assert store.heartbeat() > 0
        assert store.count("sluice-raw-token-test") == 0
        store.drop_collection("sluice-raw-token-test")
        assert proxy.served > 0 and proxy.refused == 0


@pytest.mark.parametrize("token", [None, "not-the-token"], ids=["no-token", "wrong-token"])
def test_a_refused_token_is_classified(make_ctx, services, samples, token):
    with ChromaProxy(services.chroma.url) as proxy:
        env = {"SLUICE_CHROMA_URL": proxy.url, **({"SLUICE_CHROMA_TOKEN": token} if token else {})}
        ctx = make_ctx(**env)
        result = ingest_path(ctx, samples / "001-minimal-document.pdf", dataset="default")
        assert run_job(result.job_id, ctx=ctx).result == "retrying"
        j = job(ctx, result.job_id)
        assert (j.error_kind, j.error_code) == (ErrorKind.transient, "auth_failed")
        assert "refused" in j.error_message and "SLUICE_CHROMA_TOKEN" in j.fix_hint
        assert "not-the-token" not in j.error_message
        assert proxy.refused > 0 and proxy.served == 0


def test_a_chroma_that_stops_answering_times_out_classified(services, sluice_env):
    with ChromaProxy(services.chroma.url) as proxy:
        store = VectorStore(proxy.url, token=TOKEN, timeout=1.0)
        assert store.count("sluice-silent-test") == 0  # connected, collection cached
        proxy.silent.set()
        # the read's own timeout (http.client's socket), not a hang
        with pytest.raises(TimeoutError) as info:
            store.count("sluice-silent-test")
        err = classify(info.value)
        assert (err.kind, err.code) == (ErrorKind.transient, "service_unavailable")
        # A new client meets the silence at its first request, bounded the same way.
        with pytest.raises(httpx.ReadTimeout) as info:
            VectorStore(proxy.url, token=TOKEN, timeout=1.0).heartbeat()
        assert classify(info.value).kind == ErrorKind.transient


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: nothing listens there


def test_a_dead_chroma_is_retried_and_a_worker_with_the_right_url_finishes(
    make_ctx, start_worker, services, samples
):
    dead = f"http://127.0.0.1:{_dead_port()}"
    # A long attempt budget with a slower backoff: the job keeps waiting while Chroma is away.
    ctx = make_ctx(SLUICE_CHROMA_URL=dead, SLUICE_MAX_ATTEMPTS="50", SLUICE_RETRY_BASE_SECONDS="1")
    from sluice.pipeline.queueing.publishing import publish

    lost = start_worker(workers=1, name="no-chroma")
    result = ingest_path(
        ctx, samples / "001-minimal-document.pdf", dataset="default", publish=publish
    )
    waiting = wait_for(ctx, [result.job_id], statuses={"retrying"}, timeout=60)[0]
    assert (waiting.error_kind, waiting.error_code) == (ErrorKind.transient, "service_unavailable")
    assert "did not answer" in waiting.error_message and waiting.waiting_for == f"Chroma at {dead}"
    lost.stop()

    start_worker(workers=1, env={"SLUICE_CHROMA_URL": services.chroma.url}, name="with-chroma")
    done = wait_for(ctx, [result.job_id], timeout=90)[0]
    assert done.status == JobStatus.succeeded and done.error_kind is None
    kinds = [
        e.kind for e in events(ctx, done.id) if e.kind != "noop"
    ]  # a late second delivery is a no-op
    assert "waiting" in kinds and kinds[-1] == "succeeded"  # an outage, not the job's failure
    assert done.attempt == 1
    live = make_ctx(SLUICE_CHROMA_URL=services.chroma.url)
    assert ids_of_job(live, done.id) == expected_ids(live, done)
