"""The console decides who it answers, whatever launched it: attacks over a raw websocket against a
real ``sluice serve console`` or a bare ``streamlit run``, each on its own port and database.

- DNS rebinding: a handshake with an attacker's Host and Origin must not drive the console.
- A bare ``streamlit run ... --server.address 0.0.0.0``, and a proxy on the same host, must not
  serve the console without a sign-in.
- Failed sign-ins: a rotating X-Forwarded-For from a loopback peer is still one client; an
  attacker cannot lock out an operator's browser that signed in before.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from sqlmodel import Session, select

from sluice.storage.models import Dataset
from tests.support.console_socket import ConsoleSocket, Refused, local_link, text, trigger
from tests.support.servers import ROOT, ManagedProcess, free_port, wait_port
from tests.test_security_servers import outside_address

APP = ROOT / "sluice" / "console" / "app.py"
PASSWORD = "correct horse 7391"
READONLY = "just looking 5120"


class Console(ManagedProcess):
    def __init__(self, env: dict, log: Path, *, launcher: str, address: str = "127.0.0.1") -> None:
        self.port = free_port()
        if launcher == "sluice":
            argv = [sys.executable, "-m", "sluice.cli.main", "serve", "console"]
            env = {**env, "SLUICE_CONSOLE_ADDRESS": address, "SLUICE_CONSOLE_PORT": str(self.port)}
        else:  # how many people start a Streamlit app: no launcher, any address
            argv = [
                sys.executable,
                "-m",
                "streamlit",
                "run",
                str(APP),
                "--server.address",
                address,
                "--server.port",
                str(self.port),
                "--server.headless",
                "true",
                "--browser.gatherUsageStats",
                "false",
            ]
        super().__init__(argv, log=log, env=env)


@pytest.fixture
def console(ctx, tmp_path):
    started: list[Console] = []

    def start(*, launcher: str = "sluice", address: str = "127.0.0.1", **env) -> Console:
        proc = Console(
            {**os.environ, **env},
            tmp_path / f"console-{len(started)}.log",
            launcher=launcher,
            address=address,
        )
        proc.start()
        started.append(proc)
        wait_port(proc.port, 60)
        return proc

    yield start
    for proc in started:
        proc.stop()


def datasets(ctx) -> set[str]:
    with Session(ctx.engine) as session:
        return {d.name for d in session.exec(select(Dataset)).all()}


def try_create_dataset(sock: ConsoleSocket, name: str, query: str = "") -> str:
    """Run the page, then fill and click the sidebar's Create (by the ids the server sent)."""
    first = sock.run(query=query)
    name_id = first.widget_id("text_input", "Name") or "$$ID-guess-new_dataset_name"
    create_id = first.widget_id("button", "Create") or "$$ID-guess-create_dataset"
    return first.text + sock.run(widgets=[text(name_id, name), trigger(create_id)]).text


def sign_in(port: int, password: str, **socket_args) -> str:
    with ConsoleSocket(port, **socket_args) as sock:
        page = sock.run()
        field, button = (
            page.widget_id("text_input", "Password"),
            page.widget_id("button", "Sign in"),
        )
        assert field and button, page.text[-2000:]
        after = sock.run(widgets=[text(field, password), trigger(button)])
        return after.text + (sock.run().text if "Too many" not in after.text else "")


@pytest.mark.parametrize("launcher", ["sluice", "streamlit"])
def test_dns_rebinding_cannot_drive_the_loopback_console(ctx, console, launcher):
    proc = console(launcher=launcher)
    attacker = "rebind.attacker.example"
    try:
        with ConsoleSocket(
            proc.port, host=attacker, origin=f"http://{attacker}:{proc.port}"
        ) as sock:
            seen = try_create_dataset(sock, "rebound")
        assert "Overview" not in seen
    except Refused:
        pass  # refused at the handshake: better still
    assert "rebound" not in datasets(ctx)
    with ConsoleSocket(
        proc.port, origin=f"http://127.0.0.1:{proc.port}"
    ) as sock:  # the real page still works
        seen = try_create_dataset(sock, "local-ok", query=local_link(ctx.settings))
    assert "Overview" in seen and "local-ok" in datasets(ctx)


def test_a_foreign_origin_on_the_right_host_is_refused(ctx, console):
    proc = console(launcher="streamlit")
    try:
        with ConsoleSocket(proc.port, origin="http://evil.example") as sock:
            seen = try_create_dataset(sock, "cross-origin")
        assert "Overview" not in seen
    except Refused:
        pass  # Streamlit's own CORS check refuses it at the handshake (kept on: server.enableCORS)
    assert "cross-origin" not in datasets(ctx)


def test_bare_streamlit_on_all_interfaces_asks_for_a_sign_in(ctx, console):
    outside = outside_address()
    proc = console(launcher="streamlit", address="0.0.0.0", SLUICE_CONSOLE_HOSTS=outside)
    with ConsoleSocket(proc.port, host=outside, source=outside) as sock:
        seen = try_create_dataset(sock, "from-afar")
    assert "Overview" not in seen and "no sign-in" not in seen
    assert "SLUICE_CONSOLE_PASSWORD" in seen
    assert "from-afar" not in datasets(ctx)


def test_a_proxy_on_the_same_host_does_not_make_a_client_local(ctx, console):
    proc = console(launcher="sluice", SLUICE_CONSOLE_HOSTS="console.example.com")
    with ConsoleSocket(
        proc.port,
        host="console.example.com",
        origin="https://console.example.com",
        host_port=False,
        headers={"X-Forwarded-For": "203.0.113.7", "X-Forwarded-Proto": "https"},
    ) as sock:
        seen = try_create_dataset(sock, "via-proxy")
    assert "Overview" not in seen and "via-proxy" not in datasets(ctx)


@pytest.mark.parametrize("launcher", ["sluice", "streamlit"])
def test_the_loopback_console_without_a_password_opens_only_from_a_local_link(
    ctx, console, launcher
):
    """Finding 4 (second review): any local user was the operator of a console without a
    password. Now a loopback browser needs a one-time link minted for Sluice's own user."""
    proc = console(launcher=launcher)
    origin = {"host": "localhost", "origin": f"http://localhost:{proc.port}"}
    with ConsoleSocket(proc.port, **origin) as sock:
        seen = try_create_dataset(sock, "no-link")
    assert "Overview" not in seen and "sluice console-url" in seen
    with ConsoleSocket(proc.port, **origin) as sock:
        seen = try_create_dataset(sock, "stale", query="token=made-up-by-someone-else")
    assert "Overview" not in seen
    link = local_link(ctx.settings)
    with ConsoleSocket(proc.port, **origin) as sock:
        seen = try_create_dataset(sock, "straight", query=link)
    assert "Overview" in seen and "straight" in datasets(ctx)
    with ConsoleSocket(proc.port, **origin) as sock:  # the link works once
        assert "Overview" not in try_create_dataset(sock, "twice", query=link)
    assert datasets(ctx) & {"no-link", "stale", "twice"} == set()


NOBODY_BROWSER = r"""
import json, os, sys
from streamlit.proto.WidgetStates_pb2 import WidgetState  # imported first: nobody cannot read
from tests.support.console_socket import ConsoleSocket  # the interpreter's files later
from tests.test_security_console import try_create_dataset
import websockets.sync.client, http.client, hashlib, base64, ssl, encodings.idna, socket
"x".encode("idna"); socket.getaddrinfo("127.0.0.1", 1)
os.setgroups([]); os.setgid(65534); os.setuid(65534)
with ConsoleSocket(int(sys.argv[1])) as sock:
    seen = try_create_dataset(sock, "nobody-was-here")
print(json.dumps({"uid": os.getuid(), "overview": "Overview" in seen}))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="becoming another user needs root")
def test_another_local_user_is_not_the_operator_of_a_console_without_a_password(ctx, console):
    """`nobody` opens the loopback console the way `sluice serve console` starts it by default,
    and cannot read the data directory where the links wait (before: the operator's console)."""
    import json
    import subprocess

    proc = console(launcher="sluice")
    local_link(ctx.settings)  # a link waits, unopened: nobody cannot read it
    done = subprocess.run(
        [sys.executable, "-c", NOBODY_BROWSER, str(proc.port)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {"uid": 65534, "overview": False}
    assert "nobody-was-here" not in datasets(ctx)


def test_rotating_forwarded_for_from_loopback_is_still_one_client(ctx, console):
    proc = console(
        launcher="sluice",
        SLUICE_CONSOLE_PASSWORD=PASSWORD,
        SLUICE_LOGIN_MAX_FAILURES="3",
        SLUICE_LOGIN_LOCKOUT_SECONDS="600",
    )
    for i in range(12):
        sign_in(proc.port, f"guess-{i}", headers={"X-Forwarded-For": f"198.51.100.{i + 1}"})
    seen = sign_in(proc.port, PASSWORD, headers={"X-Forwarded-For": "198.51.100.200"})
    assert "Too many failed sign-ins" in seen and "Overview" not in seen


def test_an_attacker_cannot_lock_out_an_operator_who_signed_in_before(ctx, console):
    proc = console(
        launcher="sluice",
        SLUICE_CONSOLE_PASSWORD=PASSWORD,
        SLUICE_LOGIN_MAX_FAILURES="3",
        SLUICE_LOGIN_LOCKOUT_SECONDS="600",
        SLUICE_CONSOLE_TRUSTED_PROXIES="127.0.0.1",
        SLUICE_CONSOLE_HOSTS="console.example.com",
    )
    via_proxy = {
        "host": "console.example.com",
        "origin": "https://console.example.com",
        "host_port": False,
    }
    office = "198.51.100.7"
    operator = {"Cookie": "_streamlit_xsrf=operator-browser-cookie-2c4e", "X-Forwarded-For": office}
    assert "Overview" in sign_in(proc.port, PASSWORD, headers=operator, **via_proxy)
    for i in range(3):  # the attacker shares the operator's address (one office NAT) and locks it
        sign_in(proc.port, f"guess-{i}", headers={"X-Forwarded-For": office}, **via_proxy)
    for i in range(
        40
    ):  # then guesses against the passwords from many addresses, each under its limit
        sign_in(
            proc.port, f"spray-{i}", headers={"X-Forwarded-For": f"203.0.113.{i + 1}"}, **via_proxy
        )
    assert "Overview" in sign_in(proc.port, PASSWORD, headers=operator, **via_proxy)
    stranger = sign_in(proc.port, PASSWORD, headers={"X-Forwarded-For": "192.0.2.99"}, **via_proxy)
    assert (
        "Too many failed sign-ins" in stranger
    )  # a browser never seen waits while the account is sprayed


def test_trusted_proxy_separates_clients_by_their_forwarded_address(ctx, console):
    proc = console(
        launcher="sluice",
        SLUICE_CONSOLE_PASSWORD=PASSWORD,
        SLUICE_LOGIN_MAX_FAILURES="3",
        SLUICE_LOGIN_LOCKOUT_SECONDS="600",
        SLUICE_CONSOLE_TRUSTED_PROXIES="127.0.0.1",
        SLUICE_CONSOLE_HOSTS="console.example.com",
    )
    via_proxy = {
        "host": "console.example.com",
        "origin": "https://console.example.com",
        "host_port": False,
    }
    for i in range(4):
        sign_in(proc.port, f"guess-{i}", headers={"X-Forwarded-For": "198.51.100.66"}, **via_proxy)
    assert "Too many failed sign-ins" in sign_in(
        proc.port, PASSWORD, headers={"X-Forwarded-For": "198.51.100.66"}, **via_proxy
    )
    assert "Overview" in sign_in(
        proc.port, PASSWORD, headers={"X-Forwarded-For": "198.51.100.7"}, **via_proxy
    )


def _xsrf_cookie(port: int) -> str:
    import httpx

    r = httpx.get(
        f"http://127.0.0.1:{port}/_stcore/health", timeout=30
    )  # Streamlit sets the cookie there
    for header in r.headers.get_list("set-cookie"):
        name, _, rest = header.partition("=")
        if name.strip() == "_streamlit_xsrf":
            return rest.split(";", 1)[0]
    return ""


def _upload(port: int, session_id: str, cookie: str, size: int) -> int:
    import httpx

    headers = {"X-Xsrftoken": cookie, "Cookie": f"_streamlit_xsrf={cookie}"} if cookie else {}
    r = httpx.put(
        f"http://127.0.0.1:{port}/_stcore/upload_file/{session_id}/file-1",
        files={"file": ("big.txt", b"x" * size, "text/plain")},
        headers=headers,
        timeout=60,
    )
    return r.status_code


def test_no_upload_is_taken_before_sign_in(ctx, console):
    proc = console(launcher="sluice", SLUICE_CONSOLE_PASSWORD=PASSWORD)
    cookie = _xsrf_cookie(proc.port)
    assert cookie
    with ConsoleSocket(proc.port, headers={"Cookie": f"_streamlit_xsrf={cookie}"}) as sock:
        stranger = sock.run()
        assert "Sign in to the operator console" in stranger.text
        assert _upload(proc.port, stranger.session_id, cookie, 8 * 1024 * 1024) == 403
    with ConsoleSocket(proc.port, headers={"Cookie": f"_streamlit_xsrf={cookie}"}) as sock:
        page = sock.run()
        field, button = (
            page.widget_id("text_input", "Password"),
            page.widget_id("button", "Sign in"),
        )
        sock.run(widgets=[text(field, PASSWORD), trigger(button)])
        assert "Overview" in sock.run().text
        assert (
            _upload(proc.port, page.session_id, cookie, 1024) == 204
        )  # the signed-in operator uploads


def test_a_leaked_session_id_does_not_carry_the_sign_in(ctx, console):
    proc = console(launcher="sluice", SLUICE_CONSOLE_PASSWORD=PASSWORD)
    operator = {"headers": {"Cookie": "_streamlit_xsrf=operator-browser-cookie-91ab"}}
    sock = ConsoleSocket(proc.port, **operator)
    page = sock.run()
    field, button = page.widget_id("text_input", "Password"), page.widget_id("button", "Sign in")
    sock.run(widgets=[text(field, PASSWORD), trigger(button)])
    assert "Overview" in sock.run().text
    leaked = page.session_id  # it shows up in upload URLs and log lines
    sock.close()
    with ConsoleSocket(proc.port, resume=leaked) as thief:
        seen = thief.run()
    assert "Overview" not in seen.text and "Sign in to the operator console" in seen.text


def test_an_unsigned_session_cannot_fire_operator_callbacks(ctx, console):
    """Widget ids are predictable; a session that never signed in sends the Create click anyway."""
    proc = console(launcher="sluice", SLUICE_CONSOLE_PASSWORD=PASSWORD)
    with ConsoleSocket(proc.port, headers={"Cookie": "_streamlit_xsrf=op"}) as sock:
        page = sock.run()
        field, button = (
            page.widget_id("text_input", "Password"),
            page.widget_id("button", "Sign in"),
        )
        sock.run(widgets=[text(field, PASSWORD), trigger(button)])
        signed = sock.run()
        ids = signed.widget_id("text_input", "Name"), signed.widget_id("button", "Create")
    assert all(ids)
    with ConsoleSocket(proc.port) as stranger:
        stranger.run()
        seen = stranger.run(widgets=[text(ids[0], "sneaky"), trigger(ids[1])])
    assert "Sign in to the operator console" in seen.text and "sneaky" not in datasets(ctx)


def test_uploads_still_need_the_xsrf_token(ctx, console):
    proc = console(launcher="sluice")
    cookie = _xsrf_cookie(proc.port)
    with ConsoleSocket(proc.port, headers={"Cookie": f"_streamlit_xsrf={cookie}"}) as sock:
        session = sock.run(query=local_link(ctx.settings)).session_id
        assert _upload(proc.port, session, "", 1024) == 403  # no token: Streamlit's XSRF check
        assert _upload(proc.port, session, cookie, 1024) == 204


def test_a_sign_in_survives_the_browser_reconnecting_with_a_remasked_cookie(ctx, console):
    """Streamlit re-masks its XSRF cookie on every response; the sign-in is tied to the token
    inside."""
    import httpx

    proc = console(launcher="sluice", SLUICE_CONSOLE_PASSWORD=PASSWORD)
    first = _xsrf_cookie(proc.port)
    sock = ConsoleSocket(proc.port, headers={"Cookie": f"_streamlit_xsrf={first}"})
    page = sock.run()
    field, button = page.widget_id("text_input", "Password"), page.widget_id("button", "Sign in")
    sock.run(widgets=[text(field, PASSWORD), trigger(button)])
    assert "Overview" in sock.run().text
    # the network blips; the page polls the health endpoint, which sets the cookie again
    sock.close()
    r = httpx.get(
        f"http://127.0.0.1:{proc.port}/_stcore/health",
        headers={"Cookie": f"_streamlit_xsrf={first}"},
    )
    again = next(
        h.partition("=")[2].split(";", 1)[0]
        for h in r.headers.get_list("set-cookie")
        if h.startswith("_streamlit_xsrf=")
    )
    assert again != first
    with ConsoleSocket(
        proc.port, headers={"Cookie": f"_streamlit_xsrf={again}"}, resume=page.session_id
    ) as back:
        assert "Overview" in back.run().text


def _static_asset(port: int) -> str:
    """The path of one of Streamlit's own static files, as the page names it."""
    import re

    import httpx

    page = httpx.get(f"http://127.0.0.1:{port}/", timeout=30).text
    found = re.search(r'(?:src|href)="\.?/?(static/[^"]+)"', page)
    assert found, page[:500]
    return "/" + found.group(1)


def test_no_console_answer_can_be_framed_by_another_site(ctx, console):
    """Clickjacking: every answer of the real `sluice serve console` forbids frames, Streamlit's
    own routes included (before: none of them sent either header)."""
    import httpx

    proc = console(launcher="sluice")
    base = f"http://127.0.0.1:{proc.port}"
    paths = ["/", "/jobs", "/_stcore/health", "/_stcore/host-config", _static_asset(proc.port)]
    paths.append("/media/0123456789abcdef0123456789abcdef0123456789abcdef01234567.png")
    for path in paths:
        r = httpx.get(base + path, timeout=30)
        # SAMEORIGIN / 'self': another site cannot frame the console; its own page frames its
        # custom components (the live refresh), which DENY would leave blank
        assert r.headers.get("x-frame-options") == "SAMEORIGIN", (path, r.status_code)
        assert "frame-ancestors 'self'" in r.headers.get("content-security-policy", ""), path


def test_media_answers_only_at_the_consoles_own_names(ctx, console):
    """A rebinding page cannot fetch /media/... or any other route under its own Host name."""
    import httpx

    proc = console(launcher="sluice")
    base = f"http://127.0.0.1:{proc.port}"
    for path in ["/media/0123456789abcdef.png", "/_stcore/health", "/"]:
        r = httpx.get(base + path, headers={"Host": f"rebind.attacker.example:{proc.port}"})
        assert r.status_code == 403, (path, r.status_code)
        assert httpx.get(base + path).status_code != 403, path


def test_a_read_only_browser_cannot_guess_the_operator_password(ctx, console):
    """Finding 3: a browser that signed in read-only once was never held back (40 guesses, then the
    right operator password, went through) and its guesses locked new browsers out."""
    proc = console(
        launcher="sluice",
        SLUICE_CONSOLE_PASSWORD=PASSWORD,
        SLUICE_CONSOLE_READONLY_PASSWORD=READONLY,
        SLUICE_LOGIN_MAX_FAILURES="3",
        SLUICE_LOGIN_LOCKOUT_SECONDS="600",
        SLUICE_CONSOLE_TRUSTED_PROXIES="127.0.0.1",
        SLUICE_CONSOLE_HOSTS="console.example.com",
    )
    via = {
        "host": "console.example.com",
        "origin": "https://console.example.com",
        "host_port": False,
    }
    reader = {"Cookie": "_streamlit_xsrf=read-only-browser-77d1", "X-Forwarded-For": "198.51.100.9"}
    assert "Signed in as" in sign_in(proc.port, READONLY, headers=reader, **via)
    for i in range(32):  # more than the account's limit (10 x 3)
        sign_in(proc.port, f"operator-guess-{i}", headers=reader, **via)
    assert "Overview" not in sign_in(proc.port, PASSWORD, headers=reader, **via)
    assert "read-only" in sign_in(proc.port, READONLY, headers=reader, **via)  # still itself
    stranger = {"X-Forwarded-For": "192.0.2.99", "Cookie": "_streamlit_xsrf=new-browser-31"}
    assert "(operator)" in sign_in(proc.port, PASSWORD, headers=stranger, **via)


def test_a_leaked_session_id_neither_acts_nor_signs_the_operator_out(ctx, console):
    """Suspected in issue 26, confirmed: resuming a signed-in session by its leaked id reached the
    session's widgets (their callbacks run before the script checks anything) and the thief's run
    signed the real browser out. Now such a connection gets a session of its own."""
    proc = console(launcher="sluice", SLUICE_CONSOLE_PASSWORD=PASSWORD)
    operator = {"Cookie": "_streamlit_xsrf=operator-browser-cookie-5e0c"}
    sock = ConsoleSocket(proc.port, headers=operator)
    page = sock.run()
    field, button = page.widget_id("text_input", "Password"), page.widget_id("button", "Sign in")
    sock.run(widgets=[text(field, PASSWORD), trigger(button)])
    signed = sock.run()
    ids = signed.widget_id("text_input", "Name"), signed.widget_id("button", "Create")
    assert "Overview" in signed.text and all(ids)
    sock.close()
    leaked = page.session_id
    with ConsoleSocket(proc.port, resume=leaked, headers={"Cookie": "_streamlit_xsrf=thief"}) as t:
        seen = t.run(widgets=[text(ids[0], "stolen"), trigger(ids[1])])
    assert "Overview" not in seen.text and "stolen" not in datasets(ctx)
    with ConsoleSocket(proc.port, headers=operator, resume=leaked) as back:
        assert "Overview" in back.run().text  # still signed in
