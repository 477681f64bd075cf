"""API keys: made here (the secret shown once), checked here (in constant time), and the rule of
what a key may do: its scope (read < ingest < manage) and its reach (some datasets, or all of them).

A token is ``sluice_<lookup>_<secret>``: the lookup id finds the row, the whole token's sha256 is
compared with the stored one by ``hmac.compare_digest``. A secret has 256 random bits, so a plain
hash is enough (no password stretching); the token is never stored, logged or put in an event.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from sqlmodel import Session

from sluice.errors import OperationError
from sluice.ops import audit_trail
from sluice.ops.access import Operator, ReadOnlyOperator, require_operator
from sluice.ops.reads import ctx
from sluice.storage import api_keys, queries
from sluice.storage.clock import as_utc
from sluice.storage.models import ApiKey

LAST_USED_EVERY = api_keys.TOUCH_EVERY  # a key's last use is written at most this often

Scope = Literal["read", "ingest", "manage"]
SCOPES: tuple[Scope, ...] = ("read", "ingest", "manage")
KEY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
TOKEN = re.compile(r"^sluice_([0-9a-f]{12})_([A-Za-z0-9_-]{20,100})$")
DUMMY_HASH = hashlib.sha256(b"no such key").hexdigest()


class KeyRefused(OperationError):
    """A key cannot be made or revoked as asked; the message says why and what to write."""

    code, status = "key_refused", 422
    hint = "See `sluice keys --help` for the names, scopes and datasets a key takes."


@dataclass(frozen=True)
class ApiPrincipal:
    """The key a request came with, as the rules see it."""

    id: int
    name: str
    scope: Scope
    all_datasets: bool
    dataset_ids: frozenset[int]
    lookup: str = ""  # the token's public part (never its secret)
    address: str = ""  # the request's client address

    def reaches(self, dataset_id: int | None) -> bool:
        return dataset_id is not None and (self.all_datasets or dataset_id in self.dataset_ids)

    def allows(self, scope: Scope) -> bool:
        return SCOPES.index(self.scope) >= SCOPES.index(scope)

    @property
    def reach(self) -> list[int] | None:
        """The dataset ids a query is limited to (None: every dataset)."""
        return None if self.all_datasets else sorted(self.dataset_ids)

    @property
    def operator(self) -> Operator:
        """The key as the actor of what it causes: ``api:<name>`` in every event."""
        return Operator(self.name, "operator", channel="api", address=self.address, key=self.lookup)


@dataclass(frozen=True)
class KeyView:
    """A key as ``sluice keys list`` and the console show it (never its secret)."""

    name: str
    scope: str
    datasets: list[str]  # ["*"] for every dataset
    created_at: str
    created_by: str
    last_used_at: str | None
    revoked_at: str | None

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _iso(value: datetime | None) -> str | None:
    return as_utc(value).isoformat(timespec="seconds") if value is not None else None


def _view(row: ApiKey, names: dict[int, str]) -> KeyView:
    return KeyView(
        name=row.name,
        scope=row.scope,
        datasets=["*"] if row.all_datasets else [names.get(i, f"#{i}") for i in row.dataset_ids],
        created_at=_iso(row.created_at) or "",
        created_by=row.created_by,
        last_used_at=_iso(row.last_used_at),
        revoked_at=_iso(row.revoked_at),
    )


def create_key(
    who: Operator, name: str, *, datasets: list[str] | None, scope: str
) -> tuple[KeyView, str]:
    """Make a key; returns it and its token (shown once: only its hash is kept).
    ``datasets`` None: every dataset."""
    params = {"name": name, "scope": scope, "datasets": datasets or ["*"]}
    try:
        require_operator(who, "create API keys")
    except ReadOnlyOperator as exc:
        audit_trail.refused(who, "key.create", str(exc), target_kind="key", target_id=name)
        raise KeyRefused(str(exc)) from None
    with audit_trail.recording(
        who, "key.create", target_kind="key", target_id=name, params=params, model=ApiKey
    ) as rec:
        try:
            return _create_key(who, name, datasets=datasets, scope=scope)
        except KeyRefused as exc:
            rec.settle(False, str(exc))
            raise


def _create_key(
    who: Operator, name: str, *, datasets: list[str] | None, scope: str
) -> tuple[KeyView, str]:
    if not KEY_NAME.match(name or ""):
        raise KeyRefused(
            "A key name is 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or "
            "digit."
        )
    if scope not in SCOPES:
        raise KeyRefused(f"scope {scope!r}: one of {', '.join(SCOPES)}")
    if datasets is not None and not datasets:
        raise KeyRefused("name at least one dataset, or give the key every dataset")
    with Session(ctx().engine) as session:
        by_name = {d.name: d.id for d in queries.datasets(session=session)}
        unknown = [d for d in datasets or [] if d not in by_name]
        if unknown:
            raise KeyRefused(f"no dataset named {unknown[0]!r} (see `sluice datasets`)")
        lookup = secrets.token_hex(6)
        token = f"sluice_{lookup}_{secrets.token_urlsafe(32)}"
        try:
            row = api_keys.add_key(
                session=session,
                name=name,
                lookup=lookup,
                secret_hash=hash_token(token),
                scope=scope,
                dataset_ids=[by_name[d] for d in datasets or []],
                all_datasets=datasets is None,
                created_by=who.actor,
            )
        except api_keys.DuplicateKeyName as exc:
            raise KeyRefused(f"{exc}; revoke it or choose another name") from None
        return _view(row, {v: k for k, v in by_name.items()}), token


def list_keys() -> list[KeyView]:
    with Session(ctx().engine) as session:
        names = queries.dataset_names(session=session)
        return [_view(row, names) for row in api_keys.list_keys(session=session)]


def revoke_key(who: Operator, name: str) -> tuple[bool, str]:
    try:
        require_operator(who, "revoke API keys")
    except ReadOnlyOperator as exc:
        audit_trail.refused(who, "key.revoke", str(exc), target_kind="key", target_id=name)
        return False, str(exc)
    with (
        audit_trail.recording(  # revoke commits only when it revokes
            who, "key.revoke", target_kind="key", target_id=name, check=lambda s: True
        ) as rec,
        Session(ctx().engine) as session,
    ):
        row = api_keys.revoke(session=session, name=name, actor=who.actor)
    rec.settle(row is not None, "already revoked" if row else f"no key named {name!r}")
    if row is None:
        return False, f"no key named {name!r} (see `sluice keys list`)"
    return True, f"key {name!r} is revoked; requests with it answer 401 from now on"
