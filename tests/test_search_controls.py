"""Search controls (issue 42 item 1): ``min_score`` on one documented 0..1 scale per mode,
``max_chunks_per_document``, hybrid's ``dense_weight`` and ``$or`` in ``where``, through the ops
layer, the real API (uvicorn in this process, SQLite and PostgreSQL), ``sluice search`` and the
console's Search and Hit testing pages, which show the API's hits for the same request."""

from __future__ import annotations

import json

import httpx
import pytest

from sluice.cli.main import main
from sluice.ops import metadata as meta
from sluice.ops.ingest import ingest_bytes
from sluice.ops.search import (
    LEXICAL_HALF,
    RRF_K,
    STRICT_WEIGHT,
    BadQuery,
    search,
)
from sluice.pipeline.running.runner import run_job
from tests.support.api_server import InProcessApi, auth, make_key
from tests.support.apptest import open_console

# One long document whose every chunk holds the query's words, and three short ones.
LONG = "".join(
    f"Lighthouse keeper log {i}: the lighthouse keeper trimmed the lighthouse lamp again. " * 3
    + "\n\n"
    for i in range(40)
)
SHORT = {
    "keeper.txt": ("The lighthouse keeper rowed to the harbour at dawn. " * 4, {"lang": "de"}),
    "harbour.txt": ("A harbour wall and one lighthouse shelter boats. " * 4, {"year": 2024}),
    "orchard.txt": ("Orchards of the valley bloom in spring, apples ripen. " * 4, {"lang": "fr"}),
}


def _seed(ctx) -> dict[str, int]:
    """The four documents indexed; file name -> document id."""
    ids = {}
    files = {"long.txt": (LONG, {"lang": "en"}), **SHORT}
    for name, (body, metadata) in files.items():
        r = ingest_bytes(ctx, body.encode(), dataset="default", filename=name, metadata=metadata)
        assert run_job(r.job_id, ctx=ctx).result == "succeeded"
        ids[name] = r.document_id
    return ids


@pytest.fixture
def seeded(make_ctx):
    ctx = make_ctx(SLUICE_CHUNK_SIZE="200", SLUICE_CHUNK_OVERLAP="0")
    return ctx, _seed(ctx)


def _ids(hits) -> list[str]:
    return [h.chunk_id for h in hits]


def test_scores_are_on_the_documented_zero_to_one_scale_and_min_score_means_it(seeded):
    ctx, _ = seeded
    q = "keeper harbour dawn"
    for mode in ("dense", "lexical", "hybrid"):
        every = search(ctx, query=q, dataset="default", k=30, mode=mode)
        assert every and all(0 <= h.score <= 1 for h in every), mode
        assert [h.score for h in every] == sorted((h.score for h in every), reverse=True)
        for h in every:  # each mode's documented formula
            if mode == "dense":
                assert h.score == round(max(h.similarity or 0.0, 0.0), 4)
            elif mode == "lexical":
                raw = h.lexical_score or 0.0
                assert h.score == pytest.approx(raw / (raw + LEXICAL_HALF["sqlite"]), abs=1e-4)
        assert every[-1].score < every[0].score
        threshold = round((every[0].score + every[-1].score) / 2, 4)
        kept = search(ctx, query=q, dataset="default", k=30, mode=mode, min_score=threshold)
        # a threshold filters after scoring: exactly the hits scoring at least it, fewer than k
        assert _ids(kept) == [h.chunk_id for h in every if h.score >= threshold], mode
        assert 0 < len(kept) < len(every)
    # hybrid: 1 is the best the fusion can give, rank 1 in both rankers with every word held
    # (every word held: a strict lexical hit); the score is the fused one over that best
    best = (1 + STRICT_WEIGHT) / (RRF_K + 1)
    for h in search(ctx, query="lighthouse keeper", dataset="default", k=10, mode="hybrid"):
        fused = sum(
            w / (RRF_K + r)
            for w, r in ((1, h.dense_rank), (STRICT_WEIGHT, h.lexical_rank))
            if r is not None
        )
        assert h.score == pytest.approx(fused / best, abs=1e-4)
        assert h.score < 1 or (h.dense_rank, h.lexical_rank) == (1, 1)
    assert search(ctx, query="apples", dataset="default", k=5, mode="dense", min_score=0.99) == []
    assert RRF_K > 0 and STRICT_WEIGHT > 1  # the constants docs/api.md names


def test_max_chunks_per_document_caps_each_document_and_still_fills_k(seeded):
    ctx, ids = seeded
    for mode in ("dense", "lexical", "hybrid"):
        plain = search(ctx, query="lighthouse keeper", dataset="default", k=3, mode=mode)
        assert {h.document_id for h in plain} == {ids["long.txt"]}, mode  # one document crowds
        capped = search(
            ctx,
            query="lighthouse keeper",
            dataset="default",
            k=3,
            mode=mode,
            max_chunks_per_document=1,
        )
        docs = [h.document_id for h in capped]
        # the rankers looked past the long document's chunks for the others' (lexically, only
        # keeper.txt holds both words besides it: fewer than k come when no more exist)
        holders = 2 if mode == "lexical" else 3
        assert len(docs) == len(set(docs)) == holders, mode
        assert ids["long.txt"] in docs and ids["keeper.txt"] in docs
        two = search(
            ctx, query="lighthouse", dataset="default", k=60, mode=mode, max_chunks_per_document=2
        )
        per_doc = [sum(h.document_id == d for h in two) for d in ids.values()]
        assert max(per_doc) == 2, mode


def _order(hits, score: str) -> list:
    """The ranker's scores in order, and the chunk of each score no other hit shares (chunks of
    the same text tie, and a ranker may answer tied ones in any order)."""
    values = [getattr(h, score) for h in hits]
    return [
        (v, h.chunk_id if values.count(v) == 1 else None) for v, h in zip(values, hits, strict=True)
    ]


def test_dense_weight_zero_and_one_give_the_lexical_and_the_dense_order(seeded):
    ctx, _ = seeded
    for q in ("lighthouse keeper", "harbour boats"):
        lexical = search(ctx, query=q, dataset="default", k=8, mode="lexical")
        dense = search(ctx, query=q, dataset="default", k=8, mode="dense")
        words = search(ctx, query=q, dataset="default", k=8, mode="hybrid", dense_weight=0)
        meaning = search(ctx, query=q, dataset="default", k=8, mode="hybrid", dense_weight=1)
        assert _order(words, "lexical_score") == _order(lexical, "lexical_score")
        assert _order(meaning, "similarity") == _order(dense, "similarity")
        even = search(ctx, query=q, dataset="default", k=8, mode="hybrid")
        assert even == search(ctx, query=q, dataset="default", k=8, dense_weight=0.5)
    with pytest.raises(BadQuery):
        search(ctx, query="x", dataset="default", dense_weight=1.5)
    with pytest.raises(BadQuery):
        search(ctx, query="x", dataset="default", min_score=-0.1)
    with pytest.raises(BadQuery):
        search(ctx, query="x", dataset="default", max_chunks_per_document=0)


def test_or_filters_parse_nest_and_match():
    where = {"$or": [{"lang": "de"}, {"year": {"$gte": 2020}}], "draft": {"$ne": True}}
    c = meta.parse_where(where)
    assert meta.matches(c, {"lang": "de"}) and meta.matches(c, {"year": 2024})
    assert not meta.matches(c, {"lang": "fr", "year": 2019})
    assert not meta.matches(c, {"lang": "de", "draft": True})
    inner = {"$and": [{"$or": [{"a": 1}, {"b": {"$exists": True}}]}, {"c": {"$nin": ["x"]}}]}
    c = meta.parse_where(inner)
    assert meta.matches(c, {"b": "y"}) and not meta.matches(c, {"b": "y", "c": "x"})
    deep: dict = {"lang": "de"}
    for _ in range(meta.MAX_DEPTH):
        deep = {"$or": [deep]}
    meta.parse_where(deep)
    with pytest.raises(meta.FilterError, match="nested too deeply"):
        meta.parse_where({"$or": [deep]})
    for bad in ({"$or": []}, {"$or": {"lang": "de"}}, {"$or": ["de"]}):
        with pytest.raises(meta.FilterError):
            meta.parse_where(bad)
    assert meta.parse_cli_where(['{"$or": [{"lang": "de"}, {"year": 2024}]}', "lang!=fr"]) == {
        "$and": [{"$or": [{"lang": "de"}, {"year": 2024}]}, {"lang": {"$ne": "fr"}}]
    }


@pytest.fixture
def api(database_url, make_ctx):
    ctx = make_ctx(SLUICE_CHUNK_SIZE="200", SLUICE_CHUNK_OVERLAP="0")
    ids = _seed(ctx)
    with InProcessApi() as server:
        yield server.url, auth(make_key("controls", datasets=None, scope="read")), ids


def _post(url, h, **body):
    return httpx.post(f"{url}/v1/datasets/default/search", json=body, headers=h, timeout=30)


def test_the_api_takes_the_controls_and_or_filters_on_both_databases(api):
    url, h, ids = api
    either = {"$or": [{"lang": "de"}, {"year": {"$gte": 2020}}]}
    for mode in ("dense", "lexical", "hybrid"):
        r = _post(url, h, query="lighthouse harbour", k=20, mode=mode, where=either)
        assert r.status_code == 200, r.text
        found = {hit["document_id"] for hit in r.json()["hits"]}
        assert found == {ids["keeper.txt"], ids["harbour.txt"]}, mode
        r = _post(url, h, query="lighthouse", k=20, mode=mode, where={"$or": [{"lang": "fr"}]})
        assert {hit["document_id"] for hit in r.json()["hits"]} <= {ids["orchard.txt"]}
        r = _post(url, h, query="lighthouse keeper", k=3, mode=mode, max_chunks_per_document=1)
        docs = [hit["document_id"] for hit in r.json()["hits"]]
        holders = 2 if mode == "lexical" else 3  # lexically only two hold both words
        assert len(docs) == len(set(docs)) == holders, (mode, docs)
        every = _post(url, h, query="lighthouse keeper", k=30, mode=mode).json()["hits"]
        assert all(0 <= hit["score"] <= 1 for hit in every)
        every = _post(url, h, query="keeper harbour dawn", k=30, mode=mode).json()["hits"]
        cut = round((every[0]["score"] + every[-1]["score"]) / 2, 4)
        assert every[-1]["score"] < cut
        kept = _post(url, h, query="keeper harbour dawn", k=30, mode=mode, min_score=cut).json()
        assert [x["chunk_id"] for x in kept["hits"]] == [
            x["chunk_id"] for x in every if x["score"] >= cut
        ]
    words = _post(url, h, query="keeper harbour dawn", k=6, mode="lexical").json()["hits"]
    fused = _post(url, h, query="keeper harbour dawn", k=6, dense_weight=0).json()["hits"]
    assert [x["chunk_id"] for x in fused] == [x["chunk_id"] for x in words]


def _nested_or(levels: int) -> dict:
    where: dict = {"a": 1}
    for _ in range(levels):
        where = {"$or": [where]}
    return where


INVALID = [
    ({"min_score": 1.5}, "invalid_request"),
    ({"min_score": -0.01}, "invalid_request"),
    ({"min_score": "high"}, "invalid_request"),
    ({"max_chunks_per_document": 0}, "invalid_request"),
    ({"max_chunks_per_document": 101}, "invalid_request"),
    ({"dense_weight": 2}, "invalid_request"),
    ({"dense_weight": None}, "invalid_request"),
    ({"where": {"$or": []}}, "invalid_filter"),
    ({"where": {"$or": {"lang": "de"}}}, "invalid_filter"),
    ({"where": {"$or": [{"lang": {"$nope": 1}}]}}, "invalid_filter"),
    ({"where": _nested_or(9)}, "invalid_filter"),
]


def test_invalid_controls_are_422_problems_with_a_stable_code(api):
    url, h, _ = api
    for body, code in INVALID:
        r = _post(url, h, query="lighthouse", **body)
        assert r.status_code == 422, (body, r.text)
        assert r.headers["content-type"].startswith("application/problem+json")
        assert r.json()["code"] == code, body
    for body in (
        {"min_score": 0, "dense_weight": 0},
        {"min_score": 1, "dense_weight": 1},
        {"max_chunks_per_document": 100, "where": {"$or": [{"lang": "de"}]}},
    ):  # the bounds themselves are taken
        assert _post(url, h, query="lighthouse", **body).status_code == 200, body


def test_the_schema_publishes_the_controls_with_their_bounds(api):
    url, _, _ = api
    schema = httpx.get(f"{url}/openapi.json", timeout=30).json()["components"]["schemas"]
    props = schema["SearchIn"]["properties"]
    number = {k: v for part in props["min_score"]["anyOf"] for k, v in part.items()}
    assert number["minimum"] == 0 and number["maximum"] == 1
    cap = {k: v for part in props["max_chunks_per_document"]["anyOf"] for k, v in part.items()}
    assert cap["minimum"] == 1 and cap["maximum"] == 100
    assert props["dense_weight"]["minimum"] == 0 and props["dense_weight"]["maximum"] == 1


def test_a_hits_place_is_location_and_where_stays_as_its_deprecated_name(api):
    url, h, _ = api
    hits = _post(url, h, query="lighthouse keeper", k=5).json()["hits"]
    assert hits and all(x["location"] == x["where"] for x in hits)
    schema = httpx.get(f"{url}/openapi.json", timeout=30).json()["components"]["schemas"]
    assert schema["HitOut"]["properties"]["where"]["deprecated"] is True
    assert "location" in schema["HitOut"]["required"]


def test_sluice_search_takes_the_controls(seeded, capsys):
    ctx, ids = seeded
    code = main(
        [
            "search",
            "lighthouse keeper",
            "--k",
            "3",
            "--max-per-document",
            "1",
            "--min-score",
            "0.01",
            "--dense-weight",
            "0.3",
            "--where",
            '{"$or": [{"lang": "en"}, {"lang": "de"}]}',
            "--json",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert sorted(h["document_id"] for h in out) == sorted([ids["long.txt"], ids["keeper.txt"]])
    assert main(["search", "lighthouse", "--min-score", "2"]) == 1
    assert "min_score" in capsys.readouterr().err


def test_the_console_shows_the_apis_hits_for_the_same_request(api):
    url, h, ids = api
    body = {
        "query": "lighthouse keeper",
        "k": 5,
        "mode": "hybrid",
        "min_score": 0.3,
        "max_chunks_per_document": 2,
        "dense_weight": 0.7,
        "where": {"$or": [{"lang": "en"}, {"lang": "de"}]},
    }
    hits = _post(url, h, **body).json()["hits"]
    assert hits and len(hits) < 5  # the cap and the filter leave fewer than k
    want = [f"doc=doc%3A{x['document_id']}&chunk={x['chunk_id'].rsplit('-', 1)[-1]}" for x in hits]

    at = open_console("search", query={"q": body["query"], "in": "default"})
    at.number_input(key="search_k").set_value(5)
    at.number_input(key="search_min_score").set_value(0.3)
    at.number_input(key="search_max_per_document").set_value(2)
    at.slider(key="search_dense_weight").set_value(0.7)
    at.text_input(key="search_where").set_value(json.dumps(body["where"]))
    at.button[0].click().run()
    assert not at.exception
    links = [p.proto.query_string for p in at.get("page_link") if "chunk=" in p.proto.query_string]
    assert links == want
    assert [m.value for m in at.metric] == [f"{x['score']:.3f}" for x in hits]
    assert "weak match" not in " ".join(c.value for c in at.caption)  # nothing hidden quietly

    at = open_console("hit_testing")
    at.text_area(key="hit_query").set_value(body["query"])
    at.number_input(key="hit_k").set_value(5)
    at.number_input(key="hit_min_score").set_value(0.3)
    at.number_input(key="hit_max_per_document").set_value(2)
    at.slider(key="hit_dense_weight").set_value(0.7)
    at.text_input(key="hit_where").set_value(json.dumps(body["where"]))
    at.button(key="FormSubmitter:hit_test_form-Test").click().run()
    assert not at.exception
    table = at.dataframe[0].value
    assert list(table["score"]) == [x["score"] for x in hits]
    assert set(ids) >= set(table["file"])
