"""Around every answer of the API, also the routing's own 404s: the Host and Origin check (the
console's rule, sluice.ops.api_gate) and the headers that keep it out of other sites' frames."""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sluice.api.problems import problem_response
from sluice.ops import api_gate
from sluice.settings import get_settings

SECURITY_HEADERS = [
    (b"x-frame-options", b"DENY"),
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        b"img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]


class Guard:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        headers = Headers(scope=scope)
        why = api_gate.refusal(get_settings(), headers.get("host"), headers.get("origin"))
        if why is not None:
            await problem_response(403, "host_not_allowed", why)(scope, receive, with_headers)
            return
        await self.app(scope, receive, with_headers)
