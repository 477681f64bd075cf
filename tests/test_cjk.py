"""Scripts written without spaces (Chinese, Japanese, Thai; Korean too) in the word index: a run of
such characters is indexed as overlapping character bigrams beside the words, a typed word becomes
the phrase of its bigrams in order, and one typed character finds every run holding it. Real jobs
through the pipeline, searched through ops search, on SQLite and PostgreSQL."""

from sqlalchemy import text as sql

from sluice.ops.search import search
from sluice.storage import lexical
from tests.support.helpers import run_file

FILES = {
    "zh.txt": "我的猫很可爱。这份报告讨论了上海的天气和交通。",
    "ja.txt": "私は東京都に住んでいます。毎朝電車で会社に行きます。",
    "th.txt": "ภาษาไทยง่ายมาก และอาหารไทยอร่อย",
    "mixed.txt": "Invoice for the shipment: 上海的仓库 received it.",
    "en.txt": "The harbour invoice lists the orchard crates and the glacier samples.",
}


def index(ctx, files=FILES, dataset="default") -> None:
    for name, body in files.items():
        assert run_file(ctx, body.encode(), name, dataset=dataset).status.value == "succeeded"


def found(ctx, query: str, mode: str = "lexical", dataset: str = "default") -> list[str]:
    return [h.filename for h in search(ctx, query=query, dataset=dataset, k=5, mode=mode)]


def test_a_word_inside_a_chinese_japanese_or_thai_sentence_finds_it(database_url, make_ctx):
    ctx = make_ctx()
    index(ctx)
    words = {
        "可爱": "zh.txt",  # two characters: one bigram
        "天气": "zh.txt",
        "猫": "zh.txt",  # one character inside a run
        "气": "zh.txt",  # one character, never the first of a bigram in its chunk
        "東京都": "ja.txt",  # a phrase of bigrams
        "住んで": "ja.txt",
        "電車": "ja.txt",
        "ง่าย": "th.txt",  # Thai, with its tone mark
        "อาหาร": "th.txt",
    }
    for word, name in words.items():
        assert found(ctx, word) == [name], word
        [top, *_] = search(ctx, query=word, dataset="default", k=5, mode="hybrid")
        assert (top.filename, "lexical" in top.matched) == (name, True), word
    [hit] = search(ctx, query="猫", dataset="default", k=5, mode="lexical")
    assert hit.snippet.startswith("我的**猫**很可爱")
    [hit] = search(ctx, query="ง่าย", dataset="default", k=5, mode="lexical")
    assert "ภาษาไทย**ง่าย**มาก" in hit.snippet


def test_a_thai_word_keeps_its_marks(database_url, make_ctx):
    """A Thai vowel or tone mark is part of its word on both engines (FTS5's unicode61 would split
    the word at it): the same letters without the mark, or with another, are another word."""
    ctx = make_ctx()
    index(ctx)
    assert found(ctx, '"ง่าย"') == ["th.txt"]  # quoted: no looser match by some of its bigrams
    assert found(ctx, '"งาย"') == []  # without its tone mark
    assert found(ctx, '"ง้าย"') == []  # with another tone mark
    assert found(ctx, '"อร่อย"') == ["th.txt"]
    assert found(ctx, '"อรอย"') == []


def test_bigrams_match_in_order_and_a_mixed_query_needs_both_words(database_url, make_ctx):
    ctx = make_ctx()
    index(ctx)
    assert found(ctx, "京東") == []  # the bigrams of 東京都 reversed
    assert found(ctx, '"都東京"') == []  # its bigrams in another order (quoted: no looser match)
    assert found(ctx, '"東京都"') == ["ja.txt"]
    assert found(ctx, "可猫") == []
    assert found(ctx, '"东京"') == []  # simplified 东 is another character
    # An English word and a Chinese word: the chunk holding both, in lexical and hybrid mode.
    assert found(ctx, "invoice 上海") == ["mixed.txt"]
    assert found(ctx, "上海 invoice", mode="hybrid")[0] == "mixed.txt"
    assert found(ctx, '"Invoice仓库"') == []  # a phrase: its parts side by side
    assert found(ctx, '"shipment 上海的仓库"') == ["mixed.txt"]
    assert found(ctx, "it 仓库") == ["mixed.txt"]
    # No chunk holds both words: each word's chunk answers (the looser match).
    assert sorted(found(ctx, "orchard 可爱")) == ["en.txt", "zh.txt"]
    assert sorted(found(ctx, "glacier 猫")) == ["en.txt", "zh.txt"]  # one character, too


def test_latin_text_is_indexed_and_ranked_as_before(database_url, make_ctx):
    """No extra token for a chunk without CJK (its length, hence its BM25 or ts_rank score, is what
    it was), one for each CJK run of a mixed chunk (its last character), and what another dataset
    holds in CJK does not move this dataset's scores."""
    ctx = make_ctx()
    latin = {k: v for k, v in FILES.items() if k in ("en.txt", "mixed.txt")}
    latin["more.txt"] = "Invoice invoice invoice: the harbour pays the invoice."
    index(ctx, latin)
    body = FILES["en.txt"]
    pg = ctx.engine.dialect.name == "postgresql"
    column = "l.tsv = CAST(:t AS tsvector)" if pg else "l.terms = :t"
    toks = lexical.tokens(body)
    with ctx.engine.connect() as conn:
        same = conn.execute(
            sql(
                f"SELECT {column} FROM lexical_chunk l JOIN document d ON d.id = l.document_id "
                "WHERE d.filename = 'en.txt'"
            ),
            {"t": lexical._tsvector(toks) if pg else " ".join(toks)},
        ).scalar_one()
    assert same
    assert found(ctx, "库") == ["mixed.txt"]  # the last character of 上海的仓库: its marked token
    assert found(ctx, "上") == ["mixed.txt"]

    def scores():
        return [
            (h.filename, h.score)
            for h in search(ctx, query="invoice harbour", dataset="default", k=5, mode="lexical")
        ]

    before = scores()
    assert [name for name, _ in before] == ["more.txt", "en.txt"]
    index(ctx, {**FILES, "en.txt": body + " 发票 invoice harbour"}, dataset="other")
    assert scores() == before


def test_chunks_indexed_before_the_tail_tokens_are_still_found(database_url, make_ctx):
    """A chunk indexed by an older Sluice has the bigrams but no marked last characters: every word
    of two or more characters finds it, and one character that is not the last of its run."""
    ctx = make_ctx()
    index(ctx, {"zh.txt": FILES["zh.txt"]})
    body = FILES["zh.txt"]
    old = lexical.tokens(body)
    with ctx.engine.begin() as conn:
        if ctx.engine.dialect.name == "postgresql":
            conn.execute(
                sql("UPDATE lexical_chunk SET tsv = CAST(:t AS tsvector)"),
                {"t": lexical._tsvector(old)},
            )
        else:
            conn.execute(sql("UPDATE lexical_chunk SET terms = :t"), {"t": " ".join(old)})
    for word in ("可爱", "上海的天气", "猫", "气"):
        assert found(ctx, word) == ["zh.txt"], word
    assert found(ctx, "通") == []  # the last character of its run: found after a reindex
