"""Engine and sessions for the job database (SQLite in WAL mode, or PostgreSQL via psycopg 3).

SQLModel and the tables (sluice.storage.models) are imported where they are used, not here: a cold
``sluice search`` opens its engine with ``open_engine`` and reads with plain SQL, and importing the
ORM with every table was half of its imports.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from sqlalchemy import Integer, create_engine, event
from sqlalchemy.engine import CursorResult, Engine, make_url
from sqlalchemy.sql import Executable

from sluice.errors import UserActionError
from sluice.files import private_dir, private_file
from sluice.storage import lexical

if TYPE_CHECKING:
    from sqlmodel import Session, SQLModel

    from sluice.storage.models import Dataset

DEFAULT_DATASET = "default"
log = logging.getLogger(__name__)

_engines: dict[str, Engine] = {}  # schema checked (get_engine, or bring_up_to_date)
_unchecked: dict[str, Engine] = {}  # opened by open_engine, its schema not checked yet
_lock = threading.Lock()
# A statement that failed for a table or column the database lacks: PostgreSQL's SQLSTATEs
# (undefined_table, undefined_column), SQLite's messages.
_MISSING_SQLSTATES = ("42P01", "42703")
_MISSING_SQLITE = ("no such table", "no such column")

M = TypeVar("M", bound="SQLModel")
T = TypeVar("T")


def stored(session: Session, model: type[M], ident: Any, **options: Any) -> M:
    """The row the caller knows is there (``Session.get`` with its options); LookupError if not."""
    found = session.get(model, ident, **options)
    if found is None:
        raise LookupError(f"no {model.__name__} {ident!r}")
    return found


def matched(session: Session, statement: Executable, params: dict[str, Any] | None = None) -> int:
    """The rows an UPDATE or DELETE matched. Its result is a CursorResult; ``Session.execute`` is
    typed as returning any Result, which has no ``rowcount``."""
    return cast("CursorResult[Any]", session.execute(statement, params)).rowcount


def normalise_url(url: str) -> str:
    """Let people write postgresql:// and still get psycopg 3."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA busy_timeout=30000")  # first: switching to WAL itself may wait for a lock
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def make_engine(url: str) -> Engine:
    url = normalise_url(url)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            private_dir(Path(parsed.database).parent)
            private_file(
                Path(parsed.database)
            )  # SQLite gives its -wal and -shm files the same mode
        # The driver begins a transaction at its first write: IMMEDIATE asks for the write lock
        # there, first thing, so the busy timeout applies. A deferred one could read first (SQLite
        # preparing a statement again after another process changed the schema reads the FTS5
        # tables' config) and then fail at once with "database is locked" when another connection
        # holds the lock: SQLite runs no busy handler for a transaction that already reads.
        engine = create_engine(
            url,
            connect_args={
                "check_same_thread": False,
                "timeout": 30,
                "isolation_level": "IMMEDIATE",
            },
            pool_size=10,
            max_overflow=20,
        )
        event.listen(engine, "connect", _sqlite_pragmas)
    else:
        engine = create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)
    return engine


def get_engine(url: str) -> Engine:
    """One engine per URL per process, with the schema in place."""
    url = normalise_url(url)
    with _lock:
        engine = _engines.get(url)
        if engine is None:
            engine = _unchecked.pop(url, None) or make_engine(url)
            init_schema(engine)
            _engines[url] = engine
        return engine


def open_engine(url: str) -> Engine:
    """The engine of ``url`` without the schema check ``get_engine`` makes (creating, inspecting and
    altering every table costs a cold process a quarter of a second): for a command that only
    reads, through ``reading``, which checks the schema when a statement finds a table or column
    missing."""
    url = normalise_url(url)
    with _lock:
        engine = _engines.get(url) or _unchecked.get(url)
        if engine is None:
            engine = _unchecked[url] = make_engine(url)
        return engine


class SchemaOutOfDate(UserActionError):
    """The job database lacks what this Sluice reads, and the schema check could not add it."""


def schema_missing(exc: BaseException) -> bool:
    """Whether a statement failed because the database lacks a table or a column."""
    from sqlalchemy.exc import DBAPIError

    if not isinstance(exc, DBAPIError):
        return False
    if getattr(exc.orig, "sqlstate", None) in _MISSING_SQLSTATES:
        return True
    return str(exc.orig).lower().startswith(_MISSING_SQLITE)


def _out_of_date(engine: Engine, exc: BaseException) -> SchemaOutOfDate:
    first = str(getattr(exc, "orig", exc)).strip().splitlines()[0]
    return SchemaOutOfDate(
        "schema_out_of_date",
        f"the job database ({engine.url.render_as_string(hide_password=True)}) lacks what this "
        f"version of Sluice reads, and bringing it up to date failed: {first}",
        "It was made by a Sluice too old to upgrade in place (or this process may not alter it): "
        "start a worker of this version with a user that may alter the database, or point "
        "SLUICE_DATABASE_URL at a new one.",
    )


def reading(engine: Engine, read: Callable[[], T]) -> T:
    """``read()`` on an engine from ``open_engine``. When one of its statements finds a table or a
    column missing (a database made by an older Sluice, or one never set up), the schema is brought
    up to date as ``get_engine`` does and ``read()`` runs again; SchemaOutOfDate when that cannot
    mend it. Only for reads: ``read`` may run twice."""
    from sqlalchemy.exc import DBAPIError

    try:
        return read()
    except DBAPIError as exc:
        if not schema_missing(exc):
            raise
        try:
            bring_up_to_date(engine)
            return read()
        except DBAPIError as again:
            raise _out_of_date(engine, again) from again


def bring_up_to_date(engine: Engine) -> None:
    """The schema check of ``get_engine``, on an engine from ``open_engine``."""
    init_schema(engine)
    with _lock:
        for url, unchecked in list(_unchecked.items()):
            if unchecked is engine:
                _engines.setdefault(url, _unchecked.pop(url))


def dispose_engines() -> None:
    with _lock:
        for engine in [*_engines.values(), *_unchecked.values()]:
            engine.dispose()
        _engines.clear()
        _unchecked.clear()


def init_schema(engine: Engine) -> None:
    """Create missing tables and indexes (safe on a fresh and on an existing database).

    Several processes may start at once on a fresh database; the loser of a create race sees
    "already exists" (or, on SQLite switching to WAL, "database is locked") and checks again.
    """
    from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError
    from sqlmodel import Session, SQLModel

    import sluice.storage.models  # noqa: F401  (every table, in SQLModel.metadata)

    id_tables()  # AUTOINCREMENT on SQLite, before any table is made
    for attempt in range(10):
        try:
            SQLModel.metadata.create_all(engine)
            lexical.init_schema(engine)
            break
        except (OperationalError, ProgrammingError, IntegrityError) as exc:
            text = str(exc).lower()
            if not any(w in text for w in ("exist", "duplicate", "locked")) or attempt == 9:
                raise
            time.sleep(0.05 * (attempt + 1))
    add_missing_columns(engine)
    separate_source_events(engine)
    make_ids_never_reused(engine)
    add_missing_indexes(engine)
    from sluice.storage import tallies  # sqlmodel: not on a cold search's path

    tallies.install(engine)  # after any remake of a table: its triggers go with it
    add_name_search_index(engine)
    fill_outbox_datasets(engine)
    with Session(engine) as session:
        ensure_instance(session=session)
        ensure_dataset(session=session, name=DEFAULT_DATASET)


def fill_outbox_datasets(engine: Engine) -> int:
    """Unsent outbox rows written before ``outbox.dataset_id`` existed get their job's dataset (the
    dispatcher reads unsent rows by dataset, and ranks any it finds without one apart). One
    statement; none to fill is an index lookup."""
    from sqlalchemy import text

    with engine.begin() as conn:
        return conn.execute(
            text(
                "UPDATE outbox SET dataset_id = "
                "(SELECT job.dataset_id FROM job WHERE job.id = outbox.job_id) "
                "WHERE sent_at IS NULL AND dataset_id IS NULL"
            )
        ).rowcount


def separate_source_events(engine: Engine) -> int:
    """``source.synced`` deliveries written before ``webhook_delivery.source_id`` existed held the
    source's id negated in ``job_id``: they get it in ``source_id`` and ``job_id`` NULL (which a
    table made then must first allow). One indexed statement; none to move finds nothing."""
    from sqlalchemy import text

    allow_null(engine, "webhook_delivery", "job_id")
    with engine.begin() as conn:
        return conn.execute(
            text("UPDATE webhook_delivery SET source_id = -job_id, job_id = NULL WHERE job_id < 0")
        ).rowcount


def allow_null(engine: Engine, table_name: str, column: str) -> bool:
    """Let a column an older Sluice made NOT NULL take NULL, as the model now says; False when it
    already does. PostgreSQL alters the column; SQLite makes the table again (``remake_table``)."""
    from sqlalchemy import inspect, text

    def nullable(columns) -> bool:
        return any(c["name"] == column and c["nullable"] for c in columns)

    inspector = inspect(engine)
    if not inspector.has_table(table_name) or nullable(inspector.get_columns(table_name)):
        return False
    if engine.dialect.name != "sqlite":
        with engine.begin() as conn:
            conn.execute(text(f'ALTER TABLE "{table_name}" ALTER COLUMN "{column}" DROP NOT NULL'))
        return True

    def still_not_null(conn) -> bool:
        info = conn.exec_driver_sql(f'PRAGMA table_info("{table_name}")')
        return any(row[1] == column and row[3] for row in info)

    return remake_table(engine, table_name, needed=still_not_null)


def remake_table(engine: Engine, table_name: str, *, needed: Callable[[Any], bool]) -> bool:
    """Make an SQLite table again as the model says (SQLite alters little in place): a copy made by
    the model's own CREATE TABLE, the rows copied over, the old table dropped, the copy renamed;
    ``add_missing_indexes`` makes its indexes again. One transaction with foreign keys off (the
    rows keep their ids, so every reference still holds; checked before the commit). ``needed`` is
    asked again under the write lock, so a second process starting at once does nothing."""
    from sqlalchemy.schema import CreateTable
    from sqlmodel import SQLModel

    table = SQLModel.metadata.tables[table_name]
    copy_name = f"{table_name}__remade"
    create = str(CreateTable(table).compile(dialect=engine.dialect)).strip()
    head = f"CREATE TABLE {engine.dialect.identifier_preparer.format_table(table)} "
    if not create.startswith(head):
        raise RuntimeError(f"cannot remake {table_name}: unexpected DDL {create[:80]!r}")
    create = f'CREATE TABLE "{copy_name}" ' + create[len(head) :]
    with engine.connect() as conn:
        conn.exec_driver_sql("PRAGMA foreign_keys=OFF")  # only outside a transaction
        conn.exec_driver_sql("BEGIN IMMEDIATE")  # pysqlite begins no transaction for DDL itself
        try:
            if not needed(conn):
                conn.rollback()
                return False  # another process did it meanwhile
            present = {row[1] for row in conn.exec_driver_sql(f'PRAGMA table_info("{table_name}")')}
            lacking = [
                c.name
                for c in table.columns
                if c.name not in present and not c.nullable and c.server_default is None
            ]
            if lacking:  # too old to remake: the schema check says which columns it lacks
                conn.rollback()
                return False
            conn.exec_driver_sql(f'DROP TABLE IF EXISTS "{copy_name}"')
            conn.exec_driver_sql(create)
            names = ", ".join(f'"{c.name}"' for c in table.columns if c.name in present)
            conn.exec_driver_sql(
                f'INSERT INTO "{copy_name}" ({names}) SELECT {names} FROM "{table_name}"'
            )
            from sluice.storage import tallies

            tallies.drop_triggers(conn)  # they name other tables; install makes them again
            conn.exec_driver_sql(f'DROP TABLE "{table_name}"')
            conn.exec_driver_sql(f'ALTER TABLE "{copy_name}" RENAME TO "{table_name}"')
            broken = conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
            if broken:
                raise RuntimeError(f"remaking {table_name} broke references: {broken[:5]}")
            conn.commit()
        except BaseException:
            conn.rollback()
            raise
        finally:
            conn.exec_driver_sql("PRAGMA foreign_keys=ON")
    return True


def id_tables() -> list[Any]:
    """The tables whose rows are named by an integer ``id`` across time (events behind
    Last-Event-ID, webhook event ids, a stream's datasets, cached ids): every table of the model
    with one. On SQLite they are AUTOINCREMENT, so a deleted newest row's id is never handed out
    again (PostgreSQL's sequences never reuse)."""
    from sqlmodel import SQLModel

    import sluice.storage.models  # noqa: F401  (every table, in SQLModel.metadata)

    found = []
    for table in SQLModel.metadata.sorted_tables:
        pk = list(table.primary_key.columns)
        if len(pk) == 1 and pk[0].name == "id" and isinstance(pk[0].type, Integer):
            table.dialect_kwargs["sqlite_autoincrement"] = True
            found.append(table)
    return found


def make_ids_never_reused(engine: Engine) -> list[str]:
    """Tables an older Sluice made on SQLite without AUTOINCREMENT are made again with it; the
    tables this Sluice makes have it from the start. Returns the tables remade."""
    if engine.dialect.name != "sqlite":
        return []
    remade = []
    for table in id_tables():

        def plain(conn, name: str = table.name) -> bool:
            row = conn.exec_driver_sql(
                "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
            ).first()
            return row is not None and "AUTOINCREMENT" not in (row[0] or "").upper()

        with engine.connect() as conn:
            if not plain(conn):
                continue
        if remake_table(engine, table.name, needed=plain):
            remade.append(table.name)
    return remade


def ensure_instance(*, session: Session) -> str:
    """The instance id of this job database, made the first time the database is set up."""
    from sluice.storage.models import Instance

    row = session.get(Instance, 1)
    if row is None:
        session.add(Instance(id=1, instance_id=uuid.uuid4().hex))
        try:
            session.commit()
        except Exception:  # another process made it at the same moment
            session.rollback()
        row = stored(session, Instance, 1, populate_existing=True)
    return row.instance_id


def instance_id(engine: Engine) -> str:
    from sqlmodel import Session

    with Session(engine) as session:
        return ensure_instance(session=session)


def _present_tables(engine: Engine):
    """An inspector, and the tables of the model that the database already has."""
    from sqlalchemy import inspect
    from sqlmodel import SQLModel

    inspector = inspect(engine)
    return inspector, [t for t in SQLModel.metadata.sorted_tables if inspector.has_table(t.name)]


def _made_by_another(exc: Exception) -> bool:
    """A process that lost the race to make the same column or index sees this, and moves on."""
    text = str(exc).lower()
    return "duplicate" in text or "exists" in text


def add_missing_columns(engine: Engine) -> list[str]:
    """Add the nullable columns a newer Sluice defines to tables an older one created.

    ``create_all`` creates missing tables only. New columns are always nullable (or have a
    default), so an existing database takes them with a plain ADD COLUMN; a process that loses the
    race to another adding the same column sees "duplicate" and moves on.
    """
    from sqlalchemy import text
    from sqlalchemy.exc import OperationalError, ProgrammingError

    added = []
    inspector, tables = _present_tables(engine)
    for table in tables:
        present = {c["name"] for c in inspector.get_columns(table.name)}
        for column in table.columns:
            if column.name in present or not column.nullable:
                continue
            kind = column.type.compile(dialect=engine.dialect)
            try:
                with engine.begin() as conn:
                    conn.execute(
                        text(f'ALTER TABLE "{table.name}" ADD COLUMN "{column.name}" {kind}')
                    )
                added.append(f"{table.name}.{column.name}")
            except (OperationalError, ProgrammingError) as exc:
                if not _made_by_another(exc):
                    raise
    return added


def add_missing_indexes(engine: Engine) -> list[str]:
    """Create the indexes a newer Sluice defines on tables an older one created (``create_all``
    creates the indexes of the tables it creates, and no others). PostgreSQL may answer a process
    that loses the race with a duplicate key in its catalog (an IntegrityError)."""
    from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

    added = []
    inspector, tables = _present_tables(engine)
    for table in tables:
        present = {ix["name"] for ix in inspector.get_indexes(table.name)}
        for index in table.indexes:
            if index.name in present:
                continue
            try:
                index.create(engine, checkfirst=True)
                added.append(index.name)
            except (OperationalError, ProgrammingError, IntegrityError) as exc:
                if not _made_by_another(exc):
                    raise
    return added


NAME_SEARCH_INDEX = "ix_job_filename_trgm"


def add_name_search_index(engine: Engine) -> bool:
    """On PostgreSQL, the trigram index the jobs page's name search (ILIKE '%...%') walks instead of
    every row, when the server has pg_trgm (contrib) and the role may enable it; without, the
    search still works, by a scan, and the log says why. False when there was nothing to make.
    SQLite has no such index: its search scans the file name index (``queries.name_like``).

    Built ``CONCURRENTLY`` (jobs go on being written while an existing table of millions of jobs
    is indexed), by one process at a time (an advisory lock; the others leave it to that one); a
    build that died left an invalid index, which the next check drops and builds again."""
    from sqlalchemy import text
    from sqlalchemy.exc import DBAPIError

    if engine.dialect.name != "postgresql":
        return False
    valid = text(
        "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "WHERE c.relname = :n"
    )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        if conn.execute(valid, {"n": NAME_SEARCH_INDEX}).scalar():
            return False
        if not conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": _TRIGRAM_LOCK}).scalar():
            return False  # another process is building it
        try:
            state = conn.execute(valid, {"n": NAME_SEARCH_INDEX}).first()
            if state is not None and state[0]:
                return False
            if state is not None:  # a build that died: its index takes writes, serves no read
                conn.execute(text(f"DROP INDEX CONCURRENTLY IF EXISTS {NAME_SEARCH_INDEX}"))
            conn.execute(text("CREATE EXTENSION IF NOT EXISTS pg_trgm"))
            conn.execute(
                text(
                    f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {NAME_SEARCH_INDEX} ON job "
                    "USING gin (filename gin_trgm_ops)"
                )
            )
        except DBAPIError as exc:
            if _made_by_another(exc):
                return False
            log.warning("no trigram index for the job name search: %s", exc.orig or exc)
            return False
        finally:
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _TRIGRAM_LOCK})
    return True


_TRIGRAM_LOCK = 7_305_432  # PostgreSQL advisory lock: one build of the trigram index at a time


def refuse_if_deleting(dataset: Dataset) -> None:
    """A dataset being deleted (sluice.ops.dataset_admin) takes nothing new and answers nothing."""
    if dataset.deleting_at is not None:
        raise UserActionError(
            "dataset_deleting",
            f"dataset {dataset.name!r} is being deleted",
            "Wait for the delete to finish (or run it again: sluice datasets delete NAME), then "
            "make the dataset again if you want it.",
        )


def ensure_dataset(*, session: Session, name: str, description: str = "") -> Dataset:
    from sqlmodel import select

    from sluice.storage.models import Dataset

    dataset = session.exec(select(Dataset).where(Dataset.name == name)).first()
    if dataset is not None:
        refuse_if_deleting(dataset)
        return dataset
    dataset = Dataset(
        name=name, description=description, collection=f"sluice-{uuid.uuid4().hex[:16]}"
    )
    session.add(dataset)
    try:
        session.commit()
    except Exception:  # another process created it at the same moment
        session.rollback()
        dataset = session.exec(select(Dataset).where(Dataset.name == name)).first()
        if dataset is None:
            raise
        return dataset
    session.refresh(dataset)
    bind = session.get_bind()
    lexical.ensure_dataset_index(bind if isinstance(bind, Engine) else bind.engine, dataset.id)
    return dataset
