"""Embedding precision: bf16 stays faithful to fp32, ``auto`` picks bf16 exactly where the hardware
has it, and the precision in force is part of the embedding cache key."""

from __future__ import annotations

import numpy as np
import pytest

from sluice.pipeline.running.context import pipeline_version
from sluice.pipeline.running.embed import cpu_has_bf16, resolve_precision

PASSAGES = [
    "The Harwick pumping station lifts about 42,000 cubic metres of water a day from the river "
    "intake to the eastern reservoir. Two of its four pumps were rewound in the spring, and the "
    "station met its availability target in every month but February, when ice blocked the intake "
    "screens for three days.",
    "Ballast cleaning on the northern line moved ahead of plan: the machine worked 61 night "
    "possessions and treated 38 track kilometres. Speed restrictions after the works were lifted "
    "within a week, and track geometry readings improved on every section that was cleaned.",
    "The outpatient clinic saw 18,400 patients last year. Waiting times for a first appointment "
    "fell from nine weeks to six after the clinic added evening sessions on Tuesdays and "
    "Thursdays and moved follow-up calls to specialist nurses.",
    "Our billing service produced 2.3 million invoices without a missed run. The one incident of "
    "the year was a schema migration that locked the invoice table for eleven minutes; the review "
    "added an online migration tool and a rehearsal on a copy of production.",
    "The grain terminal loaded 640,000 tonnes of wheat onto barges during the harvest peak. "
    "Moisture content stayed under fourteen percent, so no lots needed drying, and the new "
    "weighbridge cut the queue of trucks at the gate by half.",
    "Sterilisation turnaround for surgical instrument trays averaged 4.2 hours. The unit replaced "
    "two washer disinfectors and now tracks every tray with a barcode, which ended the disputes "
    "with theatres about missing sets.",
    "The signal box at Ellerby Junction routes about 420 train movements a day. Its relay "
    "interlocking dates from 1978; the renewal plan replaces it with a computer-based "
    "interlocking controlled from the regional operating centre in 2027.",
    "Leakage across the network fell to 17 percent of water put into supply. The utility "
    "installed 3,100 acoustic loggers on cast iron mains, found 860 hidden leaks, and repaired "
    "most of them within five working days.",
    "The search cluster indexes 90 million documents across twelve nodes. After the move to newer "
    "disks, the 95th percentile query latency dropped from 240 to 130 milliseconds, and "
    "reindexing the full corpus now takes a single night.",
    "Fumigation of the silo complex is planned around the export calendar. Each cell is sealed "
    "for five days; phosphine levels are logged every hour, and no cell is opened before two "
    "clean readings in a row.",
    "Bed occupancy on the medical wards averaged 94 percent, above the 85 percent the board "
    "considers safe. Discharge planning now starts on the day of admission, and a discharge "
    "lounge frees beds before noon.",
    "The deployment pipeline shipped 1,250 releases. Blue-green deploys removed the maintenance "
    "window, and feature flags let teams switch off a faulty change in seconds instead of rolling "
    "back the release.",
]

QUERIES = [  # (query, index of the passage that answers it)
    ("How much water does the Harwick station pump each day?", 0),
    ("What happened after ballast cleaning on the northern line?", 1),
    ("How did the clinic cut waiting times for first appointments?", 2),
    ("Why was the invoice table locked and for how long?", 3),
    ("How much wheat did the terminal load at harvest?", 4),
    ("How long does it take to sterilise instrument trays?", 5),
    ("When will the Ellerby Junction interlocking be replaced?", 6),
    ("How many hidden leaks did the acoustic loggers find?", 7),
    ("What did new disks do to search latency?", 8),
    ("How long are silo cells sealed during fumigation?", 9),
    ("What is the bed occupancy on medical wards?", 10),
    ("How do teams switch off a faulty change quickly?", 11),
]


@pytest.fixture(scope="module")
def embedders():
    from sluice.pipeline.running.embed import SentenceTransformerEmbedder

    return (
        SentenceTransformerEmbedder("all-MiniLM-L6-v2", precision="fp32"),
        SentenceTransformerEmbedder("all-MiniLM-L6-v2", precision="bf16"),
    )


@pytest.mark.slow
def test_bf16_really_loads_the_weights_in_bfloat16(embedders):
    import torch

    fp32, bf16 = embedders
    assert (fp32.precision, bf16.precision) == ("fp32", "bf16")
    assert {p.dtype for p in fp32.model.parameters()} == {torch.float32}
    assert {p.dtype for p in bf16.model.parameters()} == {torch.bfloat16}


@pytest.mark.slow
def test_bf16_embeddings_stay_within_cosine_0999_of_fp32(embedders):
    fp32, bf16 = embedders
    a, b = fp32.encode(PASSAGES), bf16.encode(PASSAGES)
    assert a.dtype == b.dtype == np.float32 and a.shape == b.shape == (len(PASSAGES), 384)
    np.testing.assert_allclose(np.linalg.norm(b, axis=1), 1.0, atol=1e-3)
    cosine = (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    assert cosine.min() >= 0.999, cosine
    q32, q16 = fp32.encode([q for q, _ in QUERIES]), bf16.encode([q for q, _ in QUERIES])
    assert ((q32 * q16).sum(axis=1)).min() >= 0.999


@pytest.mark.slow
def test_known_answer_queries_find_the_same_top_chunk_in_both_precisions(embedders):
    tops = []
    for model in embedders:
        passages = model.encode(PASSAGES)
        queries = model.encode([q for q, _ in QUERIES])
        tops.append(list(np.argmax(queries @ passages.T, axis=1)))
    expected = [answer for _, answer in QUERIES]
    assert tops[0] == expected
    assert tops[1] == tops[0]


@pytest.mark.slow
def test_encode_returns_rows_in_input_order_whatever_the_lengths(embedders):
    """The embedder sorts a batch by length for its lanes; every row must come back in place."""
    fp32, _ = embedders
    texts = [PASSAGES[i % len(PASSAGES)][: 40 + 37 * i] for i in range(21)]
    together = fp32.encode(texts)
    alone = np.stack([fp32.encode([t])[0] for t in texts])
    assert ((together * alone).sum(axis=1)).min() >= 0.9999
    assert fp32.encode([]).shape == (0, 384)


def test_auto_picks_bf16_exactly_where_the_hardware_has_it():
    import torch

    native = cpu_has_bf16() or (torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    assert resolve_precision("auto") == ("bf16" if native else "fp32")
    assert resolve_precision("fp32") == "fp32" and resolve_precision("bf16") == "bf16"


def test_changing_the_precision_misses_the_embedding_cache(make_ctx):
    """The cache namespace carries the precision: vectors of one precision never serve the other."""
    texts = ["the same chunk text under two precisions", "and a second chunk"]
    vectors = np.eye(2, 384, dtype=np.float32)

    fp32 = make_ctx(SLUICE_EMBEDDER="sentence-transformers", SLUICE_EMBED_PRECISION="fp32")
    bf16 = make_ctx(SLUICE_EMBEDDER="sentence-transformers", SLUICE_EMBED_PRECISION="bf16")
    assert (
        fp32.pipeline_version != bf16.pipeline_version
    )  # a mixed fleet never mixes them under one
    # fp32 adds nothing to the spec: it keeps the version it had before precision counted
    assert fp32.pipeline_version == pipeline_version(fp32.settings)
    assert ":fp32:" in fp32.cache.namespace and ":bf16:" in bf16.cache.namespace

    fp32.cache.put_many(texts, vectors, dataset_id=1)
    assert all(v is not None for v in fp32.cache.get_many(texts, dataset_id=1))
    assert bf16.cache.get_many(texts, dataset_id=1) == [None, None]
    assert bf16.cache.contains_many(texts, dataset_id=1) == 0

    auto = make_ctx(SLUICE_EMBEDDER="sentence-transformers", SLUICE_EMBED_PRECISION="auto")
    same = bf16 if resolve_precision("auto") == "bf16" else fp32
    assert auto.cache.namespace == same.cache.namespace
    assert auto.pipeline_version == same.pipeline_version  # auto counts as what it resolves to
