"""The exception tree and ErrorKind: the ground floor, imported by every other module.

    SluiceError
     ├── SettingsError            the configuration is wrong; the message names the variable and
     │                            the fix
     ├── PipelineError            a job attempt failed; carries kind, code, message, fix hint
     │    ├── TransientError      timeouts, connection errors, lost workers: retried with backoff
     │    │    └── WaitingError   a dependency is down (or no worker can run it): waits, attempt
     │    │                       unspent
     │    ├── PermanentError      unreadable or corrupt input: failed at once, never retried
     │    └── UserActionError     the operator must act (password, OCR, type, size): failed at once
     ├── OperationError           an operation a front end asked for is refused: a stable code, the
     │    │                       HTTP status it answers, a fix hint (sluice.ops raises these)
     │    └── VectorStoreUnavailable   a search's read of Chroma failed on the way: 503
     ├── JobCancelled             the operator asked the running job to stop
     └── LeaseLost                another claim owns the job now; this attempt must stop quietly

``classify`` turns any other exception into a PipelineError.
"""

from __future__ import annotations

import socket
import sys
import traceback
from collections.abc import Mapping
from enum import Enum
from types import MappingProxyType
from typing import Any


class ErrorKind(str, Enum):
    """How a failed attempt is classified: whether Sluice retries, and who has to act."""

    transient = "transient"
    permanent = "permanent"
    user_action_required = "user_action_required"


class SluiceError(Exception):
    """Base of every error Sluice raises on purpose."""


class SettingsError(SluiceError, RuntimeError):
    """Raised with a message that names the variable that is wrong and how to fix it."""


class PipelineError(SluiceError):
    kind: ErrorKind = ErrorKind.permanent

    def __init__(self, code: str, message: str, hint: str = "", detail: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.hint = hint
        self.detail = detail

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code!r}, {self.message!r})"


class TransientError(PipelineError):
    kind = ErrorKind.transient


class WaitingError(TransientError):
    """Not the job's failure: something it needs is missing (a service is down, no worker of its
    pipeline version). The job waits for ``waiting_for`` without spending an attempt."""

    def __init__(
        self, code: str, message: str, hint: str = "", detail: str = "", *, waiting_for: str
    ) -> None:
        super().__init__(code, message, hint, detail)
        self.waiting_for = waiting_for


class PermanentError(PipelineError):
    kind = ErrorKind.permanent


class UserActionError(PipelineError):
    kind = ErrorKind.user_action_required


class OperationError(SluiceError):
    """An operation refused: ``code`` is stable (the API's problem code), ``status`` the HTTP status
    it answers, ``hint`` what to do. Subclasses set the three as class attributes."""

    code: str = "operation_refused"
    status: int = 400
    hint: str = ""
    members: Mapping[str, Any] = MappingProxyType({})  # more members of the problem body
    headers: Mapping[str, str] = MappingProxyType({})  # headers of the answer (Retry-After)

    def __init__(
        self, message: str = "", *, code: str | None = None, hint: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if hint is not None:
            self.hint = hint


class VectorStoreUnavailable(OperationError):
    """A read of the vector store failed on the way (a refused or dropped connection, a 502, 503 or
    504 of the gate in front of Chroma, no answer in time): the request is fine, and the same one
    succeeds once the store answers again."""

    code, status = "vector_store_unavailable", 503
    hint = (
        "Search again in a few seconds (the API says when, in Retry-After); if it keeps failing, "
        "check Chroma: the console's System page shows whether it answers."
    )
    headers = MappingProxyType({"Retry-After": "5"})


class JobCancelled(SluiceError):
    """Raised between batches when the job's cancel_requested flag is set."""


class LeaseLost(SluiceError):
    """Raised when a progress write finds the job claimed by someone else (e.g. the reaper)."""


RETRY_HINT = "Sluice retries this by itself; if it keeps failing, check the service named above."
AUTH_HINT = (
    "Check the secret the workers use for that service: SLUICE_CHROMA_TOKEN (and "
    "SLUICE_CHROMA_AUTH_HEADER), or the password in SLUICE_QUEUE_REDIS_URL, SLUICE_CACHE_REDIS_URL "
    "or SLUICE_DATABASE_URL; restart the workers. Sluice retries the job by itself."
)


# The clients' errors that mean "the service did not answer", by the module that defines them. They
# are looked up only in modules already imported: an exception of a client's class means its module
# is loaded, so classifying needs no import (a cold `sluice search` never loads redis for this).
_CLIENT_TRANSIENT = (
    ("redis.exceptions", ("ConnectionError", "TimeoutError", "BusyLoadingError")),
    ("httpx", ("TransportError",)),
    ("sqlalchemy.exc", ("OperationalError", "DisconnectionError")),
)


def _transient_types() -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = [TimeoutError, ConnectionError, socket.timeout]
    for module_name, names in _CLIENT_TRANSIENT:
        module = sys.modules.get(module_name)
        if module is not None:
            types += [getattr(module, n) for n in names if hasattr(module, n)]
    return tuple(types)


def classify(exc: BaseException) -> PipelineError:
    """Map any exception to a classified PipelineError (PipelineErrors pass through)."""
    if isinstance(exc, PipelineError):
        if not exc.detail:
            exc.detail = "".join(traceback.format_exception(exc))[-4000:]
        return exc
    detail = "".join(traceback.format_exception(exc))[-4000:]
    if _looks_like_auth_error(exc):
        # A configuration problem, not the document's: every job meets it until the secret is fixed.
        # Retried like an outage, so jobs go through by themselves once the workers have it right.
        return TransientError(
            "auth_failed",
            f"a service refused Sluice's credentials: {type(exc).__name__}: {str(exc)[:200]}",
            AUTH_HINT,
            detail,
        )
    if isinstance(exc, _transient_types()) or _looks_like_connection_error(exc):
        return TransientError(
            "service_unavailable",
            f"a service did not answer: {type(exc).__name__}: {str(exc)[:200]}",
            RETRY_HINT,
            detail,
        )
    # Unknown errors may be passing (resource pressure, a race); retrying them is bounded by
    # max_attempts, and the traceback is kept for the operator.
    return TransientError(
        "internal_error",
        f"unexpected error: {type(exc).__name__}: {str(exc)[:200]}",
        "Sluice retries this a few times; if it keeps failing, the detail shows the traceback.",
        detail,
    )


# A service that refused or dropped the connection: proof it was down (or restarting) at that
# moment. chromadb's HttpClient wraps transport failures in plain exceptions with these words.
_REFUSED_WORDS = (
    "connection refused",
    "could not connect",
    "connecterror",
    "connection reset",
    "server disconnected",
    "remoteprotocolerror",
    "connection aborted",
    "broken pipe",
)
# No answer in time: the service may be down, or only slow.
_TIMEOUT_WORDS = ("timed out", "timeout")


def refused_connection(exc: BaseException) -> bool:
    """Did a service refuse or drop this connection (not merely answer late)?"""
    text = f"{type(exc).__name__} {exc}".lower()
    return any(w in text for w in _REFUSED_WORDS)


def _looks_like_connection_error(exc: BaseException) -> bool:
    text = f"{type(exc).__name__} {exc}".lower()
    return refused_connection(exc) or any(w in text for w in _TIMEOUT_WORDS)


_AUTH_WORDS = (
    "unauthorized",
    "forbidden",
    "invalid username-password",
    "wrongpass",
    "noauth",
    "authentication required",
    "password authentication failed",
    "refused the credentials",
)


def _looks_like_auth_error(exc: BaseException) -> bool:
    """Redis AuthenticationError, Chroma's 401/403 (raised as a plain ValueError by chromadb),
    PostgreSQL's "password authentication failed"."""
    if type(exc).__name__ in ("AuthenticationError", "AuthorizationError", "ChromaAuthError"):
        return True
    text = str(exc).lower()
    return any(w in text for w in _AUTH_WORDS)


def is_auth_error(text: str) -> bool:
    """For errors kept only as text (an outbox row's last_error)."""
    text = text.lower()
    return "authenticationerror" in text or any(w in text for w in _AUTH_WORDS)
