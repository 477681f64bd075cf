"""Console access: who may open the console, and whether they may act.

Three ways in, decided by the settings:

- Without a password, a connection that comes straight from this machine (loopback peer, loopback
  Host, no forwarding header: see ``sluice.ops.gate``) is the local operator; every other
  connection must sign in, whatever address Streamlit was told to listen on.
- Passwords: ``SLUICE_CONSOLE_PASSWORD`` signs in an operator,
  ``SLUICE_CONSOLE_READONLY_PASSWORD`` a read-only operator who sees everything and can change
  nothing. Both are compared in constant time.
  Failures are counted per client address (forwarded addresses only from trusted proxies) and for
  the passwords as a whole (``LoginThrottle``); the counts live in this process, not in the browser
  session, so opening a new tab does not reset them.
- OIDC through Streamlit's ``st.login``, when ``.streamlit/secrets.toml`` has an ``[auth]`` section
  and Authlib is installed (``pip install 'streamlit[auth]'``). Signed-in people are read-only
  unless their e-mail address is listed in ``[sluice] operator_emails = [...]`` in the same file.

Every action function in ``sluice.ops.actions`` takes the ``Operator`` and refuses a read-only one,
so a disabled button is a convenience, not the protection.
"""

from __future__ import annotations

import hmac
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import SecretStr

from sluice.ops.access import Operator, Role
from sluice.settings import Settings

# --- passwords and lockout ------------------------------------------------------------------------

ACCOUNT_FACTOR = 10  # the console's passwords together take this many times one address's failures


class LoginThrottle:
    """Failed sign-ins, counted per client address and for the console's passwords as a whole.

    - Per address: at ``max_failures`` failures an address waits ``lockout_seconds`` per further
      try; the count is kept until an operator signs in from it, so each new failure after the
      lockout locks it again at once.
    - Per account (every password sign-in): ``ACCOUNT_FACTOR * max_failures`` failures within
      ``ACCOUNT_FACTOR * lockout_seconds`` hold back every browser that has not signed in before,
      so guessing from many addresses gains nothing.
    - Neither is a global denial: a browser that signed in as an operator before (known by its
      Streamlit XSRF cookie, which other sites cannot read) is never held back, so an attacker who
      shares an address with the operators, or floods the account, cannot lock them out.
    - A browser known only as read-only is held back for the other role: its failures count
      against it (and its address, and all read-only browsers together), not against the account
      that new browsers sign in to; a read-only sign-in clears none of them. While held back it
      may still sign in read-only (``attempt_login``), never as an operator.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._failures: dict[str, tuple[int, float]] = {}  # client -> (count, time of last failure)
        self._account: deque[float] = deque()  # times of recent failures, any client
        self._readers: deque[float] = deque()  # the same, of browsers known only as read-only
        self._known: dict[str, tuple[Role, float]] = {}  # browser -> (role, last sign-in)

    def role_of(self, device: str | None) -> Role | None:
        with self._lock:
            known = self._known.get(device) if device else None
            return known[0] if known else None

    def wait_seconds(
        self, client: str, *, max_failures: int, lockout_seconds: float, device: str | None = None
    ) -> float:
        with self._lock:
            return self._wait(client, self._clock(), max_failures, lockout_seconds, device)

    def reserve(
        self, client: str, *, max_failures: int, lockout_seconds: float, device: str | None = None
    ) -> tuple[float, int]:
        """(wait, failures): a client that may try now has the try counted as a failure at once.

        Checking and counting under one lock bounds parallel attempts: twenty sign-ins sent at once
        from one address get ``max_failures`` password checks, not twenty. A success clears it.
        """
        with self._lock:
            now = self._clock()
            wait = self._wait(client, now, max_failures, lockout_seconds, device)
            if wait > 0:
                return wait, max(self._count_of(client), self._count_of(f"browser:{device}"))
            return 0.0, self._count(client, now, device)

    def _count_of(self, key: str) -> int:
        return self._failures.get(key, (0, 0.0))[0]

    def _wait(
        self, client: str, now: float, max_failures: int, lockout_seconds: float, device: str | None
    ) -> float:
        role = self._known.get(device, (None, 0.0))[0] if device else None
        if role == "operator":
            return 0.0
        keys = [client, f"browser:{device}"] if role == "readonly" else [client]
        waits = []
        for key in keys:
            count, last = self._failures.get(key, (0, 0.0))
            if count >= max_failures:
                waits.append(last + lockout_seconds - now)
        window = ACCOUNT_FACTOR * lockout_seconds
        recent = self._readers if role == "readonly" else self._account
        for times in (self._account, self._readers):
            while times and times[0] < now - window:
                times.popleft()
        if len(recent) >= ACCOUNT_FACTOR * max_failures:
            waits.append(recent[0] + window - now)
        return max([0.0, *waits])

    def _count(self, client: str, now: float, device: str | None = None) -> int:
        role = self._known.get(device, (None, 0.0))[0] if device else None
        keys = [client, f"browser:{device}"] if role == "readonly" else [client]
        counts = []
        for key in keys:
            count, _ = self._failures.get(key, (0, 0.0))
            self._failures[key] = (count + 1, now)
            counts.append(count + 1)
        (self._readers if role == "readonly" else self._account).append(now)
        return max(counts)

    def failed(self, client: str, device: str | None = None) -> int:
        with self._lock:
            return self._count(client, self._clock(), device)

    def succeeded(self, client: str, device: str | None = None, role: Role = "operator") -> None:
        """An operator sign-in clears its address and browser; a read-only one clears nothing."""
        with self._lock:
            if role == "operator":
                self._failures.pop(client, None)
                self._failures.pop(f"browser:{device}", None)
            if device:
                known = self._known.get(device, (None, 0.0))[0]
                best: Role = "operator" if "operator" in (role, known) else role
                self._known[device] = (best, self._clock())

    def reset(self) -> None:
        with self._lock:
            self._failures.clear()
            self._account.clear()
            self._readers.clear()
            self._known.clear()


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


def attempt_login(
    settings: Settings,
    given: str,
    *,
    client: str,
    device: str | None = None,
    throttle: LoginThrottle = THROTTLE,
) -> LoginOutcome:
    wait, n = throttle.reserve(
        client,
        max_failures=settings.login_max_failures,
        lockout_seconds=settings.login_lockout_seconds,
        device=device,
    )
    if wait > 0:
        if throttle.role_of(device) == "readonly" and _matches(
            settings.console_readonly_password, given
        ):  # held back for the other role only: it may still sign in as what it is
            throttle.succeeded(client, device, "readonly")
            return LoginOutcome(Operator("readonly", "readonly"))
        return LoginOutcome(None, f"Too many failed sign-ins. Try again in {wait:.0f} s.")
    who = operator_for_password(settings, given)
    if who is None:
        left = settings.login_max_failures - n
        if left > 0:
            return LoginOutcome(None, f"Wrong password ({left} more tries before a lockout).")
        return LoginOutcome(
            None, f"Wrong password. Sign-in is locked for {settings.login_lockout_seconds:.0f} s."
        )
    throttle.succeeded(client, device, who.role)
    return LoginOutcome(who)


# --- OIDC -----------------------------------------------------------------------------------------


def oidc_role(email: str | None, operator_emails: list[str]) -> Role:
    allowed = {e.strip().lower() for e in operator_emails}
    return "operator" if email and email.strip().lower() in allowed else "readonly"
