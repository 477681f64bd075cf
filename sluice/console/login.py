"""Admission, the sign-in page and the sidebar identity, on top of sluice.console.auth and
sluice.ops.gate (see there for the rules). Decided per connection, on every run of the script."""

from __future__ import annotations

import hashlib
import threading
from dataclasses import replace
from typing import TYPE_CHECKING, NoReturn, cast

import streamlit as st

from sluice.console import auth, ui
from sluice.console.ui import OPERATOR_KEY
from sluice.ops import audit_trail, gate
from sluice.ops.access import LOCAL_OPERATOR, Operator
from sluice.settings import Settings

if TYPE_CHECKING:
    from streamlit.runtime.memory_uploaded_file_manager import MemoryUploadedFileManager

BINDING_KEY = "sluice_signed_in_browser"
XSRF_COOKIE = "_streamlit_xsrf"  # set by Streamlit per browser; pages of other sites cannot read it


def connection() -> gate.Connection:
    """This session's connection: the raw peer address and the headers of its websocket request."""
    remote = None
    try:
        from streamlit.runtime.context import _get_client_context

        client = _get_client_context()
        remote = getattr(client, "remote_ip", None) if client is not None else None
    except Exception:  # another Streamlit version: without the peer, nothing counts as loopback
        remote = None
    remote = remote if isinstance(remote, str) else None
    headers: dict[str, str] = {}
    try:
        for key in st.context.headers.keys():
            headers[key.lower()] = ", ".join(st.context.headers.get_all(key))
    except Exception:
        headers = {}
    # AppTest runs the script in this process with neither a peer nor a request; a real connection
    # always has request headers (a Host at least), so it is never taken for in-process.
    return gate.connection(remote, headers, in_process=remote is None and not headers)


def admit(settings: Settings) -> gate.Connection:
    """The connection, or a stop: nothing runs for a Host or Origin the console is not served at."""
    conn = connection()
    refusal = gate.host_refusal(settings, conn)
    if refusal is not None:
        st.title("Sluice")
        st.text(f"Refused: {refusal}")
        st.stop()
    return conn


def _browser(conn: gate.Connection) -> str | None:
    """A stable, secret id of the browser (a hash of its Streamlit XSRF cookie), if it sent one."""
    if conn.in_process:
        return "in-process"
    try:
        cookie = st.context.cookies.get(XSRF_COOKIE)
    except Exception:
        cookie = None
    return hashlib.sha256(_xsrf_token(cookie).encode("utf-8")).hexdigest()[:32] if cookie else None


def _xsrf_token(cookie: str) -> str:
    """The token inside the cookie: Streamlit re-masks it on every response, the token stays."""
    value = cookie.strip("\"'")
    if value.startswith("2|"):
        try:
            _, mask_hex, masked_hex, _ = value.split("|")
            mask, masked = bytes.fromhex(mask_hex), bytes.fromhex(masked_hex)
        except ValueError:
            return value
        if mask:
            return bytes(b ^ mask[i % len(mask)] for i, b in enumerate(masked)).hex()
    return value


def _binding(conn: gate.Connection, settings: Settings) -> str:
    """What a signed-in session is tied to: its browser, or its client address without a cookie.

    A Streamlit session id travels in URLs and logs; a session resumed with it from elsewhere
    comes without this browser's cookie, so it is not signed in.
    """
    return _browser(conn) or f"address:{gate.client_address(settings, conn)}"


def oidc_configured() -> bool:
    """``st.login`` works only with an ``[auth]`` section in secrets.toml and Authlib installed."""
    try:
        import authlib  # noqa: F401
    except ImportError:
        return False
    try:
        return "auth" in st.secrets
    except Exception:  # no secrets file at all
        return False


def _oidc_operator() -> Operator | None:
    if not oidc_configured() or not st.user.is_logged_in:
        return None
    claim = st.user.get("email")
    email = claim if isinstance(claim, str) else None
    try:
        allowed = list(st.secrets.get("sluice", {}).get("operator_emails", []))
    except Exception:
        allowed = []
    return Operator(
        str(email or st.user.get("name") or "oidc user"), auth.oidc_role(email, allowed)
    )


def signed_in(settings: Settings, conn: gate.Connection) -> Operator | None:
    """The operator of this session, or None while nobody has signed in on this connection."""
    who = _signed_in(settings, conn)
    _allow_uploads(who is not None and who.can_act)
    if who is not None and not conn.in_process:
        _remember_browser(_browser(conn))
    return who


# --- resuming a session ---------------------------------------------------------------------------
# A Streamlit session id travels in upload URLs and logs. Whoever resumes a signed-in session with
# it would get its widgets, and their callbacks run before any check of the script. The launcher's
# guard (sluice.console.launcher) therefore lets a websocket resume a signed-in session only from
# the browser it was signed in on (the same XSRF token inside the cookie); any other connection gets
# a new session of its own.

_SESSION_BROWSERS: dict[str, str | None] = {}  # signed-in session id -> its browser (cookie hash)
_sessions_lock = threading.Lock()


def _remember_browser(browser: str | None) -> None:
    from streamlit.runtime.scriptrunner_utils.script_run_context import get_script_run_ctx

    run = get_script_run_ctx()
    if run is not None:
        with _sessions_lock:
            _SESSION_BROWSERS[run.session_id] = browser


def may_resume(session_id: str, cookie: str | None) -> bool:
    """Whether a connection with this XSRF cookie may resume ``session_id``."""
    with _sessions_lock:
        if session_id not in _SESSION_BROWSERS:
            return True  # never signed in: nothing to take over
        bound = _SESSION_BROWSERS[session_id]
    browser = hashlib.sha256(_xsrf_token(cookie).encode()).hexdigest()[:32] if cookie else None
    return bound is not None and browser == bound


LINK_KEY = "sluice_local_link_browser"
_LINKED: set[str] = set()  # browsers (their cookie's hash) that opened a local link, this process
_linked_lock = threading.Lock()


def _local_link_ok(settings: Settings, conn: gate.Connection) -> bool:
    """Without a password: has this browser opened a link `sluice serve console` printed?"""
    if not gate.local_link_required(settings, conn):
        return True
    binding, browser = _binding(conn, settings), _browser(conn)
    if st.session_state.get(LINK_KEY) == binding:
        return True
    with _linked_lock:
        if browser is not None and browser in _LINKED:
            st.session_state[LINK_KEY] = binding
            return True
    token = st.query_params.get(gate.TOKEN_PARAM)
    if token is None:
        return False
    del st.query_params[gate.TOKEN_PARAM]  # out of the address bar, the history and any link
    if not gate.redeem_local_link(settings, token):
        return False
    st.session_state[LINK_KEY] = binding
    if browser is not None:
        with _linked_lock:
            _LINKED.add(browser)
    return True


def _signed_in(settings: Settings, conn: gate.Connection) -> Operator | None:
    if not gate.sign_in_required(settings, conn):
        if not _local_link_ok(settings, conn):
            st.session_state.pop(OPERATOR_KEY, None)
            return None
        st.session_state[OPERATOR_KEY] = LOCAL_OPERATOR
        st.session_state.pop(BINDING_KEY, None)
        return LOCAL_OPERATOR
    binding = _binding(conn, settings)
    who = st.session_state.get(OPERATOR_KEY)
    if who is not None and who != LOCAL_OPERATOR and st.session_state.get(BINDING_KEY) == binding:
        return who
    who = _oidc_operator()
    if who is not None:
        st.session_state[OPERATOR_KEY] = who
        st.session_state[BINDING_KEY] = binding
        return who
    if st.session_state.get(BINDING_KEY) is None:  # nobody signed in on this session
        st.session_state.pop(OPERATOR_KEY, None)
    # A sign-in tied to another browser stays as it is: a run from a leaked session id is not
    # signed in, and does not sign the real browser out either.
    return None


# --- uploads only for operators -------------------------------------------------------------------
# Streamlit keeps any file PUT to /_stcore/upload_file/<session>/... in memory for any live session,
# signed in or not. The guard wraps the process's upload manager once: a session takes files only
# while an operator is signed in on it (the script's last run said so).

_UPLOADERS: set[str] = set()
_uploaders_lock = threading.Lock()


def _allow_uploads(allowed: bool) -> None:
    from streamlit.runtime.scriptrunner_utils.script_run_context import get_script_run_ctx

    run = get_script_run_ctx()
    if run is None:
        return
    _install_upload_guard()
    with _uploaders_lock:
        (_UPLOADERS.add if allowed else _UPLOADERS.discard)(run.session_id)


def _install_upload_guard() -> None:
    try:
        from streamlit import runtime

        manager = runtime.get_instance().uploaded_file_mgr
    except Exception:  # no server runtime (AppTest): nothing receives uploads
        return
    with _uploaders_lock:
        if type(manager).__name__ != "MemoryUploadedFileManager" or getattr(
            manager, "_sluice_guarded", False
        ):
            return
        memory = cast("MemoryUploadedFileManager", manager)  # by its class's name, above
        original = memory.add_file

        def add_file(session_id: str, file) -> None:
            with _uploaders_lock:
                allowed = session_id in _UPLOADERS
            if not allowed:
                from starlette.exceptions import HTTPException

                raise HTTPException(
                    status_code=403, detail="sign in as an operator before uploading"
                )
            original(session_id=session_id, file=file)

        # Patched on this instance (the class's method stays): the type calls it a method.
        setattr(manager, "add_file", add_file)  # noqa: B010
        setattr(manager, "_sluice_guarded", True)  # noqa: B010


def sign_in_page(settings: Settings, conn: gate.Connection) -> NoReturn:
    """The sign-in form, then a stop: nothing of the console runs before someone signs in."""
    with st.columns([2, 3])[0]:
        _sign_in_page(settings, conn)
    st.stop()


def _sign_in_page(settings: Settings, conn: gate.Connection) -> None:
    st.title("Sluice")
    st.subheader("Sign in to the operator console")
    client, browser = gate.client_address(settings, conn), _browser(conn)
    if not gate.sign_in_required(settings, conn):
        st.info(
            "Open the console with the link that `sluice serve console` printed, or get a new one "
            "with `sluice console-url` (each link works once, within 15 minutes). Other users of "
            "this machine can reach this port too, so being on this machine is not enough; or "
            "set SLUICE_CONSOLE_PASSWORD."
        )
        return
    if settings.console_password is not None:
        with st.form("login", clear_on_submit=True):
            password = st.text_input("Password", type="password", key="login_password")
            submitted = st.form_submit_button("Sign in", type="primary")
        if submitted:
            outcome = auth.attempt_login(settings, password or "", client=client, device=browser)
            if outcome.operator is not None:
                st.session_state[OPERATOR_KEY] = replace(outcome.operator, address=client)
                st.session_state[BINDING_KEY] = _binding(conn, settings)
                st.rerun()
            audit_trail.refused(  # never the password given: only that it was wrong
                Operator("unknown", "readonly", address=client),
                "login.failed",
                outcome.message,
                target_kind="console",
                code="bad_password",
            )
            st.error(outcome.message)
        else:
            wait = auth.THROTTLE.wait_seconds(
                client,
                max_failures=settings.login_max_failures,
                lockout_seconds=settings.login_lockout_seconds,
                device=browser,
            )
            if wait > 0:
                st.warning(f"Too many failed sign-ins. Try again in {wait:.0f} s.")
    elif not oidc_configured():
        st.warning(
            "This connection does not come straight from this machine (another address, or a "
            "proxy in between), so the console needs a sign-in, and none is set up. Set "
            "SLUICE_CONSOLE_PASSWORD, or SLUICE_CONSOLE_SIGN_IN=off behind a proxy that signs "
            "people in."
        )
    if oidc_configured():
        st.button("Sign in with single sign-on", on_click=st.login)
    st.caption(
        "The operator password is SLUICE_CONSOLE_PASSWORD; SLUICE_CONSOLE_READONLY_PASSWORD signs "
        "in read-only."
    )


def sidebar_identity(who: Operator, settings: Settings) -> None:
    if who == LOCAL_OPERATOR:
        st.sidebar.caption(
            "Sign-in is off (SLUICE_CONSOLE_SIGN_IN=off)."
            if settings.console_sign_in == "off"
            else "Local console (straight from this machine, no sign-in)."
        )
        return
    role = "operator" if who.can_act else "read-only"
    st.sidebar.caption(f"Signed in as **{ui.plain(who.name)}** ({role}).")

    def sign_out() -> None:
        st.session_state.pop(OPERATOR_KEY, None)
        st.session_state.pop(BINDING_KEY, None)
        if oidc_configured() and st.user.is_logged_in:
            st.logout()

    st.sidebar.button("Sign out", on_click=sign_out, key="sign_out")
