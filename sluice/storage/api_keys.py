"""API keys in the job database: add, list, find by lookup id, mark used, revoke.

Rows hold only the hash of a secret (sluice.ops.keys makes and checks secrets); nothing here
ever sees a secret in clear.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import update
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from sluice.storage.clock import as_utc, db_now
from sluice.storage.models import ApiKey

TOUCH_EVERY = timedelta(seconds=60)  # last_used_at is written at most once a minute per key


class DuplicateKeyName(ValueError):
    """Another key already has this name."""


def add_key(
    *,
    session: Session,
    name: str,
    lookup: str,
    secret_hash: str,
    scope: str,
    dataset_ids: list[int],
    all_datasets: bool,
    created_by: str,
) -> ApiKey:
    row = ApiKey(
        name=name,
        lookup=lookup,
        secret_hash=secret_hash,
        scope=scope,
        dataset_ids=sorted(set(dataset_ids)),
        all_datasets=all_datasets,
        created_by=created_by,
        created_at=db_now(session),
    )
    session.add(row)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        raise DuplicateKeyName(f"a key named {name!r} exists already") from None
    session.refresh(row)
    return row


def list_keys(*, session: Session) -> list[ApiKey]:
    return list(session.exec(select(ApiKey).order_by(ApiKey.name)).all())


def key_by_lookup(*, session: Session, lookup: str) -> ApiKey | None:
    return session.exec(select(ApiKey).where(ApiKey.lookup == lookup)).first()


def key_by_name(*, session: Session, name: str) -> ApiKey | None:
    return session.exec(select(ApiKey).where(ApiKey.name == name)).first()


def touch(*, session: Session, key: ApiKey, now: datetime) -> None:
    """Record a use of the key, at most once per TOUCH_EVERY (a poll loop writes nothing)."""
    if key.last_used_at is not None and now - as_utc(key.last_used_at) < TOUCH_EVERY:
        return
    session.execute(update(ApiKey).where(col(ApiKey.id) == key.id).values(last_used_at=now))
    session.commit()


def revoke(*, session: Session, name: str, actor: str) -> ApiKey | None:
    """Revoke the key called ``name`` (None when there is none); revoking twice keeps the first."""
    row = key_by_name(session=session, name=name)
    if row is None:
        return None
    if row.revoked_at is None:
        session.execute(
            update(ApiKey)
            .where(col(ApiKey.id) == row.id, col(ApiKey.revoked_at).is_(None))
            .values(revoked_at=db_now(session), revoked_by=actor)
        )
        session.commit()
        session.refresh(row)
    return row
