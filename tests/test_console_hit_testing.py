"""The Hit testing page: each ranker's rank and score of every hit, the same ranking as the
Search page's, and each operator's last 20 queries kept in the job database to run again."""

from __future__ import annotations

from sqlmodel import Session

from sluice.console import ui
from tests.support.apptest import open_console, texts
from tests.support.helpers import run_file


def test_hit_testing_shows_each_rankers_view_and_runs_a_past_query_again(ctx):
    from sluice.ops import reads

    run_file(ctx, b"The lighthouse keeper lit the lamp at dusk. " * 30, "keeper.txt")
    run_file(ctx, b"Orchards of the valley bloom in spring. " * 30, "orchard.txt")
    run_file(ctx, b"A harbour wall shelters the fishing boats. " * 30, "harbour.txt")

    at = open_console("hit_testing")
    at.text_area(key="hit_query").set_value("lighthouse keeper")
    at.button(key="FormSubmitter:hit_test_form-Test").click().run()
    assert not at.exception
    table = at.dataframe[0].value
    for column in ("rank", "score", "dense rank", "similarity", "distance", "lexical rank"):
        assert column in table.columns
    first = table.iloc[0]
    assert first["file"] == "keeper.txt" and first["found by"] == "dense and lexical"
    assert first["dense rank"] == 1 and first["lexical rank"] == 1 and first["lexical score"] > 0
    assert abs(first["distance"] - (1 - first["similarity"])) < 1e-3
    # The ranking is the Search page's own: the same chunks in the same order.
    same = reads.search("lighthouse keeper", "default", 10, mode="hybrid")
    assert list(table["score"]) == [h.score for h in same]
    assert table["dense rank"].notna().all()  # every hybrid hit here was also found by meaning

    at.text_area(key="hit_query").set_value("orchards in spring")
    at.selectbox(key="hit_mode").set_value("lexical")
    at.button(key="FormSubmitter:hit_test_form-Test").click().run()
    table = at.dataframe[0].value
    assert table.iloc[0]["file"] == "orchard.txt" and table["dense rank"].isna().all()
    shown = ui.hit_table(table.to_dict("records")).to_html()  # as the page renders its cells
    assert ">None<" not in shown and ">nan<" not in shown and ">—<" in shown

    at = open_console("hit_testing")  # a new session: the history is in the job database
    page = texts(at)
    assert page.index("orchards in spring") < page.index("lighthouse keeper")  # newest first
    again = [b for b in at.button if b.key and b.key.startswith("hit_again_")]
    assert len(again) == 2
    again[-1].click().run()  # the oldest: lighthouse keeper, hybrid
    assert at.text_area(key="hit_query").value == "lighthouse keeper"
    assert at.dataframe[0].value.iloc[0]["file"] == "keeper.txt"
    assert "hits in default (hybrid)" in texts(at)


def test_the_hit_test_history_keeps_the_last_20_of_each_operator(ctx):
    from sluice.storage import hit_tests

    with Session(ctx.engine) as session:
        for i in range(25):
            hit_tests.record(
                session=session,
                operator="ana",
                dataset="d",
                query=f"q{i}",
                mode="hybrid",
                k=5,
                hits=i,
            )
        hit_tests.record(
            session=session, operator="ben", dataset="d", query="b", mode="dense", k=5, hits=0
        )
        kept = hit_tests.recent(session=session, operator="ana")
        assert [r.query for r in kept] == [f"q{i}" for i in range(24, 4, -1)]
        assert [r.query for r in hit_tests.recent(session=session, operator="ben")] == ["b"]


# Each search control: its widget kind and its key on the Search page and on the Hit testing page.
CONTROLS = [
    ("selectbox", "mode", "hit_mode"),
    ("number_input", "search_k", "hit_k"),
    ("text_input", "search_where", "hit_where"),
    ("number_input", "search_min_score", "hit_min_score"),
    ("number_input", "search_max_per_document", "hit_max_per_document"),
    ("slider", "search_dense_weight", "hit_dense_weight"),
]
ASKED = ("query", "dataset", "k", "mode", "where", "min_score")
ASKED += ("max_chunks_per_document", "dense_weight")


def _drawn(at, kind: str, key: str):
    """The control as the browser gets it, less what names its page (its id, form, and the URL
    parameter that keeps Search's ranking in its link)."""
    proto = type(getattr(at, kind)(key=key).proto)()
    proto.CopyFrom(getattr(at, kind)(key=key).proto)
    for field in ("id", "form_id", "query_param_key"):
        if field in proto.DESCRIPTOR.fields_by_name:
            proto.ClearField(field)
    if key.endswith("_k"):
        proto.ClearField("default")  # k starts at 5 on Search, at 10 on Hit testing
    return proto


def test_search_and_hit_testing_draw_one_set_of_controls_and_ask_the_same(ctx, monkeypatch):
    from sluice.ops import hit_testing, reads
    from sluice.ops.ingest import ingest_bytes

    ingest_bytes(ctx, b"The lighthouse keeper lit the lamp. " * 20, dataset="default", filename="a")
    asked: dict[str, dict] = {}

    def recorder(page: str):
        def search(ctx, **request):
            asked[page] = {name: request.get(name) for name in ASKED}
            return []

        return search

    monkeypatch.setattr(reads, "run_search", recorder("search"))
    monkeypatch.setattr(hit_testing, "search", recorder("hit"))
    search = open_console("search", query={"in": "default"})
    hit = open_console("hit_testing")
    for kind, on_search, on_hit in CONTROLS:
        # before: hit testing drew its mode as "Mode" without help, and k by itself
        assert _drawn(search, kind, on_search) == _drawn(hit, kind, on_hit), on_search

    search.text_input(key="q").set_value("lighthouse keeper")
    hit.text_area(key="hit_query").set_value("lighthouse keeper")
    for at, (mode, k, where, score, cap, weight) in (
        (search, ("mode", "search_k", "search_where", *[c[1] for c in CONTROLS[3:]])),
        (hit, ("hit_mode", "hit_k", "hit_where", *[c[2] for c in CONTROLS[3:]])),
    ):
        at.selectbox(key=mode).set_value("dense")
        at.number_input(key=k).set_value(7)
        at.text_input(key=where).set_value("lang=de; year>=2020")
        at.number_input(key=score).set_value(0.25)
        at.number_input(key=cap).set_value(2)
        at.slider(key=weight).set_value(0.8)
    search.button[0].click().run()
    hit.button(key="FormSubmitter:hit_test_form-Test").click().run()
    assert not search.exception and not hit.exception
    assert asked["search"] == asked["hit"]
    assert asked["hit"]["k"] == 7 and asked["hit"]["max_chunks_per_document"] == 2
