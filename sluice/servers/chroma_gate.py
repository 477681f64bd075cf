"""``sluice serve chroma``: the Chroma server behind a small gate that checks the Host and the
token.

``chroma run`` (1.5.9) answers any request: it checks no token and no Host header, so a web page
that rebinds its DNS name to 127.0.0.1 could read every chunk. The gate listens where
``SLUICE_CHROMA_URL`` says and forwards to a ``chroma run`` on a random loopback port:

- a request must carry the token (``Authorization: Bearer <token>``, or the raw token in the
  header named by ``SLUICE_CHROMA_AUTH_HEADER``), compared in constant time:
  ``SLUICE_CHROMA_TOKEN``, or without it the one made on first start in
  ``$SLUICE_DATA_DIR/chroma-gate/token`` (0600, as the Redis passwords are), which every client
  of this data directory sends;
- ``make_app`` without a token (no longer what ``serve`` runs) checks that the Host is a loopback
  name or the URL's own host, which a page of another site cannot send.

It does not keep out a local user who finds the inner port; the data directory's mode does that
for the files (docs/security.md).
"""

from __future__ import annotations

import hmac
import logging
import subprocess
import sys
from urllib.parse import urlsplit

from sluice.files import private_dir, use_private_umask
from sluice.servers.processes import chroma_argv, free_loopback_port, wait_listening
from sluice.settings import MadeSecret, Settings, chroma_token_path

HOP_BY_HOP = {
    b"connection",
    b"keep-alive",
    b"proxy-authenticate",
    b"proxy-authorization",
    b"te",
    b"trailers",
    b"transfer-encoding",
    b"upgrade",
    b"host",
}
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}

log = logging.getLogger(__name__)


def refusal(
    headers: dict[bytes, bytes], *, token: str | None, header: str, allowed_hosts: set[str]
) -> int | None:
    """The HTTP status to refuse a request with, or None to let it through."""
    if token is not None:
        given = headers.get(header.lower().encode("latin-1"), b"").decode("latin-1")
        expected = f"Bearer {token}" if header.lower() == "authorization" else token
        return None if hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8")) else 401
    host = headers.get(b"host", b"").decode("latin-1")
    try:
        name = (urlsplit(f"//{host}").hostname or "").rstrip(".").lower()
    except ValueError:
        return 400
    return None if name in allowed_hosts else 403


def make_app(*, upstream: str, token: str | None, header: str, allowed_hosts: set[str]):
    """A plain ASGI app that forwards every allowed request to ``upstream``, streaming both ways."""
    import httpx

    client = httpx.AsyncClient(
        base_url=upstream, timeout=httpx.Timeout(None), follow_redirects=False
    )
    auth = header.lower().encode("latin-1")

    async def app(scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(client, receive, send)
            return
        if scope["type"] != "http":
            return
        headers = dict(scope["headers"])
        status = refusal(headers, token=token, header=header, allowed_hosts=allowed_hosts)
        if status is not None:
            await _refuse(send, status)
            return
        await _forward(client, scope, receive, send, auth=auth)

    return app


async def _lifespan(client, receive, send) -> None:
    """Answer the server's startup; at its shutdown close the upstream client, then answer."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await client.aclose()
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _refuse(send, status: int) -> None:
    body = b'{"error":"Forbidden","message":"refused by the Sluice gate (host or token)"}'
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


BROKEN_UPSTREAM = ("ConnectError", "RemoteProtocolError", "ReadError", "WriteError")


async def _forward(client, scope, receive, send, *, auth: bytes) -> None:
    """The request upstream without its hop-by-hop and auth headers, the answer back as it comes.
    A request that meets a broken upstream connection before any answer (a kept-alive connection
    the server closed) is sent once more on a new one; then 502, logged with why."""
    import httpx

    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    content = b"".join(chunks)
    forward = [(k, v) for k, v in scope["headers"] if k not in HOP_BY_HOP and k != auth]
    path = scope.get("raw_path") or scope["path"].encode()
    url = path.decode("latin-1") + (
        f"?{scope['query_string'].decode('latin-1')}" if scope["query_string"] else ""
    )
    response = None
    for attempt in (1, 2):
        request = client.build_request(scope["method"], url, headers=forward, content=content)
        try:
            response = await client.send(request, stream=True)
            break
        except httpx.HTTPError as exc:
            again = attempt == 1 and type(exc).__name__ in BROKEN_UPSTREAM
            log.warning(
                "chroma gate: %s %s failed upstream (%s: %s)%s",
                scope["method"],
                scope["path"],
                type(exc).__name__,
                exc,
                "; sending it again on a new connection" if again else "; answering 502",
            )
            if not again:
                break
    if response is None:
        await send(
            {
                "type": "http.response.start",
                "status": 502,
                "headers": [(b"content-length", b"0")],
            }
        )
        await send({"type": "http.response.body", "body": b""})
        return
    try:
        await send(
            {
                "type": "http.response.start",
                "status": response.status_code,
                "headers": [(k, v) for k, v in response.headers.raw if k.lower() not in HOP_BY_HOP],
            }
        )
        async for chunk in response.aiter_raw():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    finally:
        await response.aclose()


def serve(settings: Settings) -> int:
    """Run ``chroma run`` on a random loopback port and the gate on the URL's host and port."""
    import uvicorn

    use_private_umask()
    parts = urlsplit(settings.chroma_url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 8000
    inner = free_loopback_port()
    argv = chroma_argv(url=f"http://{host}:{inner}", path=private_dir(settings.chroma_dir))
    argv[argv.index("--host") + 1] = "127.0.0.1"
    chroma = subprocess.Popen(argv, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
    try:
        wait_listening(inner, 60, exited=lambda: chroma.poll() is not None)
        # SLUICE_CHROMA_TOKEN, or the one in the data directory, made now if this is the first start
        token = (
            settings.chroma_token.get_secret_value() if settings.chroma_token is not None else None
        )
        made = isinstance(settings.chroma_token, MadeSecret)
        app = make_app(
            upstream=f"http://127.0.0.1:{inner}",
            token=token,
            header=settings.chroma_auth_header,
            allowed_hosts=LOOPBACK_NAMES | {host.lower()},
        )
        print(
            f"sluice: Chroma at http://{host}:{port} "
            f"({'token required' if token else 'loopback Host only'}"
            f"{f': the one in {chroma_token_path(settings.data_dir)}' if made else ''})",
            file=sys.stderr,
            flush=True,
        )
        uvicorn.run(
            app,
            host=host,
            port=port,
            log_level="warning",
            proxy_headers=False,
            access_log=False,
            lifespan="on",
        )
        return 0
    finally:
        chroma.terminate()
        try:
            chroma.wait(20)
        except subprocess.TimeoutExpired:
            chroma.kill()


def _die_with_parent() -> None:
    """Linux: the inner Chroma gets SIGTERM if this process dies, even by SIGKILL (no orphan on the
    data)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass
