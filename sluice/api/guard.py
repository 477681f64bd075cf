"""Around every answer of the API, also the routing's own 404s: the Host and Origin check (the
console's rule, sluice.ops.gate) and the headers that keep it out of other sites' frames."""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sluice.api.problems import problem_response
from sluice.ops.gate import Connection, host_refusal
from sluice.settings import Settings, get_settings

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


def _as_console(settings: Settings) -> Settings:
    return settings.model_copy(
        update={"console_address": settings.api_address, "console_hosts": settings.api_hosts}
    )


def refusal(settings: Settings, host: str | None, origin: str | None) -> str | None:
    """Why the API must not answer a request with this Host and Origin (a page that rebinds its DNS
    name to this machine, another site's script), or None."""
    headers = {k: v for k, v in (("host", host), ("origin", origin)) if v is not None}
    if host_refusal(_as_console(settings), Connection(peer=None, headers=headers)) is None:
        return None
    if (
        origin is not None
        and origin != "null"
        and host_refusal(_as_console(settings), Connection(peer=None, headers={"host": host or ""}))
        is None
    ):
        return (
            "a page of another site may not call this API (its Origin is not one of the API's "
            "names)"
        )
    return (
        "this API does not answer at that Host; add the name it is reached by to SLUICE_API_HOSTS"
    )


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
        why = refusal(get_settings(), headers.get("host"), headers.get("origin"))
        if why is not None:
            await problem_response(403, "host_not_allowed", why)(scope, receive, with_headers)
            return
        await self.app(scope, receive, with_headers)
