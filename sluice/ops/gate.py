"""Who is on the other end of a console connection, and whether the console answers it at all.

The console decides this itself, on every run of its script, from the connection's own request:
whichever way Streamlit was launched (``sluice serve console`` or a bare ``streamlit run``), on
whatever address.

- **Host and Origin.** The console answers only at the names it is served on: loopback names, the
  configured ``SLUICE_CONSOLE_ADDRESS`` and ``SLUICE_CONSOLE_HOSTS``. A page on another site that
  rebinds its DNS name to 127.0.0.1 sends its own name as Host and Origin, and is refused.
- **Sign-in.** Without a password the console is open only to a connection that really comes from
  this machine: a loopback peer, a loopback Host, and no forwarding header (a proxy on the same
  host connects from loopback too, on behalf of anyone). Everything else must sign in, unless the
  operator opted out explicitly with ``SLUICE_CONSOLE_SIGN_IN=off``.
- **Client address.** ``X-Forwarded-For`` is believed only from the proxies in
  ``SLUICE_CONSOLE_TRUSTED_PROXIES``. The server under Streamlit (uvicorn) already replaces the
  peer by the forwarded address whenever the peer is loopback; ``connection`` undoes that, so a
  local client rotating the header stays one client.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import os
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from sluice.errors import SettingsError
from sluice.files import private_dir, write_private
from sluice.settings import Settings, is_loopback

FORWARDING_HEADERS = (
    "x-forwarded-for",
    "forwarded",
    "x-real-ip",
    "x-forwarded-host",
    "x-forwarded-proto",
    "x-forwarded-server",
    "via",
)
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
UVICORN_DEFAULT_TRUSTED = "127.0.0.1,::1"


@dataclass(frozen=True)
class Connection:
    """One console connection as its request showed it."""

    peer: str | None  # the TCP peer as far as it can be established; None when unknown
    headers: Mapping[str, str] = field(default_factory=dict)  # lower-case names
    in_process: bool = False  # no socket at all (Streamlit's AppTest runs the script in-process)

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    @property
    def forwarded(self) -> bool:
        return any(self.header(h) for h in FORWARDING_HEADERS)


def connection(
    remote_ip: str | None,
    headers: Iterable[tuple[str, str]] | Mapping[str, str] | None,
    *,
    in_process: bool = False,
) -> Connection:
    """Build a Connection from what Streamlit reports, undoing uvicorn's X-Forwarded-For rewrite."""
    items = headers.items() if isinstance(headers, Mapping) else (headers or [])
    merged: dict[str, str] = {}
    for name, value in items:
        key = name.lower()
        merged[key] = f"{merged[key]}, {value}" if key in merged else value
    peer = remote_ip
    xff = merged.get("x-forwarded-for")
    if xff and remote_ip is not None:
        trusted = os.environ.get("FORWARDED_ALLOW_IPS", UVICORN_DEFAULT_TRUSTED)
        if remote_ip == _rightmost_untrusted(xff, _networks(trusted)):
            # uvicorn put this address there: the real peer was one uvicorn trusts (loopback by
            # default)
            peer = "127.0.0.1" if _all_loopback(trusted) else None
    return Connection(peer=peer, headers=merged, in_process=in_process)


def allowed_hosts(settings: Settings) -> set[str]:
    hosts = {*LOOPBACK_NAMES, *(h.lower() for h in settings.console_hosts)}
    address = settings.console_address.strip("[]").lower()
    if address not in ("0.0.0.0", "::", ""):
        hosts.add(address)
    return hosts


def _hostname(value: str | None, *, origin: bool = False) -> str | None:
    if not value:
        return None
    try:
        parts = urlsplit(value if origin else f"//{value}")
        _ = parts.port  # a bad port is a bad host
    except ValueError:
        return None
    if origin and parts.scheme not in ("http", "https"):
        return None
    if parts.username is not None or parts.password is not None or (not origin and parts.path):
        return None
    return (parts.hostname or "").rstrip(".").lower() or None


def host_refusal(settings: Settings, conn: Connection) -> str | None:
    """Why the console must not answer this connection, or None when it may."""
    if conn.in_process:
        return None
    allowed = allowed_hosts(settings)
    if "*" in allowed:
        return None
    host = _hostname(conn.header("host"))
    if host is None or host not in allowed:
        return (
            f"this console does not answer at {conn.header('host')!r}. It is served at "
            f"{', '.join(sorted(allowed))}; add a name it is reached by to SLUICE_CONSOLE_HOSTS."
        )
    origin = conn.header("origin")
    if origin is not None and origin != "null":
        if _hostname(origin, origin=True) not in allowed:
            return (
                f"a page at {origin!r} may not drive this console (Origin is not one of its hosts)."
            )
    elif origin == "null":
        return "a page with an opaque origin may not drive this console."
    return None


def direct_loopback(conn: Connection) -> bool:
    """The request comes from this machine, straight, with no proxy in between."""
    if conn.in_process:
        return True
    return (
        is_loopback(conn.peer)
        and not conn.forwarded
        and is_loopback(_hostname(conn.header("host")))
    )


def sign_in_required(settings: Settings, conn: Connection) -> bool:
    if settings.console_sign_in == "off":
        return False
    if settings.console_sign_in == "always" or settings.console_password is not None:
        return True
    return not direct_loopback(conn)


# --- the local link: who is "at this machine" -----------------------------------------------------
# On a host with other users, a loopback connection is not an identity: any of them can open
# 127.0.0.1:8501. Without a password, the console therefore serves a loopback browser only once it
# has opened a link that `sluice serve console` or `sluice console-url` printed for Sluice's own
# user: the link carries a one-time token whose hash waits in a 0700 folder of the data directory
# that no other user can read or write. The browser that redeemed it stays signed in.

TOKEN_DIR = "console-links"
TOKEN_SECONDS = 15 * 60  # a link not opened within this long no longer works
TOKEN_PARAM = "token"


def local_link_required(settings: Settings, conn: Connection) -> bool:
    """Without a password, a connection straight from this machine still shows a local link."""
    return settings.console_sign_in == "auto" and not conn.in_process


def mint_local_link(settings: Settings) -> str:
    """A new one-time token for the console (its hash stored, 0600, in the private data dir)."""
    token = secrets.token_urlsafe(32)
    folder = private_dir(settings.data_dir / TOKEN_DIR)
    for old in folder.iterdir():  # links never opened, past their time
        with contextlib.suppress(OSError):
            if time.time() - old.stat().st_mtime > TOKEN_SECONDS:
                old.unlink()
    write_private(folder / _token_name(token), "")
    return token


def redeem_local_link(settings: Settings, token: str | None) -> bool:
    """True once for a token minted here within TOKEN_SECONDS; it is spent by this call."""
    if not token or len(token) > 200:
        return False
    path = settings.data_dir / TOKEN_DIR / _token_name(token)
    try:
        age = time.time() - path.stat().st_mtime
        path.unlink()  # only one redeemer wins the unlink
    except OSError:
        return False
    return age <= TOKEN_SECONDS


def local_link_url(settings: Settings, token: str) -> str:
    host = settings.console_address
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{settings.console_port}/?{TOKEN_PARAM}={token}"


def _token_name(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def client_address(settings: Settings, conn: Connection) -> str:
    """The address failed sign-ins are counted under: the peer, or what trusted proxies
    forwarded."""
    peer = conn.peer or "unknown"
    trusted = _networks(",".join(settings.console_trusted_proxies))
    xff = conn.header("x-forwarded-for")
    if xff and trusted and _in(peer, trusted):
        return _rightmost_untrusted(xff, trusted) or peer
    return peer


# --- address lists ---------------------------------------------------------------------------


def _networks(spec: str) -> list:
    out = []
    for item in (p.strip() for p in spec.split(",")):
        if not item:
            continue
        if item == "*":
            return ["*"]
        try:
            out.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            continue
    return out


def _in(host: str | None, networks: list) -> bool:
    if "*" in networks:
        return True
    try:
        address = ipaddress.ip_address((host or "").strip("[]"))
    except ValueError:
        return False
    return any(address in net for net in networks)


def _all_loopback(spec: str) -> bool:
    nets = _networks(spec)
    return bool(nets) and "*" not in nets and all(net.network_address.is_loopback for net in nets)


def _rightmost_untrusted(xff: str, trusted: list) -> str | None:
    hosts = [h.strip() for h in xff.split(",") if h.strip()]
    if not hosts:
        return None
    for host in reversed(hosts):
        bare = _strip_port(host)
        if not _in(bare, trusted):
            return bare
    return _strip_port(hosts[0])


def _strip_port(value: str) -> str:
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    if value.count(":") == 1:
        return value.rsplit(":", 1)[0]
    return value


API_WILDCARDS = ("0.0.0.0", "::", "")


def check_api_bind(settings: Settings) -> None:
    """Beyond loopback the API needs the names it is reached by (its TLS proxy's), so that the
    Host check can tell them from a rebinding page; a wildcard address without any is refused."""
    address = settings.api_address.strip("[]")
    if is_loopback(address) or settings.api_hosts:
        return
    if address in API_WILDCARDS:
        raise SettingsError(
            f"SLUICE_API_ADDRESS={settings.api_address} listens on every interface, but "
            "SLUICE_API_HOSTS is not set: name the host the API is reached by (the TLS proxy in "
            "front of it, docs/security.md), or listen on 127.0.0.1."
        )


def check_metrics_bind(settings: Settings) -> None:
    """Refuse to serve /metrics beyond loopback without a token (the console's rule, with its own
    secret): whoever reaches the port would read dataset names and failure codes."""
    if not is_loopback(settings.metrics_address) and settings.metrics_token is None:
        raise SettingsError(
            f"SLUICE_METRICS_ADDRESS={settings.metrics_address} listens beyond this machine, but "
            "SLUICE_METRICS_TOKEN is not set. Set a long random token (scrapers send it as "
            "'Authorization: Bearer <token>'), or listen on 127.0.0.1."
        )
