"""A cold `sluice search` imports only what searching uses: with the query encoder exported, no
torch, no sentence-transformers, no ORM, none of the console's, the API's, the object store's or
the queue's packages (each costs a cold process its import time before the first hit)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sluice.pipeline.running import query_encoder
from sluice.pipeline.running.embed import model_path

# What the search path must never import: the model's own stack (the export replaces it), the
# console, the API, the object store's client, the queue, Chroma's client, parsing.
NOT_ON_THE_SEARCH_PATH = [
    "torch",
    "sentence_transformers",
    "transformers",
    "streamlit",
    "fastapi",
    "boto3",
    "huey",
    "chromadb",  # the search reads Chroma over its HTTP API (sluice.storage.vectors)
    # The embeddings' cache and its client: a query is encoded, never cached. redis (its
    # observability module) would bring opentelemetry and psutil; sluice.errors classifies the
    # clients' errors without importing them.
    "redis",
    "opentelemetry",
    "psutil",
    # The ORM with every table and the schema check made with it (the search reads in plain SQL,
    # sluice.storage.db.open_engine), the Context that imports them, and httpx (Chroma is read with
    # http.client): together about half of what a cold search imported.
    "sqlmodel",
    "sluice.storage.models",
    "sluice.pipeline.running.context",
    "httpx",
    "sluice.storage.cache",
    "sluice.storage.s3_blobs",
    "sluice.pipeline.parsing",
    "sluice.pipeline.queueing",
    "sluice.console",
    "sluice.api",
]

PROBE = """
import json, sys
from sluice.cli import main
code = main(sys.argv[2:])
names = json.loads(sys.argv[1])
print(json.dumps({"code": code, "imported": [n for n in names if n in sys.modules]}))
"""


# A lexical search encodes nothing: neither the encoder's runtime nor numpy.
NOT_ON_THE_LEXICAL_PATH = [*NOT_ON_THE_SEARCH_PATH, "numpy", "onnxruntime", "tokenizers"]


def _probe(
    argv: list[str], env: dict, names: list[str] = NOT_ON_THE_SEARCH_PATH
) -> tuple[list[str], dict]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(names), *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    *out, verdict = done.stdout.strip().splitlines()
    return out, json.loads(verdict)


def test_building_the_parser_imports_no_operation(store_env):
    """`sluice --help` and every command's parsing import no operation module: those are imported
    by the command that runs them."""
    probe = (
        "import sys\nfrom sluice.cli.main import build_parser\nbuild_parser()\n"
        "print(sorted(m for m in sys.modules if m.startswith(('sluice.ops', 'sluice.pipeline',"
        " 'sluice.storage')) or m in ('huey', 'sqlalchemy', 'redis', 'numpy')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], env=store_env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    from sluice.cli.key_commands import SCOPES
    from sluice.ops.keys import SCOPES as KEY_SCOPES

    assert SCOPES == KEY_SCOPES


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """The query encoder exported once for this module (as a worker does at its start)."""
    out = query_encoder.export(Path(model_path("all-MiniLM-L6-v2")), tmp_path_factory.mktemp("x"))
    assert out is not None
    return out


@pytest.mark.slow
def test_a_cold_search_imports_only_what_searching_uses(make_ctx, sluice_env, exported):
    from sluice.ops.ingest import ingest_bytes
    from sluice.pipeline.running.runner import run_job

    model_dir = Path(model_path("all-MiniLM-L6-v2"))
    # The chunks are encoded by the export too (the model's own vectors, see test_query_encoder):
    # this test process need not load sentence-transformers either.
    fast = query_encoder.OnnxQueryEncoder(model_dir, exported, model_id="all-MiniLM-L6-v2", dim=384)
    ctx = make_ctx(fast, SLUICE_EMBEDDER="sentence-transformers", SLUICE_EMBED_PRECISION="fp32")
    for dataset, text in (
        ("default", b"The lighthouse keeper logs every passing ship in a leather book. "),
        ("harbour", b"Tug boats push the container ships into their berths at high tide. "),
    ):
        r = ingest_bytes(ctx, text * 20, dataset=dataset, filename=f"{dataset}.txt")
        assert run_job(r.job_id, ctx=ctx).result == "succeeded"
    target = query_encoder.export_path(model_dir, ctx.settings.data_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(exported, target)
    shutil.copyfile(query_encoder.weights_path(exported), query_encoder.weights_path(target))
    env = {
        **sluice_env,
        "SLUICE_EMBEDDER": "sentence-transformers",
        "SLUICE_EMBED_PRECISION": "fp32",
    }
    out, state = _probe(["search", "the lighthouse keeper and his leather book"], env)
    assert state == {"code": 0, "imported": []}
    assert out[0] == "searched 2 dataset(s): default, harbour"
    assert "default.txt" in out[2]  # the first hit, under the header
    lexical_argv = ["search", "--mode", "lexical", "lighthouse keeper"]
    out, state = _probe(lexical_argv, env, NOT_ON_THE_LEXICAL_PATH)
    assert state == {"code": 0, "imported": []}
    assert "default.txt" in out[2]
