"""What keeps filtered search cheap as a dataset grows (BENCHMARKS.md, Cost against index size),
held on small real stores: the word index ranks only the documents a filter allows, in a fixed
number of statements; the dense ranker never counts the store, compares a few documents' chunks
exactly itself and still answers the best allowed chunks; new and existing collections search
with ``vectors.HNSW``'s ef_search.
Real Chroma server and job database (SQLite, and PostgreSQL where the SQL differs)."""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import event, text

from sluice.ops import dense
from sluice.ops import search as search_ops
from sluice.ops.ingest import ingest_bytes
from sluice.ops.search import search
from sluice.pipeline.running.runner import run_job
from sluice.storage import lexical
from sluice.storage.vectors import HNSW, VectorStore
from tests.support.helpers import collection, job

pytestmark = pytest.mark.servers

TOPICS = [
    "harbour",
    "orchard",
    "glacier",
    "meadow",
    "canyon",
    "lagoon",
    "tundra",
    "prairie",
    "estuary",
    "volcano",
]


def _body(topic: str, i: int, paragraphs: int = 8) -> bytes:
    """A document whose chunks share the word ``pelican`` and differ in everything else."""
    return "".join(
        f"{topic} {i} part {p}: pelican {topic} walk {p} on the {topic} shore, "
        f"{'pelican ' * (i + 1)}and more about {topic} {p}. " * 5 + "\n\n"
        for p in range(paragraphs)
    ).encode()


ALLOWED = ("orchard", "canyon", "estuary")  # the documents of team a


def _dataset(ctx, n: int = len(TOPICS)) -> dict[str, int]:
    """``n`` documents of several chunks each, indexed; {topic: document id}."""
    out = {}
    for i, topic in enumerate(TOPICS[:n]):
        team = {"team": "a" if topic in ALLOWED else "b"}
        r = ingest_bytes(
            ctx, _body(topic, i), dataset="default", filename=f"{topic}.txt", metadata=team
        )
        assert run_job(r.job_id, ctx=ctx).result == "succeeded"
        out[topic] = r.document_id
    return out


class Statements:
    """The SQL statements an engine runs while this is open."""

    def __init__(self, engine) -> None:
        self.engine, self.seen = engine, []

    def _record(self, conn, cursor, statement, parameters, context, executemany) -> None:
        self.seen.append((statement, parameters))

    def __enter__(self) -> Statements:
        event.listen(self.engine, "before_cursor_execute", self._record)
        return self

    def __exit__(self, *exc) -> None:
        event.remove(self.engine, "before_cursor_execute", self._record)


def test_a_filtered_word_search_ranks_only_the_allowed_documents_in_two_statements(
    database_url, ctx, monkeypatch
):
    """The filter narrows the ranking itself: one statement ranks the allowed documents' matches,
    one reads the best rows, however many other documents match and however low the allowed one
    ranks (before: the best few of every match were ranked, then filtered, then every match was
    counted and ranked again, deeper)."""
    monkeypatch.setattr(lexical, "CANDIDATES", 1)  # the first round as shallow as it goes
    docs = _dataset(ctx)
    ds_id = job(ctx, 1).dataset_id
    weakest = docs[TOPICS[0]]  # the fewest "pelican" per chunk: ranked last of all
    q = lexical.parse_query("pelican")
    with Statements(ctx.engine) as sql:
        hits = lexical.search(
            ctx.engine,
            dataset_id=ds_id,
            query=q,
            n=2,
            filters=lexical.Filters(document_ids=(weakest,)),
        )
    assert [h.document_id for h in hits] == [weakest, weakest]
    ranked = [s for s, _ in sql.seen if "MATCH" in s or "@@" in s]
    assert len(sql.seen) == 2 and len(ranked) == 1, [s for s, _ in sql.seen]
    assert "COUNT(" not in ranked[0].upper()
    unfiltered = lexical.search(ctx.engine, dataset_id=ds_id, query=q, n=200)
    assert weakest not in {h.document_id for h in unfiltered[:8]}  # it is the weakest indeed


def test_the_word_index_filter_is_a_list_lookup_not_rowid_seeks(ctx):
    """SQLite: the allowed rows' ids come from the document index alone (no table row read), and
    FTS5 walks its matches once, each looked up in that list. Without the unary + on rowid SQLite
    hands the list to FTS5 as rowids to seek one by one: at 100,000 chunks 0.9 s instead of 8 ms."""
    docs = _dataset(ctx, 3)
    ds_id = job(ctx, 1).dataset_id
    with Statements(ctx.engine) as sql:
        lexical.search(
            ctx.engine,
            dataset_id=ds_id,
            query=lexical.parse_query("pelican"),
            n=5,
            filters=lexical.Filters(document_ids=(docs["glacier"],)),
        )
    [(statement, params)] = [(s, p) for s, p in sql.seen if "MATCH" in s]
    with ctx.engine.connect() as conn:
        raw = conn.connection.driver_connection
        plan = [row[3] for row in raw.execute("EXPLAIN QUERY PLAN " + statement, params)]
    fts = lexical.fts_table(ds_id)
    assert f"SCAN {fts} VIRTUAL TABLE INDEX 0:M1" in plan, plan  # MATCH only, no rowid seeks
    assert any("COVERING INDEX ix_lexical_chunk_document" in step for step in plan), plan


def _exact_best(ctx, vector, allowed: set[int], k: int) -> list[str]:
    """The ``k`` stored chunks of the allowed documents' active jobs nearest the query vector,
    by exact cosine over every stored vector."""
    name = collection(ctx)
    ids, rows, metas = [], [], []
    for page in ctx.vectors.iter_pages(name, include=["embeddings", "metadatas"]):
        ids += page["ids"]
        rows += list(page["embeddings"])
        metas += page["metadatas"]
    m = np.asarray(rows, dtype=np.float32)
    sims = m @ vector / (np.linalg.norm(m, axis=1) * np.linalg.norm(vector))
    order = np.argsort(-sims, kind="stable")
    return [ids[i] for i in order if metas[i]["document_id"] in allowed][:k]


def _calls(monkeypatch) -> list[tuple[str, dict | None]]:
    """Every read of the vector store a search makes: (method, its where)."""
    seen: list[tuple[str, dict | None]] = []
    for name in ("query", "nearest", "count", "vectors_where", "get"):
        original = getattr(VectorStore, name, None)
        if original is None:
            continue

        def spy(self, *args, _name=name, _original=original, **kwargs):
            seen.append(
                (_name, kwargs.get("where") or (args[1] if _name == "vectors_where" else None))
            )
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(VectorStore, name, spy)
    return seen


def _filtered(where: dict | None) -> bool:
    return where is not None and "document_id" in str(where)


def test_a_dense_search_never_counts_the_store(database_url, ctx, monkeypatch):
    """An unfiltered dense search is one query of the store (before: a count first, 15 ms at
    100,000 chunks, more than the query): a query deeper than the collection answers all of it."""
    _dataset(ctx, 3)
    seen = _calls(monkeypatch)
    hits = search(ctx, query="pelican glacier shore", dataset="default", k=5, mode="dense")
    assert len(hits) == 5
    assert [name for name, _ in seen] == ["query"]
    many = search(ctx, query="pelican", dataset="default", k=500, mode="dense")
    with ctx.engine.connect() as conn:
        served = conn.execute(text("SELECT COUNT(*) FROM lexical_chunk")).scalar_one()
    assert len({h.chunk_id for h in many}) == len(many) == served  # all of it, once each


@pytest.mark.parametrize("path", ["exact", "screened", "too-few-screened", "chroma"])
def test_a_filtered_dense_search_answers_the_best_allowed_chunks_on_every_path(
    database_url, ctx, monkeypatch, path
):
    """A filter of a few chunks is applied by Sluice, their stored vectors compared exactly: the
    graph is not queried (Chroma's filtered query walks nearly all of it to find a few allowed
    chunks). A filter allowing a broad share of the dataset's chunks asks the graph unfiltered for
    ids alone, deep enough, and keeps the allowed ones (Chroma's filtered query reads every allowed
    id first); when fewer than asked are among them, Chroma's filtered query answers after all.
    Any other goes to Chroma as a ``where``. Each answers the best allowed chunks, as exact search
    over every stored vector ranks them."""
    docs = _dataset(ctx)
    allowed = {docs[t] for t in ALLOWED}
    if path != "exact":  # as a filter allowing more chunks than are compared exactly
        monkeypatch.setattr(dense, "EXACT_MAX", 0)
    if path == "chroma":  # as a share too small to screen
        monkeypatch.setattr(dense, "SCREEN_MAX", 0)
    if path == "too-few-screened":  # the nearest chunk alone: fewer allowed than asked
        monkeypatch.setattr(dense, "SCREEN_MIN", 1)
        monkeypatch.setattr(dense, "SCREEN_FACTOR", 0.001)
    seen = _calls(monkeypatch)
    query = "pelican shore walk orchard canyon"
    where = {"team": "a"}
    with Statements(ctx.engine) as statements:
        hits = search(ctx, query=query, dataset="default", k=6, mode="dense", where=where)
    vector = search_ops.query_vector(ctx, query)
    assert [h.chunk_id for h in hits] == _exact_best(ctx, vector, allowed, 6)
    if path != "exact":  # the dataset's served total, for the allowed share: its kept count,
        totals = [q for q, _ in statements.seen if "SUM(" in q]  # not a sum over its documents
        assert totals and all("FROM tally" in q and "job" not in q for q in totals), totals
    names = [name for name, _ in seen]
    filtered = [name for name, w in seen if name == "query" and _filtered(w)]
    if path == "exact":
        assert "query" not in names and names.count("vectors_where") == 1, names
    elif path == "screened":
        assert names.count("nearest") == 1 and "query" not in names, names
        assert names.count("get") == 1, names  # the kept chunks read once, in full
    elif path == "too-few-screened":
        assert names.count("nearest") == 1 and filtered == ["query"], names
    else:
        assert filtered == ["query"] and "nearest" not in names, names


def test_new_and_existing_collections_search_with_hnsw_ef_search(ctx, services):
    """A new collection is made with ``HNSW``'s ef_search (400: recall@10 0.9975 at 100,000
    chunks, 0.950 at Chroma's and Sluice's former 100); one made before with 100 is raised when a
    process opens it (Chroma applies it when its server next loads the collection)."""
    assert HNSW["ef_search"] == 400
    vectors = np.eye(3, 384, dtype=np.float32)
    rows = {"documents": ["a", "b", "c"], "metadatas": [{"position": i} for i in range(3)]}
    ctx.vectors.add("sluice-new-ef", ids=["x", "y", "z"], embeddings=vectors, **rows)
    made = ctx.vectors.client.get_collection("sluice-new-ef")
    assert made.configuration["hnsw"]["ef_search"] == 400
    old = ctx.vectors.client.get_or_create_collection(
        "sluice-old-ef",
        embedding_function=None,
        metadata={"hnsw:space": "cosine"},
        configuration={"hnsw": {**HNSW, "ef_search": 100}},
    )
    old.add(ids=["x", "y", "z"], embeddings=vectors, **rows)
    assert old.configuration["hnsw"]["ef_search"] == 100
    other = VectorStore(services.chroma.url)  # another process's first look at it
    assert len(list(other.iter_pages("sluice-old-ef"))) == 1
    again = ctx.vectors.client.get_collection("sluice-old-ef")
    assert again.configuration["hnsw"]["ef_search"] == 400
    assert again.configuration["hnsw"]["max_neighbors"] == HNSW["max_neighbors"]  # kept
    ctx.vectors.drop_collection("sluice-new-ef")
    ctx.vectors.drop_collection("sluice-old-ef")


def test_an_exact_read_that_selects_no_chunk_answers_empty(ctx):
    """A filter whose documents have no chunk in the store (all switched off, not yet indexed)
    reads no vector: the exact path answers nothing rather than failing to shape an empty array."""
    _dataset(ctx, 1)
    name = collection(ctx)
    ids, rows = ctx.vectors.vectors_where(name, {"document_id": {"$in": [10**9]}}, limit=10)
    assert ids == [] and rows.shape[0] == 0
    assert np.linalg.norm(rows, axis=1).shape == (0,)  # what the exact ranker computes next


SQLITE_DEFAULT_VARIABLES = 32_766  # what SQLite binds per statement in its default build
PSYCOPG_MAX_PARAMETERS = 65_535


def _bound_like_default_sqlite(engine) -> None:
    """Cap this engine's SQLite connections at the default build's bound parameters (this
    machine's Python may be built with more: Debian's binds 250,000)."""
    import sqlite3

    if engine.dialect.name != "sqlite":
        return

    def cap(dbapi_connection, _record) -> None:
        dbapi_connection.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, SQLITE_DEFAULT_VARIABLES)

    event.listen(engine, "connect", cap)
    engine.dispose()  # connections made before the cap go


@pytest.mark.parametrize("mode", ["lexical", "dense", "hybrid"])
def test_a_filter_allowing_more_documents_than_a_statement_binds_still_searches(
    database_url, ctx, mode
):
    """A metadata filter may allow more documents than the job database binds parameters in one
    statement (SQLite 32,766, psycopg 65,535): the allowed ids are never bound one parameter
    each, so the search answers (before: too many SQL variables)."""
    docs = _dataset(ctx, 3)
    _many_documents(ctx, job(ctx, 1).dataset_id, PSYCOPG_MAX_PARAMETERS + 100, {"team": "a"})
    _bound_like_default_sqlite(ctx.engine)
    hits = search(
        ctx, query="pelican orchard shore", dataset="default", k=5, mode=mode, where={"team": "a"}
    )
    assert hits and {h.document_id for h in hits} == {docs["orchard"]}


def _many_documents(ctx, ds_id: int, n: int, metadata: dict) -> None:
    from sqlalchemy import insert

    from sluice.storage.models import Document

    rows = [
        {
            "dataset_id": ds_id,
            "sha256": f"{i:064x}",
            "size": 1,
            "media_type": "text/plain",
            "filename": f"unindexed-{i}.txt",
            "blob_key": f"{i:064x}",
            "metadata": metadata,
        }
        for i in range(n)
    ]
    with ctx.engine.begin() as conn:  # documents without a job: allowed, listing nothing
        conn.execute(insert(Document), rows)


def test_the_api_jobs_list_filtered_by_metadata_allowing_more_documents_than_a_statement_binds(
    database_url, ctx
):
    """``GET /v1/jobs?where=...`` lists the jobs of the documents a filter allows; a broad filter
    in a large dataset allows more than a statement binds (before: too many SQL variables: 500)."""
    from sluice.api import scoped
    from sluice.ops.keys import ApiPrincipal
    from sluice.pipeline.running.context import set_context

    set_context(ctx)
    docs = _dataset(ctx, 3)
    ds_id = job(ctx, 1).dataset_id
    _many_documents(ctx, ds_id, PSYCOPG_MAX_PARAMETERS + 100, {"team": "a"})
    _bound_like_default_sqlite(ctx.engine)
    key = ApiPrincipal(0, "test", "read", False, frozenset({ds_id}))
    page = scoped.jobs(
        key, dataset="default", statuses=[], limit=10, cursor=None, where={"team": "a"}
    )
    assert [r["document_id"] for r in page.jobs] == [docs["orchard"]]
    team_b = scoped.jobs(
        key, dataset="default", statuses=[], limit=10, cursor=None, where={"team": "b"}
    )
    assert sorted(r["document_id"] for r in team_b.jobs) == [docs["harbour"], docs["glacier"]]


def test_hybrid_runs_its_two_rankers_at_once(ctx):
    """The dense ranker starts before the lexical one has answered (they are independent: a
    hybrid search costs the slower of the two, not both): the lexical ranker, held at its fault
    point until the dense one has begun, is let go (before: one after the other, so it waited
    for a dense ranker that never began)."""
    import threading

    from sluice import faults

    _dataset(ctx, 3)
    dense_began = threading.Event()
    waited = []

    def hold(ranker: str | None = None, **_) -> None:
        if ranker == "dense":
            dense_began.set()
        else:  # the lexical ranker has read: has the dense one begun meanwhile?
            waited.append(dense_began.wait(timeout=10))

    with faults.hook("search_between_rankers", hold):
        hits = search(ctx, query="pelican glacier shore", dataset="default", k=5, mode="hybrid")
    assert hits and waited == [True]


def test_a_hybrid_search_is_never_queued_behind_other_searches_dense_rankers(ctx):
    """Hybrid's dense rankers share a few threads. With every one of them held by another
    dataset's slow searches, a search runs its two rankers on its own thread and answers (before:
    it waited in the pool's queue until one of the slow searches let go)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from sluice import faults

    _dataset(ctx, 3)
    slow = ingest_bytes(ctx, _body("lagoon", 1), dataset="slow", filename="lagoon.txt")
    assert run_job(slow.job_id, ctx=ctx).result == "succeeded"
    held, arrived, let_go = search_ops.RANKER_THREADS, threading.Semaphore(0), threading.Event()

    def hold(dataset: str | None = None, ranker: str | None = None, **_) -> None:
        if dataset == "slow" and ranker == "dense":
            arrived.release()
            assert let_go.wait(timeout=60), "never let go"

    def slow_search() -> list:
        return search(ctx, query="pelican lagoon", dataset="slow", k=3, mode="hybrid")

    with faults.hook("search_between_rankers", hold), ThreadPoolExecutor(held) as callers:
        slows = [callers.submit(slow_search) for _ in range(held)]
        try:
            for _ in range(held):  # every dense thread is now held by a slow search
                assert arrived.acquire(timeout=30), "the slow searches did not all begin"
            with ThreadPoolExecutor(1) as mine:
                answered = mine.submit(
                    search, ctx, query="pelican glacier", dataset="default", k=5, mode="hybrid"
                )
                hits = answered.result(timeout=30)
        finally:
            let_go.set()
        assert all(s.result(timeout=60) for s in slows)
    assert hits and hits[0].filename == "glacier.txt"


def test_the_loose_match_of_a_large_dataset_leaves_out_words_most_chunks_hold(
    database_url, ctx, monkeypatch
):
    """A question no chunk holds every word of is matched loosely; a word every chunk holds made
    that rank the whole dataset (1 s p95 at 1,000,000 chunks: bench.lexical_scale). On SQLite,
    past ``COMMON_FLOOR``, the tokens at least half the chunks hold are left out (FTS5's BM25
    weighs them 1e-6): the chunks holding the other words answer, no chunk holding only them.
    PostgreSQL (no such weight, no row count short of a walk) keeps every token."""
    docs = _dataset(ctx, 4)  # "pelican" in every chunk, "glacier" in its own document's only
    pg = "postgres" in database_url
    with ctx.engine.connect() as conn:
        ds_id, rows = conn.execute(
            text("SELECT dataset_id, count(*) FROM lexical_chunk GROUP BY dataset_id")
        ).one()
        glacier = conn.execute(
            text("SELECT count(*) FROM lexical_chunk WHERE document_id = :d"),
            {"d": docs["glacier"]},
        ).scalar()
        if not pg:
            assert lexical._indexed(conn, ds_id) == rows
    question = lexical.parse_query("pelican glacier zebra")  # "zebra": in no chunk

    def loose(query):
        return lexical.search(ctx.engine, dataset_id=ds_id, query=query, n=40)

    small = loose(question)  # below the floor: every chunk holding any word may answer
    assert {h.document_id for h in small} == set(docs.values())
    monkeypatch.setattr(lexical, "COMMON_FLOOR", 1)
    hits = loose(question)
    assert not any(h.strict for h in hits)
    if pg:
        assert [h.chunk_id for h in hits] == [h.chunk_id for h in small]
        return
    assert {h.document_id for h in hits} == {docs["glacier"]} and len(hits) == glacier
    assert loose(lexical.parse_query("pelican zebra")) == []  # only a word most chunks hold


def test_sluice_jobs_filtered_by_metadata_allowing_more_documents_than_a_statement_binds(
    database_url, ctx, capsys
):
    """``sluice jobs --where`` (and the jobs page's count) filter by the documents a metadata
    filter allows; a broad filter in a large dataset allows more than a statement binds (before:
    too many SQL variables)."""
    import argparse
    import json

    from sluice.cli import commands
    from sluice.ops import reads
    from sluice.pipeline.running.context import set_context
    from sluice.storage.queries import JobFilter

    set_context(ctx)
    docs = _dataset(ctx, 3)
    ds_id = job(ctx, 1).dataset_id
    _many_documents(ctx, ds_id, PSYCOPG_MAX_PARAMETERS + 100, {"team": "a"})
    _bound_like_default_sqlite(ctx.engine)
    args = argparse.Namespace(dataset="default", status=None, where=["team=a"], limit=10, json=True)
    assert commands.jobs(args) == 0
    assert [r["document_id"] for r in json.loads(capsys.readouterr().out)] == [docs["orchard"]]
    allowed = reads.documents_matching(ds_id, {"team": "b"})
    f = JobFilter(dataset_id=ds_id, document_ids=allowed)
    page = reads.jobs_page(f, sort="created", descending=True, page=1, page_size=9)
    assert sorted(r["document_id"] for r in page.rows) == [docs["harbour"], docs["glacier"]]
