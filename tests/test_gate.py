"""sluice.ops.gate on its own: which Host and Origin values pass, who counts as local, and which
address a failed sign-in is counted under (the websocket tests in test_security_console.py prove
the same against a running console)."""

from __future__ import annotations

import pytest

from sluice.ops import gate
from sluice.settings import load_settings


def conn(peer="127.0.0.1", **headers):
    return gate.connection(peer, {k.replace("_", "-"): v for k, v in headers.items()})


@pytest.mark.parametrize(
    ("host", "origin", "ok"),
    [
        ("127.0.0.1:8501", None, True),
        ("localhost:8501", "http://localhost:8501", True),
        ("[::1]:8501", "http://[::1]:8501", True),
        ("console.example.com", "https://console.example.com", True),
        ("rebind.attacker.example:8501", "http://rebind.attacker.example:8501", False),
        ("127.0.0.1:8501", "http://evil.example", False),
        ("127.0.0.1:8501", "null", False),
        ("user@127.0.0.1", None, False),
        ("127.0.0.1:99999", None, False),
        (None, None, False),
    ],
)
def test_only_the_consoles_own_hosts_pass(host, origin, ok):
    settings = load_settings(_env_file=None, console_hosts="console.example.com")
    headers = {k: v for k, v in (("host", host), ("origin", origin)) if v is not None}
    assert (gate.host_refusal(settings, gate.connection("127.0.0.1", headers)) is None) is ok


def test_local_means_loopback_peer_loopback_host_and_no_proxy():
    settings = load_settings(_env_file=None)
    assert not gate.sign_in_required(settings, conn(host="127.0.0.1:8501"))
    assert gate.sign_in_required(settings, conn(peer="192.0.2.2", host="192.0.2.2:8501"))
    assert gate.sign_in_required(
        settings, conn(host="console.example.com", x_forwarded_proto="https")
    )
    assert gate.sign_in_required(settings, conn(peer=None, host="127.0.0.1:8501"))
    assert gate.sign_in_required(
        load_settings(_env_file=None, console_sign_in="always"), conn(host="localhost")
    )
    assert not gate.sign_in_required(
        load_settings(_env_file=None, console_sign_in="off"),
        conn(peer="192.0.2.2", host="192.0.2.2"),
    )


def test_forwarded_addresses_are_believed_only_from_trusted_proxies():
    plain = load_settings(_env_file=None)
    proxied = load_settings(_env_file=None, console_trusted_proxies="127.0.0.1,10.0.0.0/8")
    # uvicorn already put the forwarded address in place of the loopback peer: undone
    rewritten = gate.connection("198.51.100.9", {"host": "x", "x-forwarded-for": "198.51.100.9"})
    assert rewritten.peer == "127.0.0.1"
    assert gate.client_address(plain, rewritten) == "127.0.0.1"
    assert gate.client_address(proxied, rewritten) == "198.51.100.9"
    chain = gate.connection(
        "198.51.100.9", {"host": "x", "x-forwarded-for": "203.0.113.5, 198.51.100.9, 10.1.2.3"}
    )
    assert (
        gate.client_address(proxied, chain) == "198.51.100.9"
    )  # the rightmost address no proxy vouches for
    direct = gate.connection("192.0.2.50", {"host": "x", "x-forwarded-for": "203.0.113.5"})
    assert (
        gate.client_address(proxied, direct) == "192.0.2.50"
    )  # not a proxy: its header means nothing


def test_a_bad_trusted_proxy_is_refused_naming_the_variable():
    from sluice.errors import SettingsError

    with pytest.raises(SettingsError, match="SLUICE_CONSOLE_TRUSTED_PROXIES"):
        load_settings(_env_file=None, console_trusted_proxies="proxy.example")
