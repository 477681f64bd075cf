"""``Idempotency-Key`` on the API's POSTs, the way the IETF draft and Stripe apply it: the same key
with the same request replays the first answer; with another request it is refused (422); while the
first is still being answered, a second is told so (409). Keys are kept 24 hours
(sluice.storage.idempotency_records), per API key: two keys never see each other's.

The fingerprint of a request is made from what it means (the file names and the sha256 of their
bytes, or the JSON body), not from its raw bytes: a multipart body carries a random boundary, so
the same upload sent twice never has the same bytes. A password (an unlock) is never part of it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlmodel import Session

from sluice.errors import OperationError
from sluice.ops.keys import ApiPrincipal
from sluice.ops.reads import ctx
from sluice.storage import idempotency_records
from sluice.storage.idempotency_records import Claim

KEY_PATTERN = re.compile(r"^[\x21-\x7e]{1,255}$")  # visible ASCII, as a header value carries it


class BadIdempotencyKey(OperationError):
    """The header is empty, too long or not printable ASCII."""

    code, status = "bad_idempotency_key", 422
    hint = "Send a new key of 1 to 255 visible ASCII characters, e.g. a UUID."


class KeyReused(OperationError):
    """The key was used for another request (another path or body)."""

    code, status = "idempotency_key_reused", 422
    hint = "Use a new Idempotency-Key for a new request."


class StillInFlight(OperationError):
    """The first request with this key has not been answered yet; ask again after Retry-After."""

    code, status = "idempotency_in_flight", 409
    hint = "Send the same request again after Retry-After: it replays the first answer."
    headers = {"Retry-After": "1"}


@dataclass(frozen=True)
class Replay:
    status_code: int
    headers: dict[str, Any]
    body: str


def fingerprint(method: str, path: str, parts: Iterable[Any]) -> str:
    """What a request means, hashed: its method, path and the meaningful parts of its body."""
    digest = hashlib.sha256(f"{method.upper()} {path}".encode())
    for part in parts:
        raw = part if isinstance(part, bytes) else json.dumps(part, sort_keys=True, default=str)
        chunk = raw if isinstance(raw, bytes) else raw.encode()
        digest.update(len(chunk).to_bytes(8, "big") + chunk)
    return digest.hexdigest()


def begin(key: ApiPrincipal, idempotency_key: str, fingerprint_: str) -> Claim | Replay:
    """The first request: its claim (``finish`` or ``abandon`` it); a replay: the first answer."""
    if not KEY_PATTERN.match(idempotency_key):
        raise BadIdempotencyKey("Idempotency-Key: 1 to 255 visible ASCII characters")
    with Session(ctx().engine) as session:
        claim = idempotency_records.claim(
            session=session,
            key_id=key.id,
            idempotency_key=idempotency_key,
            fingerprint=fingerprint_,
        )
    if claim.verdict == "other_request":
        raise KeyReused(
            f"Idempotency-Key {idempotency_key!r} was used for another request in the last 24 "
            "hours; use a new key for a new request"
        )
    if claim.verdict == "in_flight":
        raise StillInFlight(
            f"the first request with Idempotency-Key {idempotency_key!r} is still being answered; "
            "try again in a moment"
        )
    if claim.verdict == "replay":
        return Replay(claim.status_code or 200, dict(claim.headers or {}), claim.body or "")
    return claim


def finish(claim: Claim, *, status_code: int, headers: dict[str, str], body: str) -> None:
    with Session(ctx().engine) as session:
        idempotency_records.complete(
            session=session,
            record_id=claim.record_id,
            status_code=status_code,
            headers=headers,
            body=body,
        )


def abandon(claim: Claim) -> None:
    with Session(ctx().engine) as session:
        idempotency_records.release(session=session, record_id=claim.record_id)
