"""The one clock: the job database's.

Heartbeats, leases, due times and outbox availability are written and compared with the time the
database reports, never with the clock of the host that runs the code: a worker whose clock is a
minute behind would otherwise look dead to the reaper at once, and would refuse its own due retry
("next attempt is due at ...") while its message is consumed.

``db_now(session)`` asks the database (one small query) and returns an aware UTC datetime in the
format every time column holds. SQLite's time is its host's; PostgreSQL's is the server's.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import BigInteger, DateTime, select
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement
from sqlmodel import Session


class current_time(FunctionElement):
    """The database's current UTC time as an SQL expression (usable inside an UPDATE)."""

    type = DateTime(timezone=True)
    inherit_cache = True


@compiles(current_time)
def _default(element, compiler, **kw) -> str:
    return "CURRENT_TIMESTAMP"


@compiles(current_time, "sqlite")
def _sqlite(element, compiler, **kw) -> str:
    # Microseconds as six digits, the way SQLAlchemy stores datetimes in SQLite, so that
    # text comparisons with stored values order correctly.
    return "(strftime('%Y-%m-%d %H:%M:%f', 'now') || '000')"


@compiles(current_time, "postgresql")
def _postgresql(element, compiler, **kw) -> str:
    return "clock_timestamp()"  # the time of the statement, not of the transaction's start


def db_now(session: Session) -> datetime:
    """The database's current time, aware, in UTC."""
    return as_utc(session.execute(select(current_time())).scalar_one())


def as_utc(value: datetime | str) -> datetime:
    """A time read from the database, aware, in UTC (SQLite returns naive times, or text)."""
    if isinstance(value, str):  # a dialect that returns text
        value = datetime.fromisoformat(value)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class epoch_seconds(FunctionElement):
    """Whole seconds since 1970 of a stored UTC time, as an SQL expression: for counting rows per
    time bucket in the database (``GROUP BY``) instead of reading every row."""

    type = BigInteger()
    inherit_cache = True


@compiles(epoch_seconds)
def _epoch_default(element, compiler, **kw) -> str:
    return f"CAST(FLOOR(EXTRACT(EPOCH FROM {compiler.process(element.clauses, **kw)})) AS BIGINT)"


@compiles(epoch_seconds, "sqlite")
def _epoch_sqlite(element, compiler, **kw) -> str:
    # Only the first 19 characters (to the whole second): strftime rounds fractions, and 59.9999995
    # s would fall in the next minute.
    return (
        f"CAST(strftime('%s', substr({compiler.process(element.clauses, **kw)}, 1, 19)) AS INTEGER)"
    )
