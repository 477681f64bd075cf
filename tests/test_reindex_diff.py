"""Before a reindex the operator sees what it changes in what search serves: for a sample of the
documents it would rebuild, the chunks served today beside those the pipeline in force makes (a
table cell per line before, table rows after), on the Integrity page with the tables drawn as
tables, and in ``sluice reindex --all --dry-run``."""

from __future__ import annotations

from sqlalchemy import update
from sqlmodel import Session

from sluice.cli.main import main
from sluice.ops import reindex_diff
from sluice.ops.ingest import ingest_bytes
from sluice.pipeline.running.runner import run_job
from sluice.storage import lexical
from sluice.storage.models import Job
from tests.support.apptest import assert_ok, open_console, texts

TABLE = b"port,tonnage,berths\nRotterdam,469,42\nAntwerp,271,35\nHamburg,119,28\n"
# what a parser that lost the rows made of it: one cell a line
CELLS = "\n".join(["port", "tonnage", "berths", "Rotterdam", "469", "42", "Antwerp", "271", "35"])


def _built_by_an_older_parser(ctx) -> int:
    """A CSV document whose served chunks an older pipeline made: its cells one per line."""
    r = ingest_bytes(ctx, TABLE, dataset="default", filename="ports.csv")
    assert r.accepted, r.message
    assert run_job(r.job_id, ctx=ctx).result == "succeeded"
    with Session(ctx.engine) as session:
        session.execute(update(Job).where(Job.id == r.job_id).values(pipeline_version="v-old"))
        session.commit()
        job = session.get(Job, r.job_id)
        document_id = job.document_id
    lexical.write_job(
        ctx.engine,
        dataset_id=job.dataset_id,
        document_id=document_id,
        job_id=r.job_id,
        rows=[lexical.Row("old-0", 0, 1, CELLS)],
    )
    return document_id


def test_the_changes_of_a_reindex_show_a_tables_rows_before_and_after(ctx):
    document_id = _built_by_an_older_parser(ctx)
    found = reindex_diff.changes(ctx, dataset="default")
    assert found.documents == 1
    [change] = found.sampled
    assert (change.document_id, change.from_version) == (document_id, "v-old")
    assert change.before == [CELLS]
    assert change.table_rows == (0, 4)  # the header and three rows, the rule not counted
    assert any("| Rotterdam | 469 | 42 |" in t for t in change.after)
    assert "table rows 0 -> 4" in change.describe()
    assert "1 of 1 sampled document(s) change; 1 gain table rows" in found.describe()


def test_the_integrity_page_compares_before_and_after_and_draws_the_table(ctx):
    _built_by_an_older_parser(ctx)
    at = open_console("integrity", query={"dataset": "default"})
    at.toggle(key="reindex_preview").set_value(True).run()
    assert_ok(at)
    page = texts(at)
    assert "1 of 1 sampled document(s) change" in page
    drawn = [m.value for m in at.markdown]
    assert any("| Rotterdam | 469 | 42 |" in m and "| --- |" in m for m in drawn), drawn
    assert any("Rotterdam  \n469" in m for m in drawn)  # today: one cell a line


def test_the_dry_run_says_what_changes(ctx, capsys):
    _built_by_an_older_parser(ctx)
    assert main(["reindex", "--all", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "ports.csv: 1 -> 1 chunks, table rows 0 -> 4" in out
