"""Console access: who may open the console, and whether they may act.

Three ways in, decided by the settings:

- Loopback without a password (``SLUICE_CONSOLE_ADDRESS=127.0.0.1``, no ``SLUICE_CONSOLE_PASSWORD``):
  whoever reaches the port is the local operator. ``check_bind`` refuses any other address without a
  password, so this is only ever a single-machine setup.
- Passwords: ``SLUICE_CONSOLE_PASSWORD`` signs in an operator, ``SLUICE_CONSOLE_READONLY_PASSWORD`` a
  read-only operator who sees everything and can change nothing. Both are compared in constant time.
  After ``SLUICE_LOGIN_MAX_FAILURES`` failures from one client address, that address is locked out
  for ``SLUICE_LOGIN_LOCKOUT_SECONDS``; the count lives in this process, not in the browser session,
  so opening a new tab does not reset it.
- OIDC through Streamlit's ``st.login``, when ``.streamlit/secrets.toml`` has an ``[auth]`` section
  and Authlib is installed (``pip install 'streamlit[auth]'``). Signed-in people are read-only
  unless their e-mail address is listed in ``[sluice] operator_emails = [...]`` in the same file.

Every action function in ``sluice.ops.actions`` takes the ``Operator`` and refuses a read-only one, so
a disabled button is a convenience, not the protection.
"""

from __future__ import annotations

import hmac
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import SecretStr

from sluice.ops.access import Operator, Role
from sluice.storage.settings import Settings

# --- passwords and lockout --------------------------------------------------------------------------


class LoginThrottle:
    """Failed sign-ins per client; a client at the limit waits ``lockout_seconds`` per further try.

    The count is kept until a successful sign-in, so after the lockout ends each new failure locks
    the client out again at once.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._failures: dict[str, tuple[int, float]] = {}  # client -> (count, time of last failure)

    def wait_seconds(self, client: str, *, max_failures: int, lockout_seconds: float) -> float:
        with self._lock:
            count, last = self._failures.get(client, (0, 0.0))
        if count < max_failures:
            return 0.0
        return max(0.0, last + lockout_seconds - self._clock())

    def failed(self, client: str) -> int:
        with self._lock:
            count, _ = self._failures.get(client, (0, 0.0))
            self._failures[client] = (count + 1, self._clock())
            return count + 1

    def succeeded(self, client: str) -> None:
        with self._lock:
            self._failures.pop(client, None)

    def reset(self) -> None:
        with self._lock:
            self._failures.clear()


THROTTLE = LoginThrottle()


def _matches(secret: SecretStr | None, given: str) -> bool:
    expected = secret.get_secret_value() if secret is not None else ""
    # Compare even when no secret is set, so both checks always take the same time.
    same = hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))
    return secret is not None and same


def operator_for_password(settings: Settings, given: str) -> Operator | None:
    full = _matches(settings.console_password, given)
    readonly = _matches(settings.console_readonly_password, given)
    if full:
        return Operator("operator", "operator")
    if readonly:
        return Operator("readonly", "readonly")
    return None


@dataclass(frozen=True)
class LoginOutcome:
    operator: Operator | None
    message: str = ""


def attempt_login(settings: Settings, given: str, *, client: str,
                  throttle: LoginThrottle = THROTTLE) -> LoginOutcome:
    wait = throttle.wait_seconds(client, max_failures=settings.login_max_failures,
                                 lockout_seconds=settings.login_lockout_seconds)
    if wait > 0:
        return LoginOutcome(None, f"Too many failed sign-ins. Try again in {wait:.0f} s.")
    who = operator_for_password(settings, given)
    if who is None:
        n = throttle.failed(client)
        left = settings.login_max_failures - n
        if left > 0:
            return LoginOutcome(None, f"Wrong password ({left} more tries before a lockout).")
        return LoginOutcome(None, f"Wrong password. Sign-in is locked for "
                                  f"{settings.login_lockout_seconds:.0f} s.")
    throttle.succeeded(client)
    return LoginOutcome(who)


# --- OIDC ---------------------------------------------------------------------------------------------


def oidc_role(email: str | None, operator_emails: list[str]) -> Role:
    allowed = {e.strip().lower() for e in operator_emails}
    return "operator" if email and email.strip().lower() in allowed else "readonly"
