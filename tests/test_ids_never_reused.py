"""Ids are never handed out again: SQLite reuses the id of a deleted newest row unless its table is
AUTOINCREMENT, and anything that names rows by id across time (Last-Event-ID, webhook event ids,
a stream's datasets) then names the wrong row. New databases have it; older ones are remade."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text

from sluice.storage import tallies
from sluice.storage.db import dispose_engines, get_engine, id_tables, init_schema

TABLES = ("dataset", "document", "job", "job_event", "api_key", "webhook_delivery", "source")


def _newest_deleted_then_inserted(engine, table: str, insert: str) -> tuple[int, int]:
    with engine.begin() as conn:
        conn.execute(text(insert))
        newest = conn.execute(text(f"SELECT max(id) FROM {table}")).scalar_one()
        conn.execute(text(f"DELETE FROM {table} WHERE id = :i"), {"i": newest})
        conn.execute(text(insert))
        again = conn.execute(text(f"SELECT max(id) FROM {table}")).scalar_one()
    return newest, again


DATASET = (
    "INSERT INTO dataset (name, description, collection, created_at) "
    "VALUES (hex(randomblob(6)), '', hex(randomblob(8)), CURRENT_TIMESTAMP)"
)


def test_every_table_named_by_id_is_autoincrement_on_sqlite(tmp_path):
    engine = get_engine(f"sqlite:///{tmp_path / 'jobs.db'}")
    try:
        with engine.connect() as conn:
            plain = [
                name
                for name, sql in conn.execute(
                    text("SELECT name, sql FROM sqlite_master WHERE type = 'table'")
                )
                if name in {t.name for t in id_tables()} and "AUTOINCREMENT" not in sql.upper()
            ]
        assert plain == []
        assert set(TABLES) <= {t.name for t in id_tables()}
        newest, again = _newest_deleted_then_inserted(engine, "dataset", DATASET)
        assert again > newest  # before: the deleted dataset's id named the next dataset
    finally:
        dispose_engines()


def _make_plain(engine, table: str) -> None:
    """What an older Sluice made: the same table without AUTOINCREMENT, its rows kept."""
    with engine.connect() as conn:
        conn.exec_driver_sql("PRAGMA foreign_keys=OFF")
        sql = conn.execute(
            text("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = :n"), {"n": table}
        ).scalar_one()
        conn.exec_driver_sql("BEGIN IMMEDIATE")
        conn.exec_driver_sql(
            sql.replace(f"CREATE TABLE {table} ", f"CREATE TABLE {table}__old ", 1).replace(
                " AUTOINCREMENT", ""
            )
        )
        conn.exec_driver_sql(f"INSERT INTO {table}__old SELECT * FROM {table}")
        tallies.drop_triggers(conn)  # an older Sluice had no counting triggers
        conn.exec_driver_sql(f"DROP TABLE {table}")
        conn.exec_driver_sql(f"ALTER TABLE {table}__old RENAME TO {table}")
        conn.commit()
        conn.exec_driver_sql("PRAGMA foreign_keys=ON")


@pytest.mark.timeout(120)
def test_an_older_databases_tables_are_remade_keeping_rows_and_references(tmp_path, make_ctx):
    from sluice.ops.ingest import ingest_bytes

    url = f"sqlite:///{tmp_path / 'data' / 'sluice.db'}"
    ctx = make_ctx(SLUICE_DATABASE_URL=url)
    done = ingest_bytes(ctx, b"harbour cranes " * 50, dataset="docs", filename="a.txt")
    for table in ("dataset", "document", "job", "job_event"):
        _make_plain(ctx.engine, table)
    dispose_engines()
    engine = create_engine(url)
    with engine.connect() as conn:
        before = {t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one() for t in TABLES}
    init_schema(engine)
    with engine.connect() as conn:
        after = {t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one() for t in TABLES}
        sqls = dict(
            conn.execute(text("SELECT name, sql FROM sqlite_master WHERE type = 'table'")).all()
        )
        assert conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall() == []
        job = conn.execute(
            text("SELECT document_id FROM job WHERE id = :j"), {"j": done.job_id}
        ).one()
        indexes = {
            r[0] for r in conn.execute(text("SELECT name FROM sqlite_master WHERE type = 'index'"))
        }
    assert after == before
    assert all(
        "AUTOINCREMENT" in sqls[t].upper() for t in ("dataset", "document", "job", "job_event")
    )
    assert job[0] is not None
    assert any(name.startswith("ix_job_") for name in indexes)  # made again with the table
    newest, again = _newest_deleted_then_inserted(
        engine,
        "job_event",
        f"INSERT INTO job_event (job_id, kind, actor, message, data, at) VALUES "
        f"({done.job_id}, 'note', 'test', '', '{{}}', CURRENT_TIMESTAMP)",
    )
    assert again > newest
    engine.dispose()
