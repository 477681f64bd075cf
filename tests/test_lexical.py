"""The lexical index is part of the index: written with the vectors' chunk ids by the same job step,
removed by cancel, delete, supersede and reconcile repair, served only for each document's active
job; on SQLite (FTS5) and PostgreSQL (tsvector)."""

from sqlmodel import Session

from sluice.ops import reindex
from sluice.ops.documents import delete_document
from sluice.ops.ingest import ingest_bytes
from sluice.ops.search import search
from sluice.pipeline.reconcile.audit import reconcile
from sluice.pipeline.running.runner import run_job
from sluice.storage import jobs, lexical
from sluice.storage.models import Document, JobStatus
from tests.support.helpers import ids_of_job, job
from tests.test_reconcile import indexed, text

CODE = "QX-88412"


def coded(topic: str, code: str, paragraphs: int = 6) -> bytes:
    body = text(topic, paragraphs).decode()
    return (body + f"The reference for this file is {code} and nothing else.\n").encode()


def lexical_ids(ctx, job_id: int) -> list[str]:
    with ctx.engine.connect() as conn:
        from sqlalchemy import text as sql

        return sorted(
            r[0]
            for r in conn.execute(
                sql("SELECT chunk_id FROM lexical_chunk WHERE job_id = :j"), {"j": job_id}
            )
        )


def test_tokens_make_cjk_bigrams_and_keep_codes_as_phrases():
    assert lexical.tokens("Invoice QX-88412, Straße") == ["invoice", "qx", "88412", "straße"]
    assert lexical.tokens("東京タワー2024年") == ["東京", "京タ", "タワ", "ワー", "2024", "年"]
    q = lexical.parse_query('"exact words" QX-88412 猫')
    assert q.groups == (("exact", "words"), ("qx", "88412"), ("猫",))
    assert q.quoted == (("exact", "words"),)
    marked = lexical.snippet(
        "Pay QX-88412 today. 東京タワーは高い", lexical.parse_query("qx-88412 東京タワー")
    )
    assert marked == "Pay **QX**-**88412** today. **東京タワー**は高い"


def test_lexical_rows_follow_the_job_through_rerun_supersede_and_delete(database_url, make_ctx):
    ctx = make_ctx()
    done = indexed(ctx, ["harbour", "orchard"])
    r = ingest_bytes(ctx, coded("glacier", CODE), dataset="default", filename="glacier.txt")
    assert run_job(r.job_id, ctx=ctx).result == "succeeded"
    first = job(ctx, r.job_id)

    # Same ids as the vectors, one row per chunk.
    assert (
        lexical_ids(ctx, first.id) == ids_of_job(ctx, first.id)
        and len(lexical_ids(ctx, first.id)) > 1
    )
    [hit] = search(ctx, query=CODE, dataset="default", k=1, mode="lexical")
    assert (hit.job_id, hit.filename, hit.matched) == (first.id, "glacier.txt", ["lexical"])
    assert "**QX**-**88412**" in hit.snippet

    # A re-run writes the same ids again, no more.
    with Session(ctx.engine) as session:
        assert jobs.reindex(session=session, job_ids=[first.id], actor="test")[0].ok
    assert run_job(first.id, ctx=ctx).result == "succeeded"
    assert lexical_ids(ctx, first.id) == ids_of_job(ctx, first.id)

    # A new pipeline version supersedes: its rows replace the old job's.
    newer = make_ctx(SLUICE_CHUNK_SIZE="400")
    queued = {x.job_id for x in reindex.reindex_all(newer, actor="test").results}
    for jid in queued:
        assert run_job(jid, ctx=newer).result == "succeeded"
    assert job(newer, first.id).status == JobStatus.superseded
    assert lexical_ids(newer, first.id) == []
    assert all(lexical_ids(newer, j.id) == [] for j in done.values())
    [hit] = search(newer, query=CODE, dataset="default", k=1, mode="lexical")
    assert hit.job_id in queued and hit.job_id != first.id
    assert reconcile(newer).clean

    # Delete: its rows go, search finds nothing.
    assert delete_document(newer, hit.document_id, actor="test").ok
    assert lexical_ids(newer, hit.job_id) == []
    assert search(newer, query=CODE, dataset="default", k=3, mode="lexical") == []


def test_cancel_of_a_running_job_after_its_rows_were_written_removes_them(
    database_url, make_ctx, monkeypatch
):
    ctx = make_ctx()
    r = ingest_bytes(ctx, coded("meadow", CODE), dataset="default", filename="meadow.txt")
    write = lexical.write_job

    def write_then_cancel(*args, **kwargs):  # the operator cancels right after the rows are in
        n = write(*args, **kwargs)
        with Session(ctx.engine) as session:
            assert jobs.request_cancel(session=session, job_ids=[kwargs["job_id"]], actor="test")[
                0
            ].ok
        return n

    monkeypatch.setattr(lexical, "write_job", write_then_cancel)
    assert run_job(r.job_id, ctx=ctx).result == "cancelled"
    assert lexical_ids(ctx, r.job_id) == [] and ids_of_job(ctx, r.job_id) == []


def test_rows_of_an_unfinished_job_are_not_served_and_reconcile_removes_them(
    database_url, make_ctx, monkeypatch
):
    ctx = make_ctx()
    served = ingest_bytes(ctx, coded("meadow", CODE), dataset="default", filename="meadow.txt")
    assert run_job(served.job_id, ctx=ctx).result == "succeeded"
    other = ingest_bytes(ctx, coded("lagoon", "ZZ-55120"), dataset="default", filename="lagoon.txt")
    monkeypatch.setenv("SLUICE_FAULTS", "after_index=transient")
    assert run_job(other.job_id, ctx=ctx).result == "retrying"
    monkeypatch.delenv("SLUICE_FAULTS")

    assert lexical_ids(ctx, other.job_id)  # written, but its job is not the document's active one
    assert search(ctx, query="ZZ-55120", dataset="default", k=3, mode="lexical") == []
    assert search(ctx, query="ZZ-55120", dataset="default", k=3, mode="hybrid") == [] or all(
        h.job_id == served.job_id for h in search(ctx, query="ZZ-55120", dataset="default", k=3)
    )

    # Cancelled while it waits for its retry: its rows are orphans that reconcile finds and removes.
    with Session(ctx.engine) as session:
        assert jobs.request_cancel(session=session, job_ids=[other.job_id], actor="test")[0].ok
    report = reconcile(ctx)
    summary = report.datasets[0]
    assert summary.lexical_orphans == len(lexical_ids(ctx, other.job_id)) > 0
    reconcile(ctx, repair=True, actor="test")
    assert lexical_ids(ctx, other.job_id) == []
    assert [h.job_id for h in search(ctx, query=CODE, dataset="default", k=3, mode="lexical")] == [
        served.job_id
    ]
    assert reconcile(ctx).clean


def test_reconcile_finds_and_repairs_lexical_rows_deleted_altered_and_added_by_hand(
    database_url, ctx
):
    from sqlalchemy import text as sql

    done = indexed(ctx, ["harbour", "orchard", "glacier"])
    harbour, orchard, glacier = done["harbour"], done["orchard"], done["glacier"]
    gone = lexical_ids(ctx, harbour.id)[1]
    tampered = lexical_ids(ctx, orchard.id)[2]
    with ctx.engine.begin() as conn:
        conn.execute(sql("DELETE FROM lexical_chunk WHERE chunk_id = :c"), {"c": gone})
        conn.execute(
            sql("UPDATE lexical_chunk SET document_id = :d WHERE chunk_id = :c"),
            {"d": glacier.document_id, "c": tampered},
        )
        dataset_id = conn.execute(sql("SELECT dataset_id FROM lexical_chunk LIMIT 1")).scalar_one()
    lexical.write_job(
        ctx.engine,
        dataset_id=dataset_id,
        document_id=99999,
        job_id=99999,
        rows=[lexical.Row("stray-000001", 0, 1, "stray words")],
    )

    report = reconcile(ctx)
    s = report.datasets[0]
    assert (s.lexical_missing, s.lexical_orphans, s.lexical_mismatched) == (1, 1, 1)
    assert not report.clean and (s.missing, s.orphans, s.mismatched) == (
        0,
        0,
        0,
    )  # the vectors are fine
    by_doc = {f.document_id: f for f in report.findings}
    assert by_doc[harbour.document_id].lexical["missing"] == 1

    repaired = reconcile(ctx, repair=True, actor="test")
    assert repaired.queued == [harbour.id]
    assert run_job(harbour.id, ctx=ctx).result == "succeeded"
    assert gone in lexical_ids(ctx, harbour.id)
    assert lexical_ids(ctx, 99999) == []
    assert tampered in lexical_ids(ctx, orchard.id)
    assert reconcile(ctx).clean


def test_a_switch_between_the_two_rankers_never_answers_two_versions_of_a_document(
    make_ctx, monkeypatch
):
    old = make_ctx()
    r = ingest_bytes(old, coded("glacier", CODE), dataset="default", filename="glacier.txt")
    assert run_job(r.job_id, ctx=old).result == "succeeded"
    new = make_ctx(SLUICE_CHUNK_SIZE="400")
    [queued] = reindex.reindex_all(new, actor="test").results
    monkeypatch.setenv(
        "SLUICE_FAULTS", "after_index=transient"
    )  # both stores hold the new version, not active
    assert run_job(queued.job_id, ctx=new).result == "retrying"
    monkeypatch.delenv("SLUICE_FAULTS")
    ranked = lexical.search

    def then_switch(*args, **kwargs):  # the new version becomes active right after the lexical read
        hits = ranked(*args, **kwargs)
        with Session(new.engine) as session:
            doc = session.get(Document, r.document_id)
            doc.active_job_id = queued.job_id
            session.add(doc)
            session.commit()
        return hits

    monkeypatch.setattr(lexical, "search", then_switch)
    hits = search(new, query=f"glacier {CODE}", dataset="default", k=10)
    assert hits and {h.job_id for h in hits} == {queued.job_id}


def test_filters_and_inactive_jobs_never_crowd_out_a_match(database_url, ctx, monkeypatch):
    monkeypatch.setattr(
        lexical, "CANDIDATES", 1
    )  # SQLite ranks the best few first, then asks for more
    for i in range(6):
        body = (
            f"Pelican sighting number {i} near the pier. " * (6 - i)
            + "Other words about the weather. " * 20
        )
        r = ingest_bytes(ctx, body.encode(), dataset="default", filename=f"doc-{i}.txt")
        assert run_job(r.job_id, ctx=ctx).result == "succeeded"
    ds_id = job(ctx, r.job_id).dataset_id
    q = lexical.parse_query("pelican")
    [hit] = lexical.search(
        ctx.engine, dataset_id=ds_id, query=q, n=1, filters=lexical.Filters(filename="doc-5")
    )
    assert hit.filename == "doc-5.txt"
    assert [h.filename for h in lexical.search(ctx.engine, dataset_id=ds_id, query=q, n=1)] == [
        "doc-0.txt"
    ]


def _answers(ctx, queries, dataset, mode):
    return {
        q: [
            (h.chunk_id, round(h.score, 9))
            for h in search(ctx, query=q, dataset=dataset, k=5, mode=mode)
        ]
        for q in queries
    }


def test_what_a_dataset_ranks_does_not_depend_on_another_datasets_words(database_url, make_ctx):
    """BM25 reads its statistics from the table it ranks in: a probe word's score in A must be the
    same whether B is empty or holds that word in every file (before: one table for all datasets,
    so B's content moved A's scores and told A's key which words and phrases B holds)."""
    ctx = make_ctx()
    for i, topic in enumerate(["harbour", "orchard", "glacier"]):
        body = coded(topic, f"QX-{i}0001", paragraphs=2) + b"the quarterly tariff memo\n"
        done = ingest_bytes(ctx, body, dataset="team-a", filename=f"a{i}.txt")
        assert run_job(done.job_id, ctx=ctx).result == "succeeded"
    probes = ["tariff", "quarterly tariff", '"quarterly tariff memo"', "harbour tariff", "QX-00001"]
    before = {mode: _answers(ctx, probes, "team-a", mode) for mode in ("lexical", "hybrid")}
    assert all(before["lexical"][q] for q in probes)

    for i in range(6):  # B holds the probe words, often and rarely, and a phrase A's key guesses
        body = (f"tariff tariff tariff memo {i} " * (i + 1)).encode() + b"quarterly tariff memo\n"
        done = ingest_bytes(ctx, body, dataset="team-b", filename=f"b{i}.txt")
        assert run_job(done.job_id, ctx=ctx).result == "succeeded"
    after = {mode: _answers(ctx, probes, "team-a", mode) for mode in ("lexical", "hybrid")}
    assert after == before


def test_an_older_databases_shared_word_index_is_split_by_dataset(tmp_path, monkeypatch, make_ctx):
    """A database of an older Sluice had one full-text table for all datasets: opening it moves each
    dataset's rows to a table of its own, and search finds them as before."""
    from sqlalchemy import create_engine
    from sqlalchemy import text as sql

    from sluice.storage.db import dispose_engines

    ctx = make_ctx()
    assert ctx.engine.dialect.name == "sqlite"
    done = ingest_bytes(ctx, coded("glacier", CODE), dataset="default", filename="glacier.txt")
    assert run_job(done.job_id, ctx=ctx).result == "succeeded"
    url = str(ctx.engine.url)
    with ctx.engine.begin() as conn:  # what the older schema looked like
        dataset_id = conn.execute(sql("SELECT DISTINCT dataset_id FROM lexical_chunk")).scalar_one()
        conn.execute(sql(f"DROP TABLE {lexical.fts_table(dataset_id)}"))
        for suffix in ("ai", "ad", "au"):
            conn.execute(sql(f"DROP TRIGGER lexical_chunk_{suffix}_{dataset_id}"))
        conn.execute(
            sql(
                "CREATE VIRTUAL TABLE lexical_fts USING fts5(terms, content='lexical_chunk', "
                "content_rowid='id', tokenize='unicode61 remove_diacritics 0')"
            )
        )
        conn.execute(sql("INSERT INTO lexical_fts(lexical_fts) VALUES ('rebuild')"))
    dispose_engines()
    lexical.init_schema(create_engine(url))
    ctx = make_ctx()
    [hit] = search(ctx, query=CODE, dataset="default", k=1, mode="lexical")
    assert hit.filename == "glacier.txt"
    with ctx.engine.connect() as conn:
        tables = set(
            conn.execute(sql("SELECT name FROM sqlite_master WHERE type = 'table'")).scalars()
        )
    assert "lexical_fts" not in tables and lexical.fts_table(dataset_id) in tables
