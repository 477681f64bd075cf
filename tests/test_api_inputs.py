"""No 5xx for anything a client can send: inputs the validators let through once and that failed
later (a RecursionError of a deep ``$and``, an integer past 64 bits that the vector store refuses
after the commit, a lone surrogate no database can encode, a page number past 64 bits) answer 422
problem+json with a stable code, and nothing is stored."""

from __future__ import annotations

import json

import httpx
import pytest
from sqlmodel import Session, func, select

from sluice.ops import metadata as meta
from sluice.ops.search import BadQuery, parse_pages
from sluice.storage.models import Document, Job
from tests.support.api_server import InProcessApi, auth, make_key

HTTP = httpx.Client(timeout=30)


def nested_and(depth: int) -> dict:
    """``{"$and": [{"$and": [... {"lang": "de"} ...]}]}`` with ``depth`` levels of ``$and``."""
    where: dict = {"lang": "de"}
    for _ in range(depth):
        where = {"$and": [where]}
    return where


@pytest.fixture
def api(database_url, make_ctx):
    ctx = make_ctx()
    with InProcessApi() as server:
        yield server, ctx, make_key("inputs", datasets=None, scope="ingest")


def _counts(ctx) -> tuple[int, int]:
    with Session(ctx.engine) as session:
        docs = session.exec(select(func.count()).select_from(Document)).one()
        jobs = session.exec(select(func.count()).select_from(Job)).one()
    return docs, jobs


def _problem(r: httpx.Response, code: str, key: str | None = None) -> None:
    assert r.status_code == 422, r.text[:500]
    assert r.headers["content-type"].startswith("application/problem+json"), r.headers
    body = r.json()
    assert body["code"] == code, body
    if key is not None:
        assert body["key"] == key, body


# The filters no front end may answer with a 5xx: deeper than the bound, deep enough to break the
# recursion of the parser (or of json itself), numbers no stored value can be.
DEEP = (9, 60, 450, 490, 700)
BAD_WHERE = [
    *[(nested_and(n), "$and" if n < 480 else None) for n in DEEP],  # None: json's own limit
    ({"year": {"$gt": 2**64}}, "year"),
    ({"year": {"$in": [1, -(2**63) - 1]}}, "year"),
    ({"lang": "\ud800"}, "lang"),
    ({"lang": {"$in": ["de", "x\udfff"]}}, "lang"),
]


def _raw_where(where: dict) -> str:
    """JSON text as a client may write it (a lone surrogate as its escape; deep nesting without
    Python's json recursion)."""
    return json.dumps(where) if _depth(where) < 300 else _deep_text(where)


def _depth(where) -> int:
    n = 0
    while isinstance(where, dict) and "$and" in where:
        where, n = where["$and"][0], n + 1
    return n


def _deep_text(where: dict) -> str:
    n = _depth(where)
    return '{"$and":[' * n + '{"lang":"de"}' + "]}" * n


def test_bad_filters_are_422_invalid_filter_on_every_surface(api):
    server, _, token = api
    h = {**auth(token), "Content-Type": "application/json"}
    for where, key in BAD_WHERE:
        text = _raw_where(where)
        body = '{"query": "harbour", "where": ' + text + "}"
        r = HTTP.post(f"{server.url}/v1/datasets/default/search", content=body, headers=h)
        if r.status_code == 400:  # too deep for the HTTP layer's own JSON reader: not a 5xx
            assert r.json()["code"] == "bad_request" and _depth(where) > 300, r.text
        else:
            _problem(r, "invalid_filter", key)
        for path in ("/v1/jobs", "/v1/datasets/default/documents"):
            if len(text) > 8192:
                continue
            r = HTTP.get(f"{server.url}{path}", params={"where": text}, headers=h)
            _problem(r, "invalid_filter", key)


def test_the_filter_bound_is_stated_and_a_filter_within_it_works():
    meta.parse_where(nested_and(meta.MAX_DEPTH))
    with pytest.raises(meta.FilterError) as refused:
        meta.parse_where(nested_and(meta.MAX_DEPTH + 1))
    assert refused.value.key == "$and" and f"at most {meta.MAX_DEPTH}" in str(refused.value)
    with pytest.raises(meta.FilterError):
        meta.parse_filter_text(_deep_text(nested_and(5000)))  # the console's field


BAD_METADATA = [
    ({"n": 2**63}, "n"),
    ({"n": -(2**63) - 1}, "n"),
    ({"n": 10**400}, "n"),
    ({"lang": "\ud800"}, "lang"),
    ({"team": ["a", "\udc00b"]}, "team"),
    ({"\ud800": "x"}, "\ufffd"),
    ({"k" * 5000: 1}, "k" * meta.SHOWN_KEY + "…"),
]
GOOD_METADATA = {"n": 2**63 - 1, "m": -(2**63), "f": 1.5e300, "lang": "\U0001f600"}


def test_bad_metadata_is_422_invalid_metadata_and_nothing_is_stored(api):
    server, ctx, token = api
    h = auth(token)
    url = f"{server.url}/v1/datasets/default/documents"
    for value, key in BAD_METADATA:
        before = _counts(ctx)
        text = json.dumps(value)  # a lone surrogate travels as its \\u escape, as JSON allows
        body = '{"filename": "n.txt", "text": "some words", "metadata": ' + text + "}"
        r = HTTP.post(url, content=body, headers={**h, "Content-Type": "application/json"})
        _problem(r, "invalid_metadata", key)
        r = HTTP.post(
            url,
            files={"file": ("n.txt", b"some words here", "text/plain")},
            data={"metadata": text},
            headers=h,
        )
        _problem(r, "invalid_metadata", key)
        assert _counts(ctx) == before, value
    r = HTTP.post(url, json={"filename": "ok.txt", "text": "glacier words"}, headers=h)
    assert r.status_code == 202, r.text
    doc = r.json()["jobs"][0]["document_id"]
    for value, key in BAD_METADATA:
        text = '{"metadata": ' + json.dumps(value) + "}"
        r = HTTP.patch(
            f"{server.url}/v1/documents/{doc}",
            content=text,
            headers={**h, "Content-Type": "application/json"},
        )
        _problem(r, "invalid_metadata", key)
    assert HTTP.get(f"{server.url}/v1/documents/{doc}", headers=h).json()["metadata"] == {}
    # the multipart field too deep for json itself
    r = HTTP.post(
        url,
        files={"file": ("n.txt", b"some words here", "text/plain")},
        data={"metadata": '{"a": ' + "[" * 5000 + "]" * 5000 + "}"},
        headers=h,
    )
    _problem(r, "invalid_metadata", "")
    deep = '{"filename": "n.txt", "text": "x", "metadata": {"a": ' + "[" * 5000 + "]" * 5000 + "}}"
    r = HTTP.post(url, content=deep, headers={**h, "Content-Type": "application/json"})
    assert r.status_code == 422 and r.json()["code"] == "invalid_request", r.text
    assert _counts(ctx) == (1, 1)
    assert meta.validate(GOOD_METADATA) == GOOD_METADATA


def test_search_pages_and_text_beyond_what_can_be_stored_are_422(api):
    server, _, token = api
    h = {**auth(token), "Content-Type": "application/json"}
    url = f"{server.url}/v1/datasets/default/search"
    for pages in (str(2**64), f"1-{2**63}", f"-{-(2**63) - 1}", "9" * 39):
        r = HTTP.post(url, json={"query": "harbour", "pages": pages}, headers=h)
        _problem(r, "bad_query")
        with pytest.raises(BadQuery):
            parse_pages(pages)
    assert parse_pages(f"1-{2**63 - 1}") == (1, 2**63 - 1)
    for member in ("query", "filename", "media_type", "pages"):
        body = {"query": "harbour", member: "x\\ud800y"}
        text = json.dumps(body).replace("\\\\ud800", "\\ud800")
        r = HTTP.post(url, content=text, headers=h)
        assert r.status_code == 422, (member, r.text)
        assert r.json()["code"] in ("bad_query", "invalid_request"), r.text
