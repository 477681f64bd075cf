"""Who a request's bearer token is: the live key it names, and the audit row of a refused one."""

from __future__ import annotations

import hmac

from sqlmodel import Session

from sluice.ops import audit_trail
from sluice.ops.access import Operator
from sluice.ops.keys import DUMMY_HASH, SCOPES, TOKEN, ApiPrincipal, hash_token
from sluice.ops.reads import ctx
from sluice.storage import api_keys
from sluice.storage.models import utcnow


def record_refusal(token: str, address: str) -> None:
    """A request whose token is no live key, in the audit log: the key it names by its public
    lookup id (never the secret), and why it was refused."""
    match = TOKEN.match(token)
    lookup = match.group(1) if match else ""
    with Session(ctx().engine) as session:
        row = api_keys.key_by_lookup(session=session, lookup=lookup) if lookup else None
        name = row.name if row is not None else "unknown"
        why = (
            "malformed token"
            if not match
            else "unknown key"
            if row is None
            else "revoked key"
            if row.revoked_at is not None
            else "wrong secret"
        )
    who = Operator(name, "readonly", channel="api", address=address, key=lookup)
    audit_trail.refused_once_per(
        audit_trail.FLOOD_SPAN,
        who,
        "auth.refused",
        why,
        target_kind="key",
        target_id=name,
        code="unauthorized",
    )


def authenticate(token: str | None) -> ApiPrincipal | None:
    """The live key this token is, or None (no token, a malformed or unknown one, a revoked key)."""
    match = TOKEN.match(token or "")
    with Session(ctx().engine) as session:
        row = api_keys.key_by_lookup(session=session, lookup=match.group(1)) if match else None
        expected = row.secret_hash if row is not None else DUMMY_HASH
        same = hmac.compare_digest(hash_token(token or ""), expected)
        if row is None or not same or row.revoked_at is not None or row.id is None:
            return None
        api_keys.touch(session=session, key=row, now=utcnow())
        return ApiPrincipal(
            id=row.id,
            name=row.name,
            scope=row.scope if row.scope in SCOPES else "read",
            all_datasets=row.all_datasets,
            dataset_ids=frozenset(row.dataset_ids or []),
            lookup=row.lookup,
        )
