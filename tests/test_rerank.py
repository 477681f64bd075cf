"""A reranker (``SLUICE_RERANK_MODEL``) rescores a search's best candidates: the hits come in its
order with its 0..1 score, ``min_score`` reads that score, ``rerank: false`` leaves it out, and a
request for reranking where none is set is refused by name. The cross-encoder path is the real
loading code, run on a tiny model the test makes (no cross-encoder ships in the registries)."""

from __future__ import annotations

import httpx
import pytest

from sluice.ops.ingest import ingest_bytes
from sluice.ops.search import RerankUnavailable, search
from sluice.pipeline.running.runner import run_job
from sluice.settings import Settings
from tests.support.api_server import InProcessApi, auth, make_key

DOCS = {
    "a.txt": "Harbour pilot. Harbour pilot, harbour pilot: harbour pilot harbour pilot.",
    "b.txt": "The harbour pilot boards each tanker at the outer buoy before dawn.",
    "c.txt": "Tanker crews report to the pilot station at dawn, by the outer buoy.",
}
QUERY = "harbour pilot tanker dawn"


def _indexed(ctx) -> dict[str, int]:
    ids = {}
    for name, body in DOCS.items():
        r = ingest_bytes(ctx, body.encode(), dataset="default", filename=name)
        assert run_job(r.job_id, ctx=ctx).result == "succeeded"
        ids[name] = r.document_id
    return ids


def test_the_reranker_orders_the_hits_and_its_score_is_theirs(make_ctx):
    ctx = make_ctx(SLUICE_RERANK_MODEL="overlap", SLUICE_RERANK_DEPTH="10")
    _indexed(ctx)
    plain = search(ctx, query=QUERY, dataset="default", k=3, mode="hybrid", rerank=False)
    assert [h.filename for h in plain] == ["b.txt", "a.txt", "c.txt"]  # the rankers' order
    assert all(h.rerank_score is None for h in plain)
    hits = search(ctx, query=QUERY, dataset="default", k=3, mode="hybrid")
    # the reranker's order: the share of the query's words each chunk holds
    assert [h.filename for h in hits] == ["b.txt", "c.txt", "a.txt"]
    assert [h.rerank_score for h in hits] == [1.0, 0.75, 0.5]
    assert [h.score for h in hits] == [1.0, 0.75, 0.5]
    kept = search(ctx, query=QUERY, dataset="default", k=3, mode="hybrid", min_score=0.6)
    assert [h.filename for h in kept] == ["b.txt", "c.txt"]


def test_reranking_asked_where_none_is_set_is_refused(make_ctx):
    ctx = make_ctx()
    _indexed(ctx)
    with pytest.raises(RerankUnavailable):
        search(ctx, query=QUERY, dataset="default", k=3, rerank=True)
    hits = search(ctx, query=QUERY, dataset="default", k=3)
    assert hits and all(h.rerank_score is None for h in hits)


def test_a_rerank_model_that_is_no_folder_is_named_at_start(tmp_path):
    with pytest.raises(ValueError, match="SLUICE_RERANK_MODEL"):
        Settings(rerank_model=str(tmp_path / "missing"))
    assert Settings(rerank_model=str(tmp_path)).rerank_model == str(tmp_path)


def _tiny_cross_encoder(folder) -> None:
    """A cross-encoder of random weights and the shipped model's vocabulary, saved as a real one
    is: what loading and scoring need, in a few hundred kilobytes."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from sluice.pipeline.running.embed import model_path

    tokenizer = AutoTokenizer.from_pretrained(str(model_path("all-MiniLM-L6-v2")))
    torch.manual_seed(7)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=1,
    )
    BertForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def test_a_cross_encoder_from_a_local_folder_rescores_the_hits(make_ctx, tmp_path):
    import torch
    from sentence_transformers import CrossEncoder

    folder = tmp_path / "cross-encoder"
    _tiny_cross_encoder(folder)
    ctx = make_ctx(SLUICE_RERANK_MODEL=str(folder))
    _indexed(ctx)
    hits = search(ctx, query=QUERY, dataset="default", k=3, mode="hybrid")
    own = CrossEncoder(str(folder), device="cpu", local_files_only=True)
    expected = own.predict(
        [(QUERY, h.text) for h in hits], activation_fn=torch.nn.Sigmoid(), show_progress_bar=False
    )
    assert [h.rerank_score for h in hits] == [round(float(x), 4) for x in expected]
    assert [h.rerank_score for h in hits] == sorted((h.rerank_score for h in hits), reverse=True)
    assert all(0 <= (h.rerank_score or -1) <= 1 for h in hits)


def test_the_api_takes_rerank_and_says_when_it_cannot(make_ctx):
    ctx = make_ctx()
    _indexed(ctx)
    with InProcessApi() as server:
        h = auth(make_key("rerank", datasets=["default"], scope="read"))
        url = f"{server.url}/v1/datasets/default/search"
        r = httpx.post(url, json={"query": QUERY, "rerank": True}, headers=h, timeout=30)
        assert (r.status_code, r.json()["code"]) == (422, "rerank_unavailable"), r.text
        assert "SLUICE_RERANK_MODEL" in r.json()["hint"]
        r = httpx.post(url, json={"query": QUERY, "rerank": False}, headers=h, timeout=30)
        assert r.status_code == 200 and r.json()["hits"], r.text
        assert all(hit["rerank_score"] is None for hit in r.json()["hits"])
        r = httpx.post(url, json={"query": QUERY, "rerank": "maybe"}, headers=h, timeout=30)
        assert (r.status_code, r.json()["code"]) == (422, "invalid_request"), r.text
