"""Counts the console reads, kept by the job database itself as jobs and documents change.

The overview and the system page count jobs by status and error kind, jobs finished per minute,
and each dataset's live documents and the chunks search serves. Counted over the rows, each read
grows with the jobs (300,000 jobs: half a second a page). Here the database keeps them: triggers on
``job`` and ``document`` write, in the very transaction of every change (a transition by any path,
an upload, a delete, retention's prune, a hand-written UPDATE), what that change adds to and takes
from each count, as rows of ``tally_delta``. Only inserts, so no two writers wait for one counter
row. ``fold`` (the recovery round, every few seconds) sums the deltas into ``tally``, one row per
count; a read sums ``tally`` and the deltas not folded yet.

Kinds of row (``what``):

- ``job``: jobs per (dataset, status, error kind, '' for none), in ``n``.
- ``finish``: jobs succeeded or failed per (dataset, status, minute of ``finished_at`` since 1970),
  in ``n``, and their chunk counts in ``chunks``.
- ``dataset``: a dataset's live documents (``n``) and the chunks of their active jobs (``chunks``).
- ``work``: active jobs per (dataset, status, 'known' when their chunk count is): ``n``, the
  chunks they have left, the bytes of those whose count is not known yet (``size``).

The jobs table stays the source of truth: ``rebuild`` counts everything again from it (when the
triggers are first made on an existing database, and on demand), and ``drift`` says where the kept
counts and a count over the rows differ (none, unless someone dropped a trigger).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import (
    BigInteger,
    Column,
    Index,
    Integer,
    literal_column,
    select,
    text,
    union_all,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine
from sqlmodel import Field, Session, SQLModel

from sluice.storage.clock import epoch_seconds

VERSION = "v1"  # in the triggers' names: a change of what they write makes new ones
_KEY = ("what", "dataset_id", "status", "error_kind", "minute")
_VALUES = "n, chunks, size"
_SUMS = "SUM(n) AS n, SUM(chunks) AS chunks, SUM(size) AS size"
_FOLD_LOCK = 7_305_431  # PostgreSQL advisory lock: one fold at a time


class Tally(SQLModel, table=True):
    """Folded counts, one row per count (see the module)."""

    __tablename__ = "tally"
    # the chart's minutes over every dataset (a month of them is 43,200 rows a dataset)
    __table_args__ = (Index("ix_tally_what_minute", "what", "minute"),)

    what: str = Field(primary_key=True, max_length=10)
    dataset_id: int = Field(primary_key=True)
    status: str = Field(default="", primary_key=True, max_length=20)
    error_kind: str = Field(default="", primary_key=True, max_length=30)
    minute: int = Field(default=0, sa_column=Column(BigInteger, primary_key=True))
    n: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))
    chunks: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))
    size: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))


class TallyDelta(SQLModel, table=True):
    """What each change of a job or a document added to a count, not folded yet."""

    __tablename__ = "tally_delta"

    # Every change of a job writes several deltas: a 32-bit id would run out within months on a
    # busy PostgreSQL database, and every job write with it (SQLite's rowid is 64-bit already).
    id: int = Field(
        default=None,
        sa_column=Column(BigInteger().with_variant(Integer(), "sqlite"), primary_key=True),
    )
    what: str = Field(max_length=10)
    dataset_id: int
    status: str = Field(default="", max_length=20)
    error_kind: str = Field(default="", max_length=30)
    minute: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))
    n: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))
    chunks: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))
    size: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))


# --- what a row counts for ------------------------------------------------------------------------


def _minute(pg: bool, row: str) -> str:
    """The minute since 1970 of ``row``'s finish, as the read side's buckets count it."""
    dialect = postgresql.dialect() if pg else sqlite.dialect()
    seconds = epoch_seconds(literal_column(f"{row}.finished_at"))
    return f"({seconds.compile(dialect=dialect)} / 60)"


@dataclass(frozen=True)
class _Part:
    """What a row counts for: the SELECT list (of what, dataset_id, status, error_kind, minute,
    n, chunks, size), the one table it may join (``"document d ON d.x = {row}.y"``) and a
    condition. As a trigger's it reads NEW or OLD; counted over the rows it reads the table."""

    columns: str
    joined: str = ""
    where: str = ""

    def of_row(self) -> str:
        """The SELECT of one row (NEW, OLD), its joined table looked up by the condition."""
        conditions = [c for c in (self.joined.partition(" ON ")[2], self.where) if c]
        table = f" FROM {self.joined.partition(' ON ')[0]}" if self.joined else ""
        return f"SELECT {self.columns}{table}" + (
            f" WHERE {' AND '.join(conditions)}" if conditions else ""
        )

    def over(self, table: str) -> str:
        """The SELECT over every row of ``table`` (aliased as the row's name)."""
        join = f" JOIN {self.joined}" if self.joined else ""
        return f"SELECT {self.columns} FROM {table}{join}" + (
            f" WHERE {self.where}" if self.where else ""
        )


def _job_parts(pg: bool, row: str, sign: int, *, served: bool = True) -> list[_Part]:
    """What job ``row`` counts for, times ``sign``: its status (and error kind), its finish, the
    chunks it serves for a live document (``served``: a count over the rows takes these from the
    documents), and the work it has left while it waits."""
    chunks = f"{sign} * COALESCE({row}.chunk_count, 0) AS chunks"
    status = f"CAST({row}.status AS TEXT)"
    parts = [
        _Part(
            f"{_ALIASED.format('job', f'{row}.dataset_id', status)} "
            f"COALESCE(CAST({row}.error_kind AS TEXT), '') AS error_kind, 0 AS minute, "
            f"{sign} AS n, 0 AS chunks, 0 AS size"
        ),
        _Part(
            f"{_ALIASED.format('finish', f'{row}.dataset_id', status)} '' AS error_kind, "
            f"{_minute(pg, row)} AS minute, {sign} AS n, {chunks}, 0 AS size",
            where=f"{status} IN ('succeeded', 'failed') AND {row}.finished_at IS NOT NULL",
        ),
        _work_part(row, "w", sign, f"document w ON w.id = {row}.document_id"),
    ]
    if served:
        parts.append(
            _Part(
                f"{_ALIASED.format('dataset', f'{row}.dataset_id', _NONE)} '' AS error_kind, "
                f"0 AS minute, 0 AS n, {chunks}, 0 AS size",
                joined=f"document d ON d.active_job_id = {row}.id",
                where="d.deleted_at IS NULL",
            )
        )
    return parts


def _work_part(job: str, document: str, sign: int, joined: str) -> _Part:
    """An active job's work left, by the rule of ``sluice.ops.drain.WorkLeft.of``: chunks left when
    its count is known (``error_kind`` 'known'), else its document's bytes. A running job's
    progress moves it (a delta a batch, in the progress write's transaction). Written from either
    side: a job's row with its document joined, or a document's with its jobs."""
    status = f"CAST({job}.status AS TEXT)"
    stage = f"CAST({job}.stage AS TEXT)"
    known = f"{stage} IN ('embedding', 'indexing') AND {job}.total > 0"
    left = (
        f"CASE WHEN {stage} = 'embedding' AND {job}.total > {job}.done "
        f"THEN {job}.total - {job}.done ELSE 0 END"
    )
    return _Part(
        f"{_ALIASED.format('work', f'{job}.dataset_id', status)} "
        f"CASE WHEN {known} THEN 'known' ELSE '' END AS error_kind, 0 AS minute, {sign} AS n, "
        f"{sign} * CASE WHEN {known} THEN {left} ELSE 0 END AS chunks, "
        f"{sign} * CASE WHEN {known} THEN 0 ELSE COALESCE({document}.size, 0) END AS size",
        joined=joined,
        where=f"{status} IN ({_ACTIVE})",
    )


def _document_parts(row: str, sign: int, *, jobs: bool = True) -> list[_Part]:
    """What document ``row`` counts for, times ``sign``: itself while live, and its active job's
    chunks (under the job's dataset, as search serves them); with ``jobs``, what its waiting jobs
    count for with it (a count over the rows takes that from the jobs' side)."""
    parts = [
        _Part(
            f"{_ALIASED.format('dataset', f'{row}.dataset_id', _NONE)} '' AS error_kind, "
            f"0 AS minute, {sign} AS n, 0 AS chunks, 0 AS size",
            where=f"{row}.deleted_at IS NULL",
        ),
        _Part(
            f"{_ALIASED.format('dataset', 'j.dataset_id', _NONE)} '' AS error_kind, "
            f"0 AS minute, 0 AS n, {sign} * COALESCE(j.chunk_count, 0) AS chunks, 0 AS size",
            joined=f"job j ON j.id = {row}.active_job_id",
            where=f"{row}.deleted_at IS NULL",
        ),
    ]
    if jobs:
        parts.append(_work_part("wj", row, sign, f"job wj ON wj.document_id = {row}.id"))
    return parts


_ALIASED = "'{0}' AS what, {1} AS dataset_id, {2} AS status,"
_NONE = "''"
_ACTIVE = "'pending', 'running', 'retrying'"


def _insert(parts: Sequence[_Part]) -> str:
    """One INSERT of the parts' sums per count (a change that moves nothing writes nothing)."""
    keys = ", ".join(_KEY)
    selects = " UNION ALL ".join(p.of_row() for p in parts)
    return (
        f"INSERT INTO tally_delta ({keys}, {_VALUES}) "
        f"SELECT {keys}, {_SUMS} FROM ({selects}) AS c "
        f"GROUP BY {keys} HAVING SUM(n) <> 0 OR SUM(chunks) <> 0 OR SUM(size) <> 0"
    )


# The columns whose change moves a count (an UPDATE of others fires nothing).
JOB_COLUMNS: tuple[str, ...] = ("status", "error_kind", "dataset_id", "finished_at", "chunk_count")
JOB_COLUMNS += ("stage", "total", "done", "document_id")
DOCUMENT_COLUMNS = ("deleted_at", "active_job_id", "dataset_id", "size")


def _changed(columns: Iterable[str]) -> str:
    return " OR ".join(f"OLD.{c} IS DISTINCT FROM NEW.{c}" for c in columns)


def _bodies(pg: bool) -> dict[tuple[str, str], str]:
    """(table, operation) -> the INSERT its trigger runs."""
    return {
        ("job", "INSERT"): _insert(_job_parts(pg, "NEW", 1)),
        ("job", "DELETE"): _insert(_job_parts(pg, "OLD", -1)),
        ("job", "UPDATE"): _insert(_job_parts(pg, "OLD", -1) + _job_parts(pg, "NEW", 1)),
        ("document", "INSERT"): _insert(_document_parts("NEW", 1)),
        ("document", "DELETE"): _insert(_document_parts("OLD", -1)),
        ("document", "UPDATE"): _insert(_document_parts("OLD", -1) + _document_parts("NEW", 1)),
    }


_TRIGGERS = [(t, op) for t in ("job", "document") for op in ("INSERT", "DELETE", "UPDATE")]


def _trigger_name(table: str, operation: str) -> str:
    return f"tally_{VERSION}_{table}_{operation.lower()}"


def _sqlite_triggers() -> list[str]:
    out = []
    for (table, operation), body in _bodies(pg=False).items():
        columns = JOB_COLUMNS if table == "job" else DOCUMENT_COLUMNS
        on = f"UPDATE OF {', '.join(columns)}" if operation == "UPDATE" else operation
        when = f" WHEN {_changed(columns).replace('IS DISTINCT FROM', 'IS NOT')}"
        out.append(
            f"CREATE TRIGGER {_trigger_name(table, operation)} AFTER {on} ON {table} "
            f"FOR EACH ROW{when if operation == 'UPDATE' else ''} BEGIN {body}; END"
        )
    return out


def _postgres_triggers() -> list[str]:
    out = []
    for table in ("job", "document"):
        bodies = _bodies(pg=True)
        function = f"tally_{VERSION}_{table}"
        out.append(
            f"CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$ "
            f"BEGIN IF TG_OP = 'INSERT' THEN {bodies[(table, 'INSERT')]}; "
            f"ELSIF TG_OP = 'DELETE' THEN {bodies[(table, 'DELETE')]}; "
            f"ELSE {bodies[(table, 'UPDATE')]}; END IF; RETURN NULL; END $$"
        )
        columns = JOB_COLUMNS if table == "job" else DOCUMENT_COLUMNS
        for operation in ("INSERT", "DELETE", "UPDATE"):
            on = f"UPDATE OF {', '.join(columns)}" if operation == "UPDATE" else operation
            when = f" WHEN ({_changed(columns)})" if operation == "UPDATE" else ""
            out.append(
                f"CREATE TRIGGER {_trigger_name(table, operation)} AFTER {on} ON {table} "
                f"FOR EACH ROW{when} EXECUTE FUNCTION {function}()"
            )
    return out


# --- made, counted again, folded ------------------------------------------------------------------


def _pg(conn: Connection | Engine) -> bool:
    return conn.dialect.name == "postgresql"


def _found(conn: Connection) -> set[tuple[str, str]]:
    """(table, name) of every counting trigger on ``job`` and ``document``, of any version."""
    if _pg(conn):
        found = conn.execute(
            text(
                "SELECT c.relname, t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
                "WHERE NOT t.tgisinternal AND c.oid IN ('job'::regclass, 'document'::regclass) "
                "AND starts_with(t.tgname, 'tally_')"
            )
        )
    else:
        found = conn.execute(
            text(
                "SELECT tbl_name, name FROM sqlite_master WHERE type = 'trigger' "
                "AND tbl_name IN ('job', 'document') AND substr(name, 1, 6) = 'tally_'"
            )
        )
    return {(row[0], row[1]) for row in found}


def _present(conn: Connection) -> bool:
    """Every trigger of this version is there and no other (an SQLite table made again lost its
    own; a trigger of another version would count every change twice)."""
    return _found(conn) == {(t, _trigger_name(t, op)) for t, op in _TRIGGERS}


def drop_triggers(conn: Connection) -> None:
    """Drop the counting triggers, of any version (a table remade by SQLite would break them
    meanwhile; an older version's would count beside the new)."""
    for table, name in sorted(_found(conn)):
        on = f" ON {table}" if _pg(conn) else ""
        conn.execute(text(f'DROP TRIGGER IF EXISTS "{name}"{on}'))


def _lock(conn: Connection) -> None:
    """The write lock the counting again needs: no job or document changes meanwhile (reads go
    on). On SQLite the connection's first write takes it; on PostgreSQL a share lock on both
    tables (and one fold or rebuild at a time)."""
    if _pg(conn):
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _FOLD_LOCK})
        conn.execute(text("LOCK TABLE job, document IN SHARE MODE"))
    else:
        conn.execute(text("DELETE FROM tally_delta WHERE 0"))  # takes the write lock (IMMEDIATE)


def _counted_over_rows(pg: bool) -> str:
    """Every count, counted over the jobs and documents: the same parts the triggers write, each
    over its table (a live document's served chunks once, from the documents' side)."""
    keys = ", ".join(_KEY)
    selects = [p.over("job j") for p in _job_parts(pg, "j", 1, served=False)]
    selects += [p.over("document dr") for p in _document_parts("dr", 1, jobs=False)]
    return f"SELECT {keys}, {_SUMS} FROM ({' UNION ALL '.join(selects)}) AS c GROUP BY {keys}"


def _count_again(conn: Connection) -> None:
    conn.execute(text("DELETE FROM tally"))
    conn.execute(text("DELETE FROM tally_delta"))
    keys = ", ".join(_KEY)
    conn.execute(text(f"INSERT INTO tally ({keys}, {_VALUES}) {_counted_over_rows(_pg(conn))}"))


def install(engine: Engine) -> bool:
    """Make the triggers when the database lacks them, and count everything from the rows in the
    same transaction (no change slips between). False when they were there. Safe when several
    processes start at once: the second finds them made under the lock."""
    _widen_delta_ids(engine)
    with engine.connect() as conn:
        if _present(conn):
            return False
    with engine.begin() as conn:
        _lock(conn)
        if _present(conn):
            return False
        drop_triggers(conn)
        for statement in _postgres_triggers() if _pg(conn) else _sqlite_triggers():
            conn.execute(text(statement))
        _count_again(conn)
    return True


def _widen_delta_ids(engine: Engine) -> None:
    """A PostgreSQL database made when ``tally_delta.id`` was a 32-bit serial gets a 64-bit one
    (the table holds only the deltas not folded yet: rewriting it is quick)."""
    if engine.dialect.name != "postgresql":
        return
    ask = text(
        "SELECT data_type FROM information_schema.columns WHERE table_schema = current_schema() "
        "AND table_name = 'tally_delta' AND column_name = 'id'"
    )
    with engine.connect() as conn:
        if conn.execute(ask).scalar() != "integer":
            return
    with engine.begin() as conn:
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _FOLD_LOCK})
        if conn.execute(ask).scalar() == "integer":  # not widened by another process meanwhile
            conn.execute(text("ALTER TABLE tally_delta ALTER COLUMN id TYPE BIGINT"))
            conn.execute(text("ALTER SEQUENCE IF EXISTS tally_delta_id_seq AS BIGINT"))


def rebuild(engine: Engine) -> None:
    """Count everything again from the jobs and documents (the source of truth)."""
    with engine.begin() as conn:
        _lock(conn)
        _count_again(conn)


def fold(engine: Engine) -> int:
    """Sum the deltas into ``tally``; returns how many counts changed. Counts that came to nothing
    (every finish of a minute since pruned) are removed."""
    keys = ", ".join(_KEY)
    upsert = (
        f"INSERT INTO tally ({keys}, {_VALUES}) {{rows}} ON CONFLICT ({keys}) DO UPDATE SET "
        "n = tally.n + excluded.n, chunks = tally.chunks + excluded.chunks, "
        f"size = tally.size + excluded.size RETURNING {keys}, {_VALUES}"
    )
    with engine.begin() as conn:
        if _pg(conn):  # the deltas summed are exactly those deleted, in one statement
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _FOLD_LOCK})
            rows = f"SELECT {keys}, {_SUMS} FROM gone GROUP BY {keys} ORDER BY {keys}"
            done = conn.execute(
                text(
                    "WITH gone AS (DELETE FROM tally_delta RETURNING *) " + upsert.format(rows=rows)
                )
            ).all()
        else:  # one writer at a time: none adds a delta between these statements
            last = conn.execute(text("SELECT MAX(id) FROM tally_delta")).scalar()
            if last is None:
                return 0
            rows = f"SELECT {keys}, {_SUMS} FROM tally_delta WHERE id <= :last GROUP BY {keys}"
            done = conn.execute(text(upsert.format(rows=rows)), {"last": last}).all()
            conn.execute(text("DELETE FROM tally_delta WHERE id <= :last"), {"last": last})
        for row in done:
            if row.n == 0 and row.chunks == 0 and row.size == 0:
                conn.execute(
                    text(
                        "DELETE FROM tally WHERE what = :what AND dataset_id = :dataset_id AND "
                        "status = :status AND error_kind = :error_kind AND minute = :minute"
                    ),
                    dict(row._mapping),
                )
    return len(done)


PILE = 20_000  # unfolded deltas beyond which a reader folds them itself


def fold_if_piled(engine: Engine) -> int:
    """Fold when more than ``PILE`` deltas wait: no recovery round has folded them (no worker is
    up while uploads go on), and every read of the counts sums them. Asking costs a walk of at most
    ``PILE`` index entries; returns what ``fold`` did (0 when nothing was piled)."""
    with engine.connect() as conn:
        piled = conn.execute(
            text("SELECT id FROM tally_delta ORDER BY id LIMIT 1 OFFSET :n"), {"n": PILE}
        ).first()
    return fold(engine) if piled is not None else 0


# --- read -----------------------------------------------------------------------------------------


def counted(what: str) -> Any:
    """``tally`` and the deltas not folded yet, of one kind, as one subquery of (dataset_id,
    status, error_kind, minute, n, chunks, size): sum it."""
    columns = ("dataset_id", "status", "error_kind", "minute", "n", "chunks", "size")
    parts = [
        select(*(getattr(model, c) for c in columns)).where(cast(Any, model).what == what)
        for model in (Tally, TallyDelta)
    ]
    return union_all(*parts).subquery(f"counted_{what}")


def heal(engine: Engine) -> int:
    """How many counts differ from a count over the rows, asked in one statement (one snapshot:
    no change between the two sides); when any does, everything is counted again. The triggers
    keep the counts exact unless something wrote past them (a trigger dropped, two PostgreSQL
    transactions each changing a job and its document unseen by the other's trigger): this puts
    such a drift right (the recovery round's, hourly)."""
    keys = ", ".join(_KEY)
    kept = (
        f"SELECT {keys}, {_SUMS} FROM (SELECT {keys}, {_VALUES} FROM tally UNION ALL "
        f"SELECT {keys}, {_VALUES} FROM tally_delta) AS k GROUP BY {keys}"
    )
    nonzero = "WHERE n <> 0 OR chunks <> 0 OR size <> 0"
    with engine.connect() as conn:
        fresh = _counted_over_rows(_pg(conn))
        differ = conn.execute(
            text(
                f"WITH k AS (SELECT * FROM ({kept}) AS a {nonzero}), "
                f"f AS (SELECT * FROM ({fresh}) AS b {nonzero}) "
                "SELECT (SELECT COUNT(*) FROM (SELECT * FROM k EXCEPT SELECT * FROM f) AS x) + "
                "(SELECT COUNT(*) FROM (SELECT * FROM f EXCEPT SELECT * FROM k) AS y)"
            )
        ).scalar_one()
    if differ:
        rebuild(engine)
    return int(differ)


def drift(session: Session) -> dict[tuple, tuple[tuple[int, ...], tuple[int, ...]]]:
    """Counts where the kept ones and a count over the rows differ: key -> (kept, counted), each
    (n, chunks, size). Empty unless something wrote past the triggers."""
    keys = ", ".join(_KEY)
    both = (
        f"SELECT {keys}, {_VALUES} FROM tally UNION ALL SELECT {keys}, {_VALUES} FROM tally_delta"
    )
    pg = session.get_bind().dialect.name == "postgresql"
    kept, fresh = (
        {
            tuple(r[:5]): tuple(int(v) for v in r[5:])
            for r in session.execute(text(statement)).all()
            if any(r[5:])
        }
        for statement in (
            f"SELECT {keys}, {_SUMS} FROM ({both}) AS k GROUP BY {keys}",
            _counted_over_rows(pg),
        )
    )
    return {
        key: (kept.get(key, (0, 0, 0)), fresh.get(key, (0, 0, 0)))
        for key in set(kept) | set(fresh)
        if kept.get(key, (0, 0, 0)) != fresh.get(key, (0, 0, 0))
    }
