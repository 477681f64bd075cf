"""Document metadata and the filters over it: one validator for every front end, filters that
select before ranking in every search mode (k hits when k exist), a change that is atomic for a
concurrent searcher (forced at a fault point between the rewrite steps), and reconcile keeping the
chunks' copies true."""

from __future__ import annotations

import pytest
from sqlmodel import Session, select

from sluice import faults
from sluice.ops import metadata as meta
from sluice.ops.ingest import ingest_bytes
from sluice.ops.search import search
from sluice.pipeline.reconcile.audit import reconcile
from sluice.pipeline.running import chunk_copies
from sluice.pipeline.running.runner import run_job
from sluice.storage.models import Document
from tests.support.helpers import collection, ids_of_job, job
from tests.test_reconcile import text

MODES = ("dense", "lexical", "hybrid")


def upload(ctx, topic: str, metadata: dict | None, paragraphs: int = 6):
    body = text("harbour", paragraphs) + f"\n\nThis copy is about {topic}.\n".encode()
    r = ingest_bytes(ctx, body, dataset="default", filename=f"{topic}.txt", metadata=metadata)
    assert r.accepted, r.message
    assert run_job(r.job_id, ctx=ctx).result == "succeeded"
    return job(ctx, r.job_id)


def copies(ctx, job_id: int) -> dict[str, dict]:
    """The meta_ fields each chunk of a job carries in the vector store."""
    got = ctx.vectors.get(collection(ctx), ids_of_job(ctx, job_id))
    return {
        cid: {k: v for k, v in (m or {}).items() if k.startswith("meta_")}
        for cid, m in zip(got["ids"], got["metadatas"], strict=True)
    }


# --- the validator and the filter language --------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "key"),
    [
        ({"Lang": "de"}, "Lang"),
        ({"_owner": "x"}, "_owner"),
        ({"9lives": 1}, "9lives"),
        ({"a" * 65: 1}, "a" * 65),
        ({"tags": ["a", 2]}, "tags"),
        ({"nested": {"a": 1}}, "nested"),
        ({"none": None}, "none"),
        ({"big": "x" * 9000}, ""),
    ],
)
def test_the_validator_names_the_key_at_fault(value, key):
    with pytest.raises(meta.MetadataError) as err:
        meta.validate(value)
    assert err.value.key == key and err.value.code == "invalid_metadata"


def test_the_validator_keeps_what_is_allowed():
    ok = {"lang": "de", "year": 2021, "score": 0.5, "draft": False, "team": ["a", "b"], "x_1": []}
    assert meta.validate(ok) == ok
    assert meta.parse_pairs(["year=2021", "draft=true", 'team=["a"]', "lang=de", "note=a b"]) == {
        "year": 2021,
        "draft": True,
        "team": ["a"],
        "lang": "de",
        "note": "a b",
    }
    with pytest.raises(meta.MetadataError):
        meta.parse_pairs(["novalue"])
    with pytest.raises(meta.MetadataError):
        meta.parse_json("{not json")


DOCS = {
    "a": {"lang": "de", "year": 2019, "team": ["red", "blue"], "until": "2024-05-01"},
    "b": {"lang": "en", "year": 2021, "team": ["blue"], "until": "2025-01-10T08:00:00Z"},
    "c": {"lang": "en", "year": 2023.5, "draft": True},
    "d": {},
}


@pytest.mark.parametrize(
    ("where", "want"),
    [
        ({"lang": "de"}, "a"),
        ({"lang": {"$eq": "en"}}, "bc"),
        ({"lang": {"$ne": "en"}}, "ad"),
        ({"lang": {"$in": ["de", "fr"]}}, "a"),
        ({"lang": {"$nin": ["de"]}}, "bcd"),
        ({"year": {"$gt": 2019}}, "bc"),
        ({"year": {"$gte": 2021}}, "bc"),
        ({"year": {"$lt": 2021}}, "a"),
        ({"year": {"$lte": 2021}}, "ab"),
        ({"draft": {"$exists": True}}, "c"),
        ({"draft": {"$exists": False}}, "abd"),
        ({"team": "blue"}, "ab"),
        ({"team": {"$in": ["red", "green"]}}, "a"),
        ({"team": {"$nin": ["red"]}}, "bcd"),
        ({"until": {"$gte": "2024-06-01"}}, "b"),
        ({"until": {"$lt": "2025-01-10T09:00:00+00:00"}}, "ab"),
        ({"lang": "en", "year": {"$gt": 2022}}, "c"),
        ({"$and": [{"lang": "en"}, {"team": "blue"}]}, "b"),
        ({"year": {"$gte": 2019, "$lt": 2023}}, "ab"),
        ({"draft": True}, "c"),
        ({"draft": 1}, ""),
    ],
)
def test_each_operator(where, want):
    conditions = meta.parse_where(where)
    assert "".join(n for n, m in DOCS.items() if meta.matches(conditions, m)) == want


@pytest.mark.parametrize(
    ("where", "key"),
    [
        ({"lang": {"$like": "d%"}}, "$like"),
        ({"year": {"$gt": "soon"}}, "year"),
        ({"team": {"$in": "red"}}, "team"),
        ({"team": {"$in": []}}, "team"),
        ({"draft": {"$exists": "yes"}}, "draft"),
        ({"Bad-Key": 1}, "Bad-Key"),
        ({"$or": []}, "$or"),
        ({"$or": [{"a": {"$like": 1}}]}, "$like"),
        ({"lang": {}}, "lang"),
        ({"lang": ["de"]}, "lang"),
        ("lang=de", ""),
    ],
)
def test_a_bad_filter_names_its_key_or_operator(where, key):
    with pytest.raises(meta.FilterError) as err:
        meta.parse_where(where)
    assert err.value.key == key and err.value.code == "invalid_filter"


def test_the_command_line_filter_forms():
    assert meta.parse_cli_where(
        ["lang=de", "year>=2020", "n<3", "team~a,b", "x!~c", "k?", "j!?"]
    ) == {
        "$and": [
            {"lang": {"$eq": "de"}},
            {"year": {"$gte": 2020}},
            {"n": {"$lt": 3}},
            {"team": {"$in": ["a", "b"]}},
            {"x": {"$nin": ["c"]}},
            {"k": {"$exists": True}},
            {"j": {"$exists": False}},
        ]
    }
    assert meta.parse_cli_where(["lang!=de"]) == {"lang": {"$ne": "de"}}
    for bad in ("lang", "Lang=de", "year>=soon", "k?x"):
        with pytest.raises(meta.FilterError):
            meta.parse_cli_where([bad])


# --- search ---------------------------------------------------------------------------------------


def test_a_filter_selects_before_ranking_in_every_mode(database_url, make_ctx):
    ctx = make_ctx()
    # Many chunks that do not match, ranked above the few that do: a filter applied after ranking
    # the top candidates would return fewer than k.
    others = [upload(ctx, f"pier {i}", {"lang": "en", "year": 2010 + i}, 8) for i in range(4)]
    wanted = upload(ctx, "glacier", {"lang": "de", "year": 2022, "team": ["ice"]}, 2)
    assert sum(j.chunk_count for j in others) > 25 and wanted.chunk_count >= 2
    assert copies(ctx, wanted.id) and all(
        c == {"meta_lang": "de", "meta_year": 2022, "meta_team": ["ice"]}
        for c in copies(ctx, wanted.id).values()
    )
    k = wanted.chunk_count
    for mode in MODES:
        for where in ({"lang": "de"}, {"team": "ice"}, {"year": {"$gte": 2022}}):
            hits = search(
                ctx, query="harbour section", dataset="default", k=k, mode=mode, where=where
            )
            assert len(hits) == k, (mode, where)
            assert {h.document_id for h in hits} == {wanted.document_id}
        # more than exist: exactly the matching ones
        hits = search(
            ctx, query="harbour", dataset="default", k=50, mode=mode, where={"lang": "de"}
        )
        assert sorted(h.chunk_id for h in hits) == sorted(ids_of_job(ctx, wanted.id))
        two = search(
            ctx, query="harbour", dataset="default", k=500, mode=mode, where={"year": {"$lt": 2012}}
        )
        assert {h.document_id for h in two} == {others[0].document_id, others[1].document_id}
        assert len(two) == others[0].chunk_count + others[1].chunk_count
        assert search(ctx, query="harbour", dataset="default", k=5, mode=mode, where={"x": 1}) == []
    with pytest.raises(meta.FilterError):
        search(ctx, query="harbour", dataset="default", where={"year": {"$gt": "soon"}})
    refused = ingest_bytes(
        ctx, b"a few words", dataset="default", filename="x.txt", metadata={"_x": 1}
    )
    assert (refused.accepted, refused.error_code) == (False, "invalid_metadata")
    assert "'_x'" in refused.message


def test_a_metadata_change_is_atomic_for_a_concurrent_searcher(database_url, make_ctx, monkeypatch):
    ctx = make_ctx()
    upload(ctx, "pier", {"lang": "en"}, 4)
    target = upload(ctx, "glacier", {"lang": "en", "year": 2020}, 6)
    n = target.chunk_count
    all_ids = sorted(ids_of_job(ctx, target.id))
    with Session(ctx.engine) as session:
        vectors_before = ctx.vectors.get(collection(ctx), all_ids, include=["embeddings"])
        attempts_before = session.get(type(target), target.id).attempt
    monkeypatch.setattr(chunk_copies, "REWRITE_BATCH", 2)  # several rewrite steps, a window each
    seen: list[dict] = []

    def searcher(document_id, done):
        # Half the chunks' copies are rewritten: the store itself is half changed right now...
        carried = [c.get("meta_lang") for c in copies(ctx, target.id).values()]
        assert "de" in carried and "en" in carried
        # ...and yet every mode sees the document whole under the new metadata, and not at all
        # under the old.
        for mode in MODES:
            new = search(
                ctx, query="harbour", dataset="default", k=100, mode=mode, where={"lang": "de"}
            )
            old = search(
                ctx,
                query="harbour",
                dataset="default",
                k=100,
                mode=mode,
                where={"lang": "en", "year": 2020},
            )
            seen.append({"mode": mode, "new": len(new), "old": len(old)})
            assert sorted(h.chunk_id for h in new) == all_ids
            assert old == []

    with faults.hook("metadata_rewrite_batch", searcher):
        stored = meta.set_document_metadata(ctx, target.document_id, {"lang": "de"}, actor="test")
    assert stored == {"lang": "de"}
    assert len(seen) == 3 * ((n - 1) // 2) and seen  # the window was hit, in every mode
    # The copies are all rewritten (year gone), the vectors untouched, nothing embedded again.
    assert all(c == {"meta_lang": "de"} for c in copies(ctx, target.id).values())
    after = ctx.vectors.get(collection(ctx), all_ids, include=["embeddings"])
    assert (after["embeddings"] == vectors_before["embeddings"]).all()
    with Session(ctx.engine) as session:
        assert session.get(type(target), target.id).attempt == attempts_before
        assert session.get(Document, target.document_id).metadata_ == {"lang": "de"}
    report = reconcile(ctx, save=False)
    assert report.clean, report.describe()


def test_reconcile_finds_and_repairs_a_copy_left_behind(database_url, make_ctx):
    ctx = make_ctx()
    done = upload(ctx, "glacier", {"lang": "en", "team": ["a"]}, 4)
    coll = ctx.vectors.collection(collection(ctx))
    [first, *_] = sorted(ids_of_job(ctx, done.id))
    coll.update(ids=[first], metadatas=[{"meta_lang": "xx", "meta_team": None, "meta_odd": 1}])
    report = reconcile(ctx, save=False)
    assert not report.clean and report.datasets[0].mismatched == 1
    [finding] = report.findings
    assert finding.mismatches[0]["fields"] == {
        "meta_lang": ["xx", "en"],
        "meta_odd": [1, None],
        "meta_team": [None, ["a"]],
    }
    reconcile(ctx, repair=True, save=False)
    assert copies(ctx, done.id)[first] == {"meta_lang": "en", "meta_team": ["a"]}
    assert reconcile(ctx, save=False).clean


EXTRA = {  # values the database's JSON functions could take for the filter's strings
    "e": {"lang": 1, "team": "1"},
    "f": {"lang": ["en", "de"], "year": "2021"},
    "g": {"lang": 'd"e', "team": [1, "red"]},
    "h": {"lang": True, "draft": "true"},
    "i": None,
}
NARROWED = [
    {"lang": "de"},
    {"lang": {"$in": ["de", "fr", 'd"e']}},
    {"team": "red"},
    {"team": "1"},
    {"year": "2021"},
    {"draft": "true"},
    {"lang": "en", "team": "blue"},
    {"lang": {"$in": ["en"]}, "year": {"$gt": 2020}},
    {"$or": [{"lang": "de"}, {"team": "blue"}]},
    {"lang": {"$ne": "en"}},
]


@pytest.mark.parametrize("where", NARROWED)
def test_the_database_narrows_the_documents_as_the_filter_would(database_url, make_ctx, where):
    """``matching_documents`` lets the job database keep only documents whose value (or a list)
    can pass a string equality or membership, and checks those in Python: it answers what the
    filter alone does over every document, on SQLite's JSON functions and PostgreSQL's alike, and
    decodes only the documents it kept (before: every document of the dataset, 15 ms a search at
    1,000 documents)."""
    from sqlalchemy import insert

    ctx = make_ctx()
    every = {**DOCS, **EXTRA}
    with Session(ctx.engine) as session:
        ds = meta_dataset(session)
    with ctx.engine.begin() as conn:
        for n, (name, m) in enumerate(every.items()):
            conn.execute(
                insert(Document).values(
                    dataset_id=ds,
                    sha256=f"{n:064x}",
                    size=1,
                    media_type="text/plain",
                    filename=f"{name}.txt",
                    blob_key=f"{n:064x}",
                    metadata=m,
                )
            )
    conditions = meta.parse_where(where)
    checked = []
    original = meta.matches

    def counting(where_, metadata):
        checked.append(metadata)
        return original(where_, metadata)

    with Session(ctx.engine) as session:
        names = {d.id: d.filename[0] for d in session.exec(select(Document)).all()}
        meta.matches = counting
        try:
            got = meta.matching_documents(session, ds, conditions)
        finally:
            meta.matches = original
    want = "".join(n for n, m in every.items() if meta.matches(conditions, m))
    assert "".join(sorted(names[d] for d in got)) == want
    simple = all(isinstance(c, meta.Condition) and c.op in ("$eq", "$in") for c in conditions)
    if simple:  # only candidates decoded: those it keeps, lists, and what a string may equal
        assert len(checked) <= len(want) + 4, (want, checked)


def meta_dataset(session: Session) -> int:
    from sluice.storage.models import Dataset

    ds = Dataset(name="narrowed", collection="sluice-narrowed")
    session.add(ds)
    session.commit()
    return int(ds.id)
