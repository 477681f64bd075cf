"""Whether the HTTP API answers a request at all (Host and Origin), and where it may listen: the
console's rules (sluice.ops.gate), with the API's own address and names."""

from __future__ import annotations

from sluice.errors import SettingsError
from sluice.ops.gate import Connection, host_refusal
from sluice.settings import Settings, is_loopback

WILDCARDS = ("0.0.0.0", "::", "")


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


def check_api_bind(settings: Settings) -> None:
    """Beyond loopback the API needs the names it is reached by (its TLS proxy's), so that the
    Host check can tell them from a rebinding page; a wildcard address without any is refused."""
    address = settings.api_address.strip("[]")
    if is_loopback(address) or settings.api_hosts:
        return
    if address in WILDCARDS:
        raise SettingsError(
            f"SLUICE_API_ADDRESS={settings.api_address} listens on every interface, but "
            "SLUICE_API_HOSTS is not set: name the host the API is reached by (the TLS proxy in "
            "front of it, docs/security.md), or listen on 127.0.0.1."
        )
