"""The sign-in page and the sidebar identity, on top of sluice.console.auth (see there for the rules)."""

from __future__ import annotations

import streamlit as st

from sluice.console import auth
from sluice.console.ui import OPERATOR_KEY
from sluice.ops.access import LOCAL_OPERATOR, Operator
from sluice.storage.settings import Settings


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
    email = st.user.get("email")
    try:
        allowed = list(st.secrets.get("sluice", {}).get("operator_emails", []))
    except Exception:
        allowed = []
    return Operator(str(email or st.user.get("name") or "oidc user"), auth.oidc_role(email, allowed))


def _client() -> str:
    """The key failed sign-ins are counted under: the client address, or one shared key without it."""
    try:
        ip = st.context.ip_address
    except Exception:
        ip = None
    return ip if isinstance(ip, str) and ip else "unknown"


def signed_in(settings: Settings) -> Operator | None:
    """The operator of this session, or None while nobody has signed in."""
    if not settings.login_required:
        st.session_state[OPERATOR_KEY] = LOCAL_OPERATOR
        return LOCAL_OPERATOR
    who = st.session_state.get(OPERATOR_KEY) or _oidc_operator()
    if who is not None and who != LOCAL_OPERATOR:
        st.session_state[OPERATOR_KEY] = who
        return who
    st.session_state.pop(OPERATOR_KEY, None)
    return None


def sign_in_page(settings: Settings) -> None:
    """The sign-in form, then a stop: nothing of the console runs before someone signs in."""
    with st.columns([2, 3])[0]:
        _sign_in_page(settings)
    st.stop()


def _sign_in_page(settings: Settings) -> None:
    st.title("Sluice")
    st.subheader("Sign in to the operator console")
    if settings.console_password is not None:
        with st.form("login", clear_on_submit=True):
            password = st.text_input("Password", type="password", key="login_password")
            submitted = st.form_submit_button("Sign in", type="primary")
        if submitted:
            outcome = auth.attempt_login(settings, password or "", client=_client())
            if outcome.operator is not None:
                st.session_state[OPERATOR_KEY] = outcome.operator
                st.rerun()
            st.error(outcome.message)
        else:
            wait = auth.THROTTLE.wait_seconds(_client(), max_failures=settings.login_max_failures,
                                              lockout_seconds=settings.login_lockout_seconds)
            if wait > 0:
                st.warning(f"Too many failed sign-ins. Try again in {wait:.0f} s.")
    if oidc_configured():
        st.button("Sign in with single sign-on", on_click=st.login)
    st.caption("The operator password is SLUICE_CONSOLE_PASSWORD; SLUICE_CONSOLE_READONLY_PASSWORD signs "
               "in read-only.")


def sidebar_identity(who: Operator, settings: Settings) -> None:
    if not settings.login_required:
        st.sidebar.caption("Local console (loopback, no sign-in).")
        return
    role = "operator" if who.can_act else "read-only"
    st.sidebar.caption(f"Signed in as **{who.name}** ({role}).")

    def sign_out() -> None:
        st.session_state.pop(OPERATOR_KEY, None)
        if oidc_configured() and st.user.is_logged_in:
            st.logout()

    st.sidebar.button("Sign out", on_click=sign_out, key="sign_out")
