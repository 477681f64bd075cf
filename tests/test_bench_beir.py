"""`python -m bench.beir` (issue 41 item 5) on a handful of documents: a BEIR-format folder is read,
its documents go through Sluice's pipeline, every ranking is measured and the table is written.
The hash embedder stands in for the model (the figures of a real run are in BENCHMARKS.md)."""

from __future__ import annotations

import json
import math

import pytest

from bench import beir

DOCS = {
    "d1": ("Lighthouse keepers", "The lighthouse keeper trimmed the lamp every night at dusk."),
    "d2": ("Orchards", "Apple orchards bloom in spring; the harvest comes in autumn."),
    "d3": ("Harbours", "Boats shelter behind the harbour wall when storms arrive."),
    "d4": ("Glaciers", "Glaciers carve valleys slowly; meltwater feeds the rivers below."),
    "d5": ("", "Bees pollinate the apple blossoms of the orchard in spring."),
}
QUERIES = {
    "q1": "lighthouse lamp",
    "q2": "apple orchard spring",
    "q3": "glacier meltwater rivers",
    "t1": "harbour storms",
}


def _folder(tmp_path, *, train: bool = True):
    root = tmp_path / "tiny"
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": i, "title": t, "text": x}) + "\n" for i, (t, x) in DOCS.items())
    )
    (root / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": i, "text": x}) + "\n" for i, x in QUERIES.items())
    )
    (root / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t2\nq2\td5\t1\nq3\td4\t1\n"
    )
    if train:
        (root / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nt1\td3\t1\n")
    return root


def test_ndcg_at_10_is_beirs():
    grades = {"a": 2, "b": 1}
    assert beir.ndcg10(["a", "b"], grades) == pytest.approx(1.0)
    expected = (1 / math.log2(2) + 2 / math.log2(3)) / (2 / math.log2(2) + 1 / math.log2(3))
    assert beir.ndcg10(["b", "a"], grades) == pytest.approx(expected)
    assert beir.ndcg10(["x"] * 10 + ["a"], grades) == 0.0
    assert beir.ndcg10([], grades) == 0.0


def test_document_rankings_and_fusions():
    chunks = [("a", 5.0), ("b", 4.0), ("b", 3.0), ("a", 0.5)]
    assert beir.documents(chunks) == [("a", 5.0), ("b", 4.0)]
    assert beir.documents(chunks, 0.5) == [("b", 5.5), ("a", 5.25)]
    lexical, dense = [("a", 9.0), ("b", 1.0)], [("b", 0.9), ("c", 0.8)]
    assert beir.rrf(lexical, dense, 60, 0.5)[0] == "b"  # found by both
    assert beir.rrf(lexical, dense, 60, 0.0) == ["a", "b", "c"]  # the lexical order alone
    assert beir.weighted_sum(lexical, dense, 0.9) == ["b", "a", "c"]
    assert beir.weighted_sum(lexical, dense, 0.1) == ["a", "b", "c"]


@pytest.mark.timeout(120)
def test_the_bench_runs_on_a_handful_of_documents(ctx, tmp_path):
    data = beir.load(_folder(tmp_path))
    assert data.name == "tiny" and len(data.corpus) == 5 and data.qrels["q2"] == {"d2": 2, "d5": 1}
    doc_of = beir.ingest(ctx, data)
    assert sorted(c for cs in doc_of.values() for c in cs) == sorted(DOCS)
    result = beir.evaluate(ctx, data, doc_of)
    assert result["test_queries"] == 3 and result["tuned_on"] == "train"
    # The in-memory replica of the product's lexical ranking answers as the product does: here
    # "apple orchard spring" finds only d5, the one document holding all three words, and misses
    # d2 ("orchards"), which any word finds.
    lexical = result["lexical"]
    assert result["product"]["lexical"] == pytest.approx(lexical[next(iter(beir.LEXICAL_VARIANTS))])
    assert result["product"]["lexical"] < 0.9 < lexical["best chunk, any word"]
    assert lexical["whole documents, any word"] > 0.9
    values = [*result["product"].values(), *result["lexical"].values(), *result["dense"].values()]
    assert all(0.0 <= v <= 1.0 for v in values)
    text = beir.table(result)
    assert "| lexical, as the product ranks documents |" in text
    assert "whole documents, any word" in text and "RRF k=" in text


def test_without_a_dataset_it_says_so_and_exits_0(tmp_path, capsys):
    assert beir.main(["--data", str(tmp_path / "none"), "--out", str(tmp_path / "B.md")]) == 0
    assert "skipped: no BEIR-format dataset" in capsys.readouterr().out
    assert not (tmp_path / "B.md").exists()
