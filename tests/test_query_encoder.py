"""The query encoder: the real model exported once to ONNX gives the model's own vectors, and a cold
`sluice search` then answers without loading sentence-transformers (real model; slow)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sluice.pipeline.running import query_encoder
from sluice.pipeline.running.embed import model_path

pytestmark = pytest.mark.slow

TEXTS = [
    "Harbour pilots board ships at dawn",
    "invoice INV-2024-0042 for the billing service",
    "日本語の文章です",
    "word " * 600,
    "x",
]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return Path(model_path("all-MiniLM-L6-v2"))


def test_the_export_encodes_exactly_as_the_model_does(model_dir, tmp_path):
    from sentence_transformers import SentenceTransformer

    assert (
        query_encoder.load(model_dir, tmp_path, model_id="m", dim=384) is None
    )  # nothing exported yet
    onnx_file = query_encoder.export(model_dir, tmp_path)
    assert onnx_file is not None and onnx_file.exists()
    assert query_encoder.export(model_dir, tmp_path) == onnx_file  # once: a second call finds it
    fast = query_encoder.load(model_dir, tmp_path, model_id="m", dim=384)
    reference = SentenceTransformer(str(model_dir), device="cpu").encode(
        TEXTS, normalize_embeddings=True
    )
    got = fast.encode(TEXTS)
    assert got.shape == (len(TEXTS), 384) and got.dtype == np.float32
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert (got * reference).sum(axis=1).min() >= 0.9999


def test_a_model_that_is_not_mean_pooled_is_not_exported(model_dir, tmp_path):
    other = tmp_path / "model"
    other.mkdir()
    (other / "modules.json").write_text(
        json.dumps([{"type": "sentence_transformers.models.Transformer"}])
    )
    assert not query_encoder.exportable(other) and query_encoder.export(other, tmp_path) is None
    assert query_encoder.exportable(model_dir)


def test_a_cold_cli_search_uses_the_export_and_never_loads_sentence_transformers(
    make_ctx, sluice_env, model_dir
):
    from sluice.ops.ingest import ingest_bytes
    from sluice.pipeline.running.runner import run_job

    ctx = make_ctx(SLUICE_EMBEDDER="sentence-transformers", SLUICE_EMBED_PRECISION="fp32")
    r = ingest_bytes(
        ctx,
        b"The lighthouse keeper logs every passing ship in a leather book. " * 20,
        dataset="default",
        filename="keeper.txt",
    )
    assert run_job(r.job_id, ctx=ctx).result == "succeeded"
    query_encoder.export(model_dir, ctx.settings.data_dir)  # what a worker does once at start
    probe = (
        "import sys, json\nfrom sluice.cli import main\n"
        "code = main(['search', 'who records the ships', '--json'])\n"
        "print(json.dumps({'code': code, 'st': 'sentence_transformers' in sys.modules,"
        " 'transformers': 'transformers' in sys.modules}))"
    )
    env = {
        **sluice_env,
        "SLUICE_EMBEDDER": "sentence-transformers",
        "SLUICE_EMBED_PRECISION": "fp32",
    }
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    *hits, verdict = done.stdout.strip().splitlines()
    state = json.loads(verdict)
    assert state == {"code": 0, "st": False, "transformers": False}
    assert json.loads("\n".join(hits))[0]["filename"] == "keeper.txt"
