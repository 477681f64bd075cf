"""Parent-child retrieval: with a dataset's ``context_size``, small chunks are matched and each hit
carries its own section's text around it as ``context`` (its neighbours under the same heading,
joined where they overlap), read at search time: the setting rebuilds nothing."""

from __future__ import annotations

import httpx

from sluice.ops import sections, settings_changes
from sluice.ops.ingest import ingest_bytes
from sluice.ops.search import search
from sluice.pipeline.running.chunk import heading_of
from sluice.pipeline.running.runner import run_job
from sluice.storage import lexical
from tests.support.api_server import InProcessApi, auth, make_key

ROTTERDAM = " ".join(
    f"Rotterdam quay {i} handles containers for the inland barges of the Rhine." for i in range(12)
)
HAMBURG = " ".join(f"Hamburg berth {i} serves the feeder ships of the Baltic." for i in range(12))
BODY = f"# Ports\n\n## Rotterdam\n\n{ROTTERDAM} Zeppelinquartz cranes stand at quay six.\n\n"
BODY += f"{ROTTERDAM}\n\n## Hamburg\n\n{HAMBURG}\n"


def test_a_section_grows_around_its_chunk_within_its_heading_and_size():
    rows = [
        (0, "P > A\n\n\nalpha beta gamma delta"),
        (1, "P > A\n\n\ngamma delta epsilon zeta"),
        (2, "P > A\n\n\nepsilon zeta eta theta"),
        (3, "P > B\n\n\nother section text"),
    ]
    assert sections.join("alpha beta gamma delta", "gamma delta epsilon") == (
        "alpha beta gamma delta epsilon"
    )
    assert sections.join("short", "words") == "short\nwords"  # no overlap: kept apart
    assert sections.section(1, rows, 1000) == "alpha beta gamma delta epsilon zeta eta theta"
    assert sections.section(1, rows, 50) == "gamma delta epsilon zeta eta theta"  # one more fits
    assert sections.section(1, rows, 10) == "gamma delta epsilon zeta"  # itself, always whole
    assert sections.section(3, rows, 1000) == "other section text"


def test_hits_carry_their_section_and_the_setting_rebuilds_nothing(make_ctx):
    ctx = make_ctx(SLUICE_CHUNK_SIZE="200", SLUICE_CHUNK_OVERLAP="40")
    r = ingest_bytes(ctx, BODY.encode(), dataset="default", filename="ports.md")
    assert run_job(r.job_id, ctx=ctx).result == "succeeded"
    [hit] = search(ctx, query="zeppelinquartz", dataset="default", k=1, mode="lexical")
    assert hit.context is None  # no context_size: none
    before = [c.chunk_id for c in lexical.job_chunks(ctx.engine, r.job_id, limit=500)]
    change = settings_changes.apply(ctx, "default", {"context_size": "700"}, actor="op")
    assert change.ok, change.message
    assert [c.chunk_id for c in lexical.job_chunks(ctx.engine, r.job_id, limit=500)] == before
    assert change.from_version == change.to_version  # the same version: nothing to rebuild
    [hit] = search(ctx, query="zeppelinquartz", dataset="default", k=1, mode="lexical")
    body = heading_of(hit.text)[1]
    assert hit.context is not None and body in hit.context
    assert len(body) < len(hit.context) <= 700
    assert "Hamburg" not in hit.context  # its own section only
    assert " ".join(hit.context.split()) in " ".join(BODY.split())  # contiguous, no overlap twice
    with InProcessApi() as server:
        h = auth(make_key("sections", datasets=["default"], scope="read"))
        answer = httpx.post(
            f"{server.url}/v1/datasets/default/search",
            json={"query": "zeppelinquartz", "mode": "lexical", "k": 1},
            headers=h,
            timeout=30,
        )
    assert answer.status_code == 200, answer.text
    assert answer.json()["hits"][0]["context"] == hit.context
