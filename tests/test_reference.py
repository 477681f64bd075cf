"""The reference answers: every operation of ``/openapi.json`` (read from a real API process) has
a request example for each body it takes, and a schema and an example for its 2xx answer; every
example there validates against its schema; every problem code an error answer lists is a row of
docs/api.md's table of errors at that status; and ``/reference`` draws them in Chromium."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator

from tests.support.api_server import ApiServer
from tests.test_problem_codes import documented

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
SEARCH = "POST /v1/datasets/{dataset}/search"


@pytest.fixture
def served(sluice_env, tmp_path) -> Iterator[tuple[ApiServer, dict[str, Any]]]:
    """A real API process and the document it serves."""
    server = ApiServer(dict(os.environ), tmp_path / "api.log")
    server.start()
    try:
        yield server, httpx.get(f"{server.url}/openapi.json", timeout=30).json()
    finally:
        server.stop()


@pytest.fixture
def spec(served) -> dict[str, Any]:
    return served[1]


def _operations(spec: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for path, item in spec["paths"].items():
        for method, op in item.items():
            yield f"{method.upper()} {path}", op


def _resolve(spec: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = spec["components"]["schemas"][schema["$ref"].split("/")[-1]]
    return schema


def _example(spec: dict[str, Any], media: dict[str, Any]) -> Any:
    """What the page draws as a media type's example (None: there is none)."""
    if "example" in media:
        return media["example"]
    if media.get("examples"):
        return next(iter(media["examples"].values())).get("value")
    found = _resolve(spec, media.get("schema", {})).get("examples")
    return found[0] if found else None


def _media(op: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for kind, content in op.get("requestBody", {}).get("content", {}).items():
        yield f"request {kind}", content
    for status, answer in op["responses"].items():
        for kind, content in answer.get("content", {}).items():
            yield f"{status} {kind}", content


def test_every_operation_has_examples_and_a_success_schema(spec):
    faults = []
    for name, op in _operations(spec):
        for kind, media in op.get("requestBody", {}).get("content", {}).items():
            if _example(spec, media) is None:
                faults.append(f"{name}: no example request ({kind})")
        success = {s: a for s, a in op["responses"].items() if s.startswith("2")}
        if not success:
            faults.append(f"{name}: no 2xx answer")
        for status, answer in success.items():
            if not answer.get("content"):
                faults.append(f"{name}: {status} has no content")
            for kind, media in answer.get("content", {}).items():
                if not media.get("schema"):
                    faults.append(f"{name}: {status} {kind} has no schema")
                if _example(spec, media) is None:
                    faults.append(f"{name}: {status} {kind} has no example")
    assert len(list(_operations(spec))) >= 28
    assert not faults, "\n".join(faults)


def _validate(spec: dict[str, Any], schema: dict[str, Any], value: Any) -> list[str]:
    root = {**schema, "components": spec["components"]}  # "#/components/..." resolves here
    return [e.message for e in Draft202012Validator(root).iter_errors(value)]


def _schema_examples(node: Any, at: str) -> Iterator[tuple[str, dict[str, Any], Any]]:
    """Every ``examples`` of a schema, nested ones included (a field's own)."""
    if isinstance(node, dict):
        for value in node.get("examples", []) if isinstance(node.get("examples"), list) else []:
            yield at, node, value
        for key, child in node.items():
            if key != "examples":
                yield from _schema_examples(child, f"{at}/{key}")
    elif isinstance(node, list):
        for i, child in enumerate(node):
            yield from _schema_examples(child, f"{at}/{i}")


def test_every_example_validates_against_its_schema(spec):
    faults, checked = [], set()
    for name, op in _operations(spec):
        for kind, media in _media(op):
            value = _example(spec, media)
            if value is not None and "text/event-stream" not in kind:
                faults += [f"{name} {kind}: {m}" for m in _validate(spec, media["schema"], value)]
                checked.add(name)
    for at, schema, value in _schema_examples(spec["components"]["schemas"], "#"):
        faults += [f"{at}: {m}" for m in _validate(spec, schema, value)]
    assert not faults, "\n".join(faults)
    assert checked == {n for n, _ in _operations(spec)}


def test_the_problem_codes_of_each_answer_are_documented_at_that_status(spec):
    table, faults, listed = documented(), [], set()
    for name, op in _operations(spec):
        for status, answer in op["responses"].items():
            for code in answer.get("x-problem-codes", []):
                listed.add(code)
                if code not in table or status not in table[code]:
                    faults.append(f"{name} {status}: {code} (docs/api.md: {table.get(code)})")
    search = spec["paths"]["/v1/datasets/{dataset}/search"]["post"]["responses"]
    assert {"bad_query", "invalid_filter", "invalid_request"} <= set(
        search["422"]["x-problem-codes"]
    )
    assert {"empty_file", "unreadable_archive", "unauthorized"} <= listed
    assert not faults, "\n".join(faults)


@pytest.mark.browser
@pytest.mark.timeout(120)
def test_the_reference_page_draws_schemas_and_examples(served):
    from playwright.sync_api import sync_playwright

    server, spec = served
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            asked: list[str] = []
            page.on("request", lambda r: asked.append(r.url))
            page.goto(f"{server.url}/reference", timeout=30_000)
            page.wait_for_selector("body[data-drawn=yes]", timeout=30_000)
            sections = page.locator("section.op")
            assert sections.count() == len(list(_operations(spec)))
            search = page.locator(f'section[data-op="{SEARCH}"]')
            body = search.locator(".schema").first.inner_text()
            assert "query" in body and "min_score" in body and "WhereFilter" in body
            request = search.locator("pre.example").first.inner_text()
            assert '"query": "holidays per year"' in request
            ok = search.locator('.response[data-status="200"]')
            tree = ok.locator(".schema")
            assert "array of HitOut" in tree.inner_text() and "snippet" not in tree.inner_text()
            tree.locator("details details > summary").first.click()  # open a hit's own fields
            assert "snippet" in tree.inner_text()
            assert '"chunk_id"' in ok.locator("pre.example").inner_text()
            refused = search.locator('.response[data-status="422"]').inner_text()
            assert "invalid_filter" in refused and "bad_query" in refused
            assert "not_found" in page.locator("#problem").inner_text()
            assert all(u.startswith(server.url) for u in asked), asked  # nothing from elsewhere
        finally:
            browser.close()
