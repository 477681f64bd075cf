"""Metadata, filters and chunk switches through the front ends: the HTTP API (the real app under
uvicorn) and the ``sluice`` command; a bad value is a 422 naming the key, or exit code 2."""

from __future__ import annotations

import json

import httpx
import pytest

from sluice.cli.main import main
from sluice.pipeline.running.runner import run_job
from tests.support.api_server import InProcessApi, auth, make_key
from tests.test_reconcile import text


def run(capsys, *args):
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def api(database_url, make_ctx):
    ctx = make_ctx()
    with InProcessApi() as server:
        yield server, ctx, make_key("meta-ingest", datasets=None, scope="ingest")


def _json_upload(url, token, name, body, metadata=None):
    payload = {"filename": name, "text": body, **({"metadata": metadata} if metadata else {})}
    return httpx.post(
        f"{url}/v1/datasets/default/documents", json=payload, headers=auth(token), timeout=30
    )


def test_the_api_takes_metadata_filters_and_chunk_switches(api):
    server, ctx, token = api
    url, h = server.url, auth(token)
    r = _json_upload(url, token, "a.txt", text("harbour").decode(), {"lang": "de", "year": 2021})
    assert r.status_code == 202, r.text
    a = r.json()["jobs"][0]
    files = {"file": ("b.txt", text("orchard"), "text/plain")}
    form = {"metadata": json.dumps({"lang": "en", "team": ["x", "y"]})}
    r = httpx.post(
        f"{url}/v1/datasets/default/documents", files=files, data=form, headers=h, timeout=30
    )
    assert r.status_code == 202, r.text
    b = r.json()["jobs"][0]
    for made in (a, b):
        assert run_job(made["job_id"], ctx=ctx).result == "succeeded"
    doc = httpx.get(f"{url}/v1/documents/{b['document_id']}", headers=h).json()
    assert doc["metadata"] == {"lang": "en", "team": ["x", "y"]}

    def search(where, mode="hybrid", k=50):
        r = httpx.post(
            f"{url}/v1/datasets/default/search",
            json={"query": "section", "k": k, "mode": mode, "where": where},
            headers=h,
            timeout=30,
        )
        assert r.status_code == 200, r.text
        return {hit["document_id"] for hit in r.json()["hits"]}

    assert search({"lang": "de"}) == {a["document_id"]}
    assert search({"team": {"$in": ["y"]}}, mode="lexical") == {b["document_id"]}
    assert search({"year": {"$gte": 2020}}, mode="dense") == {a["document_id"]}

    # PATCH replaces the whole object
    r = httpx.patch(
        f"{url}/v1/documents/{a['document_id']}", json={"metadata": {"lang": "fr"}}, headers=h
    )
    assert r.status_code == 200 and r.json()["metadata"] == {"lang": "fr"}, r.text
    assert search({"lang": "de"}) == set() and search({"lang": "fr"}) == {a["document_id"]}
    assert search({"year": {"$exists": True}}) == set()

    # listings
    listed = httpx.get(
        f"{url}/v1/datasets/default/documents",
        params={"where": json.dumps({"lang": "en"})},
        headers=h,
    ).json()
    assert [d["id"] for d in listed["documents"]] == [b["document_id"]]
    jobs = httpx.get(
        f"{url}/v1/jobs", params={"where": json.dumps({"lang": "fr"})}, headers=h
    ).json()
    assert [j["id"] for j in jobs["jobs"]] == [a["job_id"]]

    # a chunk switched off, then on
    chunks = httpx.get(f"{url}/v1/documents/{b['document_id']}/chunks", headers=h).json()["chunks"]
    cid = chunks[0]["chunk_id"]
    assert chunks[0]["enabled"] is True
    r = httpx.patch(f"{url}/v1/chunks/{cid}", json={"enabled": False}, headers=h)
    assert r.status_code == 200 and r.json()["enabled"] is False, r.text
    assert r.json()["dataset"] == "default" and "dataset_id" not in r.json()  # named, as elsewhere
    chunks = httpx.get(f"{url}/v1/documents/{b['document_id']}/chunks", headers=h).json()["chunks"]
    assert chunks[0]["enabled"] is False
    hits = httpx.post(
        f"{url}/v1/datasets/default/search",
        json={"query": "orchard section", "k": 100},
        headers=h,
        timeout=30,
    ).json()["hits"]
    assert hits and cid not in {x["chunk_id"] for x in hits}
    assert httpx.patch(f"{url}/v1/chunks/{cid}", json={"enabled": True}, headers=h).json()[
        "enabled"
    ]
    assert (
        httpx.patch(
            f"{url}/v1/chunks/nope-x-000001", json={"enabled": False}, headers=h
        ).status_code
        == 404
    )


BAD_METADATA = [
    ({"Lang": "de"}, "Lang"),
    ({"_reserved": 1}, "_reserved"),
    ({"tags": [1, 2]}, "tags"),
    ({"blob": "x" * 9000}, ""),
]


def test_the_api_refuses_bad_metadata_and_bad_filters_naming_the_key(api):
    server, ctx, token = api
    url, h = server.url, auth(token)
    for value, key in BAD_METADATA:
        r = _json_upload(url, token, "n.txt", "some words here", value)
        assert r.status_code == 422 and r.json()["code"] == "invalid_metadata", r.text
        assert r.json()["key"] == key and r.headers["content-type"].startswith(
            "application/problem+json"
        )
        r = httpx.post(
            f"{url}/v1/datasets/default/documents",
            files={"file": ("n.txt", b"some words here", "text/plain")},
            data={"metadata": json.dumps(value)},
            headers=h,
        )
        assert (r.status_code, r.json()["code"], r.json()["key"]) == (422, "invalid_metadata", key)
    r = httpx.post(
        f"{url}/v1/datasets/default/documents",
        files={"file": ("n.txt", b"some words here", "text/plain")},
        data={"metadata": "{not json"},
        headers=h,
    )
    assert (r.status_code, r.json()["code"]) == (422, "invalid_metadata")
    r = _json_upload(url, token, "ok.txt", text("glacier").decode(), {"lang": "en"})
    doc = r.json()["jobs"][0]["document_id"]
    r = httpx.patch(f"{url}/v1/documents/{doc}", json={"metadata": {"Bad": 1}}, headers=h)
    assert (r.status_code, r.json()["code"], r.json()["key"]) == (422, "invalid_metadata", "Bad")
    assert httpx.get(f"{url}/v1/documents/{doc}", headers=h).json()["metadata"] == {"lang": "en"}
    for where, key in (({"year": {"$gt": "soon"}}, "year"), ({"x": {"$like": 1}}, "$like")):
        r = httpx.post(
            f"{url}/v1/datasets/default/search",
            json={"query": "glacier", "where": where},
            headers=h,
        )
        assert (r.status_code, r.json()["code"], r.json()["key"]) == (422, "invalid_filter", key)
        r = httpx.get(f"{url}/v1/jobs", params={"where": json.dumps(where)}, headers=h)
        assert (r.status_code, r.json()["code"]) == (422, "invalid_filter")
    r = httpx.get(f"{url}/v1/datasets/default/documents", params={"where": "{"}, headers=h)
    assert (r.status_code, r.json()["code"]) == (422, "invalid_filter")


def test_the_command_line_sets_filters_and_switches(database_url, make_ctx, capsys, tmp_path):
    ctx = make_ctx()
    de, en = tmp_path / "de.txt", tmp_path / "en.txt"
    de.write_bytes(text("harbour"))
    en.write_bytes(text("orchard"))
    code, out, _ = run(
        capsys, "ingest", str(de), "--meta", "lang=de", "--meta", "year=2021", "--json"
    )
    assert code == 0, out
    made_de = json.loads(out)[0]
    code, out, _ = run(
        capsys, "ingest", str(en), "--meta", "lang=en", "--meta", 'team=["a"]', "--json"
    )
    made_en = json.loads(out)[0]
    for made in (made_de, made_en):
        assert run_job(made["job_id"], ctx=ctx).result == "succeeded"

    code, out, _ = run(capsys, "search", "section", "--where", "lang=de", "--k", "50", "--json")
    assert code == 0 and {h["document_id"] for h in json.loads(out)} == {made_de["document_id"]}
    code, out, _ = run(
        capsys, "search", "section", "--where", "year>=2020", "--mode", "lexical", "--json"
    )
    assert {h["document_id"] for h in json.loads(out)} == {made_de["document_id"]}
    code, out, _ = run(capsys, "search", "section", "--where", "team~a,b", "--json")
    assert {h["document_id"] for h in json.loads(out)} == {made_en["document_id"]}
    code, out, _ = run(capsys, "jobs", "--where", "year?", "--json")
    assert [j["id"] for j in json.loads(out)] == [made_de["job_id"]]
    code, out, _ = run(capsys, "documents", "--where", "lang!=de", "--json")
    assert [d["document_id"] for d in json.loads(out)] == [made_en["document_id"]]

    doc = str(made_de["document_id"])
    code, out, _ = run(capsys, "documents", doc, "--meta", "lang=fr", "--json")
    assert code == 0 and json.loads(out)["metadata"] == {"lang": "fr"}
    code, out, _ = run(capsys, "search", "section", "--where", "lang=fr", "--json")
    assert {h["document_id"] for h in json.loads(out)} == {made_de["document_id"]}

    # bad input: exit code 2 and the key named
    code, _, err = run(capsys, "ingest", str(de), "--meta", "Lang=de")
    assert code == 2 and "'Lang'" in err
    code, _, err = run(capsys, "documents", doc, "--meta", "_x=1")
    assert code == 2 and "'_x'" in err
    code, _, err = run(capsys, "search", "section", "--where", "year>=soon")
    assert code == 2 and "'year'" in err
    code, _, err = run(capsys, "jobs", "--where", "nonsense")
    assert code == 2

    # a chunk switched off and on
    code, out, _ = run(capsys, "show", str(made_en["job_id"]), "--chunks", "--json")
    code, out, _ = run(capsys, "search", "orchard section", "--k", "100", "--json")
    cid = json.loads(out)[0]["chunk_id"]
    code, out, _ = run(capsys, "chunks", "disable", cid)
    assert code == 0 and "disabled" in out
    code, out, _ = run(capsys, "search", "orchard section", "--k", "100", "--json")
    assert cid not in {h["chunk_id"] for h in json.loads(out)}
    assert run(capsys, "chunks", "enable", cid)[0] == 0
    code, out, _ = run(capsys, "search", "orchard section", "--k", "100", "--json")
    assert cid in {h["chunk_id"] for h in json.loads(out)}
    assert run(capsys, "chunks", "disable", "no-such-000001")[0] == 1


def test_the_python_client_carries_metadata_and_where(api):
    from sluice.client import ApiError, Client

    server, ctx, token = api
    with Client(server.url, token) as client:
        made = client.upload(text("harbour"), filename="c.txt", metadata={"lang": "de", "n": 3})
        assert run_job(made["job_id"], ctx=ctx).result == "succeeded"
        other = client.upload(text("orchard"), filename="d.txt", metadata={"lang": "en"})
        assert run_job(other["job_id"], ctx=ctx).result == "succeeded"
        hits = client.search("section", k=50, where={"n": {"$gt": 2}})
        assert hits and {h["document_id"] for h in hits} == {made["document_id"]}
        doc = client.set_metadata(made["document_id"], {"lang": "en"})
        assert doc["metadata"] == {"lang": "en"}
        page = client.list_documents(where={"lang": "en"})
        assert {d["id"] for d in page["documents"]} == {made["document_id"], other["document_id"]}
        assert client.set_chunk_enabled(hits[0]["chunk_id"], False)["enabled"] is False
        with pytest.raises(ApiError) as err:
            client.upload(b"words", filename="e.txt", metadata={"_x": 1})
        assert err.value.code == "invalid_metadata"
