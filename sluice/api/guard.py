"""Around every answer of the API, also the routing's own 404s: the Host and Origin check (the
console's rule, sluice.ops.gate) and the headers that keep it out of other sites' frames.

Below it, each connection (``ConnectionGuard``, uvicorn's h11 protocol as ``sluice serve api`` runs
it): a request head must arrive whole within ``SLUICE_API_HEADER_TIMEOUT_SECONDS`` (a client that
sends its headers a byte at a time held a connection for ever), one client address holds at most
``SLUICE_API_CONNECTIONS_PER_ADDRESS`` connections (``SLUICE_API_TRUSTED_PROXIES`` are not counted
per address), and a head h11 cannot read, or one over its 16 KiB, is answered as problem+json."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
from collections import Counter
from functools import lru_cache
from typing import Any

import h11
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from sluice.api.problems import MEDIA_TYPE, problem_body, problem_response
from sluice.ops.gate import Connection, host_refusal
from sluice.settings import Settings, get_settings

log = logging.getLogger(__name__)

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


# What a connection is answered when its head cannot be taken (h11's status hint -> code); any
# other hint answers http_<status>.
HEAD_STATUS = {"bad_request": 400, "request_head_too_large": 431, "too_many_connections": 429}
HEAD_TITLES = {431: "Request header fields too large"}
HEAD_DETAIL = {
    400: "the request's line or headers could not be read as HTTP/1.1",
    431: "the request's line and headers are larger than {limit:,} bytes",
}


@lru_cache(maxsize=8)
def _networks(spec: tuple[str, ...]) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    return tuple(ipaddress.ip_network(item, strict=False) for item in spec)


def trusted_proxy(settings: Settings, host: str) -> bool:
    """Whether ``host`` is one of ``SLUICE_API_TRUSTED_PROXIES`` (addresses or networks)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return any(address in net for net in _networks(tuple(settings.api_trusted_proxies)))


class _Parser(h11.Connection):
    """h11's connection, keeping the error it refused the client's bytes with (its status hint:
    431 for a head over the size limit), which uvicorn's protocol drops."""

    refused: h11.RemoteProtocolError | None = None

    def next_event(self) -> Any:
        try:
            return super().next_event()
        except h11.RemoteProtocolError as exc:
            self.refused = exc
            raise


OPEN: Counter[str] = Counter()  # connections open per client address (trusted proxies apart)


class ConnectionGuard(H11Protocol):
    """uvicorn's h11 protocol with the bounds of the module's docstring: a timer from a
    connection's start (and from each answer's end) to its next complete head, cancelled when
    the head is whole; a count per address; problem+json for a head h11 refuses."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        settings = get_settings()
        self.settings = settings
        self.head_seconds = settings.api_header_timeout_seconds
        self.per_address = settings.api_connections_per_address
        self.max_head = self.conn._max_incomplete_event_size
        self.conn = _Parser(h11.SERVER, self.max_head)
        self.head_timer: asyncio.TimerHandle | None = None
        self.counted: str | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        host = self.client[0] if self.client else ""
        if host and not trusted_proxy(self.settings, host):
            self.counted = host
            OPEN[host] += 1
            if OPEN[host] > self.per_address:
                self._refuse_connection(host)
                return
        self._watch_head()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.counted is not None:
            OPEN[self.counted] -= 1
            if OPEN[self.counted] <= 0:
                del OPEN[self.counted]
            self.counted = None
        self._stop_head_timer()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        self._watch_head()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch_head()

    def _watch_head(self) -> None:
        """The timer runs while the client owes a head (h11's IDLE), from when it began to."""
        owed = self.conn.their_state is h11.IDLE and not self.transport.is_closing()
        if owed and self.head_timer is None:
            self.head_timer = self.loop.call_later(self.head_seconds, self._head_too_slow)
        elif not owed:
            self._stop_head_timer()

    def _stop_head_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def _head_too_slow(self) -> None:
        self.head_timer = None
        if self.conn.their_state is not h11.IDLE or self.transport.is_closing():
            return
        log.info(
            "closed a connection from %s: no whole request head within %.0f s "
            "(SLUICE_API_HEADER_TIMEOUT_SECONDS)",
            self.client[0] if self.client else "?",
            self.head_seconds,
        )
        try:
            self.conn.send(h11.ConnectionClosed())
        except h11.LocalProtocolError:
            pass
        self.transport.close()

    def _refuse_connection(self, host: str) -> None:
        """429 at once, before the client's request is read, and close (logged once a burst)."""
        if OPEN[host] == self.per_address + 1:
            log.warning(
                "refusing connections from %s: it holds %d (SLUICE_API_CONNECTIONS_PER_ADDRESS)",
                host,
                self.per_address,
            )
        detail = (
            f"this address holds {self.per_address} connections to the API already "
            "(SLUICE_API_CONNECTIONS_PER_ADDRESS); close one, or reuse it"
        )
        body = _body(429, "too_many_connections", detail)
        head = [
            b"HTTP/1.1 429 Too Many Requests",
            f"content-type: {MEDIA_TYPE}".encode(),
            f"content-length: {len(body)}".encode(),
            b"retry-after: 1",
            b"connection: close",
            *(name + b": " + value for name, value in SECURITY_HEADERS),
        ]
        self.transport.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        """A head h11 refused, as problem+json at h11's status (431 for one over its size)."""
        refused = self.conn.refused if isinstance(self.conn, _Parser) else None
        status = refused.error_status_hint if refused is not None else 400
        code = next((c for c, s in HEAD_STATUS.items() if s == status), f"http_{status}")
        detail = HEAD_DETAIL.get(status, msg).format(limit=self.max_head)
        body = _body(status, code, detail)
        headers = [
            (b"content-type", MEDIA_TYPE.encode()),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
            *SECURITY_HEADERS,
        ]
        try:
            self.transport.write(self.conn.send(h11.Response(status_code=status, headers=headers)))
            self.transport.write(self.conn.send(h11.Data(data=body)))
            self.transport.write(self.conn.send(h11.EndOfMessage()))
        except h11.LocalProtocolError:  # an answer had begun: nothing more to say on it
            pass
        self.transport.close()


def _body(status: int, code: str, detail: str) -> bytes:
    extra = {"title": HEAD_TITLES[status]} if status in HEAD_TITLES else {}
    return json.dumps(problem_body(status, code, detail, **extra), separators=(",", ":")).encode()
