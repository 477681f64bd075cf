"""The console's part of metadata (AppTest): the Search page's filter row, the Upload page's field
refusing bad metadata with the key named, the Document page showing and replacing a document's
metadata and switching a chunk off and on."""

from __future__ import annotations

import json

from sqlmodel import Session

from sluice.ops.search import search
from sluice.storage.models import Document
from tests.support.apptest import assert_ok, open_console, texts
from tests.test_metadata import upload


def _search(at, query: str, where: str):
    at.text_input(key="q").set_value(query)
    at.text_input(key="search_where").set_value(where)
    at.button[0].click().run()
    assert_ok(at)
    return at


def test_search_page_filter_row(ctx):
    de = upload(ctx, "glacier", {"lang": "de"}, 2)
    upload(ctx, "pier", {"lang": "en"}, 2)
    at = _search(open_console("search"), "harbour", "lang=de")
    assert at.get("page_link")
    docs = {p.proto.query_string for p in at.get("page_link") if p.proto.label == "Open document"}
    assert docs and all(f"doc%3A{de.document_id}" in q for q in docs), docs
    at = _search(at, "harbour", "year>=soon")
    assert "'year'" in texts(at) and at.error
    at = _search(at, "harbour", '{"lang": {"$in": ["xx"]}}')
    assert "No indexed chunks" in texts(at)


def test_upload_page_refuses_bad_metadata_naming_the_key(ctx):
    at = open_console("upload")
    at.text_area(key="upload_metadata").set_value('{"Lang": "de"}')
    at.button[0].click().run()
    assert_ok(at)
    assert "Nothing was uploaded" in texts(at) and "'Lang'" in texts(at)


def test_document_page_metadata_and_chunk_switch(ctx):
    done = upload(ctx, "glacier", {"lang": "de"}, 3)
    at = open_console("document", query={"doc": f"doc:{done.document_id}"})
    assert json.loads(at.get("json")[0].proto.body) == {"lang": "de"}
    at.text_area(key="document_metadata").set_value('{"_x": 1}')
    at.button[0].click().run()
    assert "Not saved" in texts(at) and "'_x'" in texts(at)
    at.text_area(key="document_metadata").set_value('{"lang": "fr", "year": 2024}')
    at.button[0].click().run()
    assert_ok(at)
    with Session(ctx.engine) as session:
        assert session.get(Document, done.document_id).metadata_ == {"lang": "fr", "year": 2024}

    switches = [t for t in at.toggle if t.key.startswith("document_chunk_on_")]
    assert switches and all(t.value for t in switches)
    first = switches[0]
    cid = first.key.removeprefix("document_chunk_on_")
    served = f"{len(switches) - 1} (1 switched off)"  # a switched-off chunk is not served
    assert served not in texts(at)
    first.set_value(False).run()
    assert_ok(at)
    assert "disabled" in texts(at)
    shown = [m.value.replace("\\", "") for m in at.markdown]  # ui.plain escapes markdown
    assert f"**Chunks served**  \n{served}" in shown
    hits = search(ctx, query="harbour", dataset="default", k=100, mode="lexical")
    assert hits and cid not in {h.chunk_id for h in hits}
    at.toggle(key=f"document_chunk_on_{cid}").set_value(True).run()
    hits = search(ctx, query="harbour", dataset="default", k=100, mode="lexical")
    assert cid in {h.chunk_id for h in hits}
