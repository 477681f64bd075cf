"""The refusals of the sources wing, and the source's lease that every change of a source holds (a
sync, a remove, an undo, a purge): taken for the change or refused naming its holder, checked by
each write in that write's own transaction (the fencing token), given back at the end.

The lease rows and their statements are ``sluice.storage.source_records``; this is how the
operations use them.
"""

from __future__ import annotations

import os
import socket
import threading

from sqlmodel import Session

from sluice.errors import OperationError
from sluice.ops.access import Operator
from sluice.pipeline.running.context import Context
from sluice.storage import source_records as records
from sluice.storage.source_records import Source

LEASE_SECONDS = 120.0  # renewed by every write of the holder; a dead holder's lease runs out


class SourceError(OperationError):
    """A source request refused: ``code`` says which rule, ``status`` the API's answer."""

    code, status = "bad_source", 422
    hint = "Name one folder on this host or one s3://bucket/prefix (sluice sources add --help)."


class UnknownSource(SourceError):
    code, status = "unknown_source", 404
    hint = "See the sources' names with `sluice sources list` (or GET /v1/sources)."


class SourceExists(SourceError):
    code, status = "source_exists", 409
    hint = "Choose another name, or remove the old source first (sluice sources remove NAME)."


class SourceBusy(SourceError):
    """Another change of the source (a sync, a remove, an undo) holds its lease."""

    code, status = "sync_running", 409
    hint = "Wait for it to end (sluice sources list shows the last sync), then ask again."


class SourceLeaseLost(RuntimeError):
    """Another change took this source's lease: this one writes nothing more."""


def sync_holder() -> str:
    """How a sync names itself as the lease's holder: its host, process and thread."""
    return f"a sync on {socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"[:120]


def take(ctx: Context, src: Source, *, holder: str) -> int:
    """The source's lease for one change: its fencing token (SourceBusy naming the holder while
    another change holds it)."""
    with Session(ctx.engine) as session:
        token = records.take_lease(
            session, source_id=src.id, holder=holder[:120], seconds=LEASE_SECONDS
        )
        if token is None:
            raise SourceBusy(
                f"source {src.name!r} is busy: {records.holder_of(session, src.id)} holds it"
            )
    return token


def fence(session: Session, source_id: int, token: int) -> None:
    """In the caller's transaction: go on only while ``token`` holds the source's lease (and
    extend it); else roll back and raise SourceLeaseLost."""
    if not records.renew_lease(session, source_id=source_id, token=token, seconds=LEASE_SECONDS):
        session.rollback()
        raise SourceLeaseLost(str(source_id))


def release(ctx: Context, source_id: int, token: int) -> None:
    with Session(ctx.engine) as session:
        records.release_lease(session, source_id=source_id, token=token)


def acting(who: Operator | None, actor: str) -> Operator:
    """The operator of a change for its audit row (a worker's sync: the system, by its name)."""
    return who if who is not None else Operator(actor, "operator", channel="system")


def source_named(session: Session, name: str) -> Source:
    src = records.by_name(session, name)
    if src is None:
        raise UnknownSource(f"no source named {name!r} (sluice sources list)")
    return src
