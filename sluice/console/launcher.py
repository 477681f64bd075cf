"""``python -m sluice.console.launcher run app.py ...``: Streamlit's own command line, with a guard
around every HTTP answer of its server (what ``sluice serve console`` execs).

Streamlit 1.67 serves through Starlette and uvicorn and offers no setting for response headers.
The launcher wraps the function that builds Streamlit's Starlette application, so the guard sits
outside every route Streamlit has (the page, ``/_stcore/*``, ``/static/*``, ``/media/*``,
components), and then hands over to Streamlit's command line unchanged:

- ``X-Frame-Options: SAMEORIGIN`` and ``Content-Security-Policy: frame-ancestors 'self'`` on
  every answer, so no other site can show the console in a frame (clickjacking); the console's
  own page may, and must: custom components (streamlit-autorefresh, which keeps the live pages
  live) draw in a frame served by this same server, and ``DENY`` leaves them blank;
- the console's Host and Origin rule (``sluice.ops.gate``) for every HTTP request, not only for
  the websocket the script runs on: ``/media/...`` (originals, page images) answers only at the
  names the console is served at.
"""

from __future__ import annotations

import sys
from typing import Any

from sluice.ops import gate
from sluice.settings import get_settings

FRAME_HEADERS = [
    (b"x-frame-options", b"SAMEORIGIN"),
    (b"content-security-policy", b"frame-ancestors 'self'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]


class FrameGuard:
    """ASGI middleware: the frame headers on every HTTP answer, and the Host and Origin rule."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            await self.app(_without_foreign_resume(scope), receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: dict) -> None:
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in _OURS]
                message["headers"] = [*kept, *FRAME_HEADERS]
            await send(message)

        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        conn = gate.connection(None, headers)
        why = gate.host_refusal(get_settings(), conn)
        if why is not None:
            await _refuse(why, with_headers)
            return
        await self.app(scope, receive, with_headers)


_OURS = {name for name, _ in FRAME_HEADERS}


def _without_foreign_resume(scope: dict) -> dict:
    """The websocket's request, minus a session id to resume that belongs to another browser
    (Streamlit reads it from the third entry of Sec-WebSocket-Protocol): that connection gets a
    new session instead of a signed-in one (see sluice.console.login)."""
    from http.cookies import SimpleCookie

    from sluice.console import login

    headers = list(scope.get("headers", []))
    cookie_header = b"; ".join(v for k, v in headers if k.lower() == b"cookie").decode("latin-1")
    cookies = SimpleCookie()
    try:
        cookies.load(cookie_header)
    except Exception:
        cookies = SimpleCookie()
    xsrf = cookies.get(login.XSRF_COOKIE)
    out = []
    for key, value in headers:
        if key.lower() == b"sec-websocket-protocol":
            entries = [e.strip() for e in value.decode("latin-1").split(",")]
            if (
                len(entries) >= 3
                and entries[2]
                and not login.may_resume(entries[2], xsrf.value if xsrf else None)
            ):
                value = ", ".join(entries[:2]).encode("latin-1")
        out.append((key, value))
    return {**scope, "headers": out}


async def _refuse(why: str, send: Any) -> None:
    body = f"Refused: {why}\n".encode()
    await send(
        {
            "type": "http.response.start",
            "status": 403,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def install() -> None:
    """Wrap Streamlit's application factory (idempotent); the server builds it after this."""
    from streamlit.web.server.starlette import starlette_server

    original = starlette_server.create_starlette_app
    if getattr(original, "sluice_guarded", False):
        return

    def create_starlette_app(runtime: Any) -> Any:
        app = original(runtime)
        app.add_middleware(FrameGuard)
        return app

    create_starlette_app.sluice_guarded = True  # type: ignore[attr-defined]
    starlette_server.create_starlette_app = create_starlette_app


def main() -> None:
    install()
    from streamlit.web import cli

    sys.argv = ["streamlit", *sys.argv[1:]]
    cli.main(prog_name="streamlit")


if __name__ == "__main__":
    main()
