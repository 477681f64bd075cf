"""The metrics process (``sluice serve metrics``): Prometheus's /metrics over the collectors of
``sluice.ops.metrics``, behind the Host check and the token."""

from __future__ import annotations

import hmac
import logging
import socket
import sys
from collections.abc import Callable
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client.exposition import ThreadingWSGIServer, make_wsgi_app

from sluice.ops.gate import Connection, check_metrics_bind, host_refusal
from sluice.ops.metrics import registry
from sluice.settings import Settings, get_settings

log = logging.getLogger(__name__)


def refusal(settings: Settings, environ: dict) -> tuple[str, str] | None:
    """The status line and reason for refusing a request, or None when it may be answered."""
    as_console = settings.model_copy(
        update={
            "console_address": settings.metrics_address,
            "console_hosts": settings.metrics_hosts,
        }
    )
    headers = {
        name: environ[key]
        for name, key in (("host", "HTTP_HOST"), ("origin", "HTTP_ORIGIN"))
        if key in environ
    }
    why = host_refusal(as_console, Connection(peer=None, headers=headers))
    if why is not None:
        return "403 Forbidden", why.replace("SLUICE_CONSOLE_HOSTS", "SLUICE_METRICS_HOSTS")
    if settings.metrics_token is not None:
        expected = f"Bearer {settings.metrics_token.get_secret_value()}".encode()
        given = environ.get("HTTP_AUTHORIZATION", "").encode("latin-1", "replace")
        if not hmac.compare_digest(given, expected):
            return "401 Unauthorized", "this /metrics needs 'Authorization: Bearer <token>'"
    return None


def guarded_app(settings: Settings, app: Callable) -> Callable:
    """The exporter's WSGI app behind the Host check and the token."""

    def guarded(environ, start_response):
        refused = refusal(settings, environ)
        if refused is None:
            return app(environ, start_response)
        status, reason = refused
        headers = [("Content-Type", "text/plain; charset=utf-8")]
        if status.startswith("401"):
            headers.append(("WWW-Authenticate", 'Bearer realm="sluice-metrics"'))
        start_response(status, headers)
        return [reason.encode("utf-8") + b"\n"]

    return guarded


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 (the standard library's name)
        pass


def serve(settings: Settings) -> None:
    """Serve /metrics until the process is stopped (what ``sluice serve metrics`` runs)."""
    check_metrics_bind(settings)
    address, port = settings.metrics_address.strip("[]"), settings.metrics_port
    family = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]

    class Server(ThreadingWSGIServer):
        address_family = family[0]

    app = guarded_app(settings, make_wsgi_app(registry()))
    host = str(family[4][0])  # the address, as getaddrinfo gives it back
    server = make_server(host, port, app, Server, handler_class=_QuietHandler)
    log.warning("metrics on http://%s:%s/metrics", settings.metrics_address, port)
    try:
        server.serve_forever()
    finally:
        server.server_close()


def main() -> int:
    serve(get_settings())
    return 0


if __name__ == "__main__":
    sys.exit(main())
