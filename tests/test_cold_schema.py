"""A cold `sluice search` opens the job database without the schema check every other process makes
(sluice.storage.db.open_engine): a database an older Sluice made is brought up to date when a
statement finds a table or column missing, and one too old for that gets a clear error, not a
traceback. On SQLite and PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import sys

from sqlalchemy import create_engine, inspect, text

from sluice.storage.db import get_engine, normalise_url

CLI = "import sys\nfrom sluice.cli.main import main\nsys.exit(main(sys.argv[1:]))"


def _search(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", CLI, "search", "--mode", "lexical", *argv],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _execute(url: str, *statements: str) -> None:
    engine = create_engine(normalise_url(url))
    with engine.begin() as conn:
        for statement in statements:
            conn.execute(text(statement))
    engine.dispose()


def test_a_database_an_older_sluice_made_is_brought_up_to_date(database_url):
    get_engine(database_url).dispose()
    # what an older Sluice left: no dataset deletes yet, no word index
    drop_lexical = (
        ["DROP TABLE lexical_chunk"]
        if database_url.startswith("sqlite")
        else ["DROP TABLE lexical_chunk"]
    )
    _execute(database_url, "ALTER TABLE dataset DROP COLUMN deleting_at", *drop_lexical)
    done = _search("harbour cranes")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "searched 1 dataset(s): default"
    assert "no matches" in done.stdout
    engine = create_engine(normalise_url(database_url))
    try:
        inspector = inspect(engine)
        assert "deleting_at" in {c["name"] for c in inspector.get_columns("dataset")}
        assert inspector.has_table("lexical_chunk")
    finally:
        engine.dispose()


def test_a_database_too_old_to_bring_up_to_date_gets_a_clear_error(database_url):
    # a dataset table without the columns each dataset has had since (its collection, its
    # description): NOT NULL columns, which no upgrade in place can add
    _execute(
        database_url,
        "CREATE TABLE dataset (id INTEGER PRIMARY KEY, name VARCHAR(64) NOT NULL UNIQUE)",
        "INSERT INTO dataset (id, name) VALUES (1, 'default')",
    )
    done = _search("harbour cranes")
    assert done.returncode == 1
    assert "Traceback" not in done.stderr, done.stderr
    assert "lacks what this version of Sluice reads" in done.stderr
    assert "dataset." in done.stderr  # the column missing, as the database named it
    assert "SLUICE_DATABASE_URL" in done.stderr  # and what to do
