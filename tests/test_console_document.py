"""The document view (AppTest): reached from a search hit and from a job, it shows the document's
metadata, jobs and versions, its chunks in order with pages, the chosen chunk's page rendered with the
chunk located on it, and a download of the original for operators only."""

from urllib.parse import parse_qsl

import pymupdf
import pytest

from sluice.ops.access import Operator, ReadOnlyOperator
from sluice.ops.document_view import original
from sluice.ops.ingest import ingest_bytes
from sluice.pipeline.running.runner import run_job
from tests.support.apptest import assert_ok, open_console, texts


def _pdf() -> bytes:
    doc = pymupdf.open()
    for n in range(1, 4):
        page = doc.new_page()
        line = (
            "The harbour crane KX-9904 was inspected on page three."
            if n == 3
            else f"Quiet page {n} of the log."
        )
        page.insert_text((72, 72), line)
    return doc.tobytes()


def _indexed(ctx):
    r = ingest_bytes(ctx, _pdf(), dataset="default", filename="cranes.pdf")
    assert run_job(r.job_id, ctx=ctx).result == "succeeded"
    return r


def test_open_a_search_hit_see_its_chunks_page_image_and_download(ctx):
    r = _indexed(ctx)
    at = open_console("search")
    at.text_input(key="q").set_value("KX-9904")
    at.button[0].click().run()
    assert_ok(at)
    assert "**KX**-**9904**" in texts(at)
    link = next(
        p for p in at.get("page_link") if p.proto.label == "Open document"
    )  # the first hit's
    query = dict(parse_qsl(link.proto.query_string))
    assert query["doc"] == f"doc:{r.document_id}"

    at = open_console("document", query={"doc": f"doc:{r.document_id}", "chunk": query["chunk"]})
    page = texts(at)
    assert at.title[0].value == "Document" and "cranes.pdf" in page
    assert "application/pdf" in page and "chunk 2 · page 3" in page
    assert any("KX-9904" in t.value for t in at.text)
    assert at.radio(key="document_chunk").value == 2  # the hit's chunk is the one located
    [image] = at.get("image")
    assert "the chunk highlighted" in str(image.proto)
    assert at.get("download_button")  # an operator may take the original
    jobs = at.dataframe[0].value
    assert list(jobs["job"]) == [r.job_id] and bool(jobs["serves search"][0])

    # The job detail links here too.
    at = open_console("jobs", query={"job": str(r.job_id)})
    links = [dict(parse_qsl(p.proto.query_string)) for p in at.get("page_link")]
    assert {"doc": f"doc:{r.document_id}"} in links, links


def test_a_read_only_user_sees_the_document_but_cannot_download_it(make_ctx):
    ctx = make_ctx(
        SLUICE_CONSOLE_PASSWORD="full-rights-5b1e",
        SLUICE_CONSOLE_READONLY_PASSWORD="look-only-7c2d",
    )
    r = _indexed(ctx)
    at = open_console(query={"doc": str(r.job_id)})
    at.switch_page("views/document_page.py")
    at.run()
    at.text_input(key="login_password").set_value("look-only-7c2d")
    at.button[0].click().run()
    assert_ok(at)
    assert at.title[0].value == "Document" and "cranes.pdf" in texts(at)
    assert any("KX-9904" in t.value for t in at.text) and at.get("image")
    assert not at.get("download_button")
    assert "downloading the original is for operators" in texts(at)
    with pytest.raises(ReadOnlyOperator):
        original(ctx, Operator("viewer", "readonly"), r.document_id)
