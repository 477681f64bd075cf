"""End to end on real parts: the `sluice` CLI, a real huey_consumer with the real model, the Chroma
server, and search from a separate process that was already running before anything was indexed."""

import json
import os
import subprocess
import sys

import pytest
from sqlmodel import Session

from sluice.storage.queries import JobFilter, list_jobs
from tests.support.helpers import collection

pytestmark = pytest.mark.slow

TEXT_PDFS = [
    "001-minimal-document.pdf",
    "004-pdflatex-4-pages.pdf",
    "011-google-doc-document.pdf",
    "021-crazyones-pdfa.pdf",
    "026-multicolumn.pdf",
]

SEARCHER = r"""
import json, sys
from sluice.pipeline.running.context import get_context
from sluice.ops.search import search
ctx = get_context()
ctx.vectors.heartbeat()
ctx.embedder.encode(["warm up"])
print("ready", flush=True)
for line in sys.stdin:
    q = json.loads(line)
    hits = search(ctx, query=q["query"], dataset=q["dataset"], k=3)
    print(json.dumps([h.to_dict() for h in hits]), flush=True)
"""


def sluice(*args, env):
    return subprocess.run(
        [sys.executable, "-m", "sluice.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_ingest_through_the_real_system_and_search_from_another_process(
    ctx, samples, start_worker, tmp_path
):
    env = {**os.environ, "SLUICE_EMBEDDER": "sentence-transformers"}
    searcher = subprocess.Popen(
        [sys.executable, "-c", SEARCHER],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert searcher.stdout.readline().strip() == "ready"
        start_worker(env={"SLUICE_EMBEDDER": "sentence-transformers"})
        folder = tmp_path / "upload"
        folder.mkdir()
        (folder / "notes.txt").write_text(
            "Beekeeping notes. The queen bee lays up to two thousand eggs a day "
            "in spring, and worker bees build wax comb.\n" * 5
        )
        (folder / "guide.md").write_text(
            "# Sourdough\n\nFeed the starter with rye flour and water, then "
            "wait until it doubles before baking the bread.\n" * 5
        )
        files = [str(samples / n) for n in TEXT_PDFS] + [str(folder)]

        done = sluice("ingest", *files, "--dataset", "kb", "--wait", env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"{len(TEXT_PDFS) + 2}/{len(TEXT_PDFS) + 2} succeeded" in done.stdout

        listed = sluice("jobs", "--dataset", "kb", "--json", env=env)
        rows = json.loads(listed.stdout)
        assert len(rows) == len(TEXT_PDFS) + 2
        assert {r["status"] for r in rows} == {"succeeded"}
        for key in (
            "id",
            "dataset",
            "filename",
            "status",
            "stage",
            "done",
            "total",
            "attempt",
            "error_kind",
            "error_message",
        ):
            assert key in rows[0]
        with Session(ctx.engine) as session:
            jobs = list_jobs(session=session, f=JobFilter(statuses=["succeeded"]))
        assert ctx.vectors.count(collection(ctx, "kb")) == sum(j.chunk_count for j in jobs)

        for query, expected in [
            ("how many eggs does the queen bee lay", "notes.txt"),
            ("feeding a sourdough starter with rye flour", "guide.md"),
        ]:
            searcher.stdin.write(json.dumps({"query": query, "dataset": "kb"}) + "\n")
            searcher.stdin.flush()
            hits = json.loads(searcher.stdout.readline())
            assert hits and hits[0]["filename"] == expected, hits
            assert "dense" in hits[0]["matched"]  # the model found it too, not the words alone

        again = sluice("ingest", str(folder / "notes.txt"), "--dataset", "kb", env=env)
        assert again.returncode == 0 and "already indexed" in again.stdout

        shown = sluice("datasets", "--json", env=env)
        kb = next(d for d in json.loads(shown.stdout) if d["name"] == "kb")
        assert kb["documents"] == len(TEXT_PDFS) + 2 and kb["chunks"] == sum(
            j.chunk_count for j in jobs
        )

        found = sluice("search", "queen bee eggs", "--dataset", "kb", "--json", env=env)
        assert json.loads(found.stdout)[0]["filename"] == "notes.txt"
    finally:
        searcher.kill()
