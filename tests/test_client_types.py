"""The client is held to the API's own contract, ``/openapi.json`` (``create_app().openapi()``):
every operation has a client method, every field an answer's schema has is a field of the client's
type (and no field is there that the API does not answer), every parameter and body field an
operation takes is a parameter of its method; the sync and async clients have the same methods; and
the package imports nothing else of Sluice (copied under another name, it still works)."""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import inspect
import shutil
import subprocess
import sys
import types
import typing
from functools import cache
from pathlib import Path
from typing import Any

import pytest

import sluice.client as client_package
from sluice.client import (
    ActionResult,
    AsyncClient,
    AuditEntry,
    AuditPage,
    Chunk,
    ChunkPage,
    ChunkState,
    Client,
    Dataset,
    DatasetCreated,
    DatasetDeleted,
    DatasetRenamed,
    Deleted,
    Document,
    DocumentJob,
    DocumentPage,
    Health,
    Hit,
    Job,
    JobPage,
    ListedDocument,
    Operations,
    Problem,
    Source,
    SourceRemoved,
    SyncResult,
    UploadedJob,
    Waiting,
)
from sluice.client.plans import Call, Items
from sluice.client.results import Result, field_types

# the API's schema -> the client's type
TYPES: dict[str, type[Result]] = {
    "HealthOut": Health,
    "DatasetOut": Dataset,
    "DatasetCreated": DatasetCreated,
    "DatasetRenamed": DatasetRenamed,
    "DatasetDeleted": DatasetDeleted,
    "UploadedJob": UploadedJob,
    "Waiting": Waiting,
    "JobOut": Job,
    "JobList": JobPage,
    "ActionOut": ActionResult,
    "DocumentJob": DocumentJob,
    "DocumentOut": Document,
    "ListedDocument": ListedDocument,
    "DocumentListPage": DocumentPage,
    "ChunkOut": Chunk,
    "ChunkPage": ChunkPage,
    "ChunkStateOut": ChunkState,
    "DeleteOut": Deleted,
    "HitOut": Hit,
    "AuditRow": AuditEntry,
    "AuditList": AuditPage,
    "SourceOut": Source,
    "SyncOut": SyncResult,
    "SourceRemoved": SourceRemoved,
    "ProblemOut": Problem,
}
# answers the client unwraps: the schema -> (its one field, a list of this type)
ENVELOPES: dict[str, tuple[str, type[Result]]] = {
    "DatasetList": ("datasets", Dataset),
    "UploadAccepted": ("jobs", UploadedJob),
    "DocumentList": ("documents", Document),
    "SearchOut": ("hits", Hit),
    "SourceList": ("sources", Source),
}
# a request field the method takes under another name
ALIASES = {"file": {"path_or_bytes", "files"}, "Last-Event-ID": {"last_event_id"}}
JSON_TYPES = {"integer": int, "string": str, "number": float, "boolean": bool}


@cache
def openapi() -> dict[str, Any]:
    from sluice.api.server import create_app

    return create_app().openapi()


def schema(name: str) -> dict[str, Any]:
    return openapi()["components"]["schemas"][name]


def refs(node: Any) -> set[str]:
    """The component names a schema fragment refers to."""
    if isinstance(node, dict):
        found = {node["$ref"].rsplit("/", 1)[-1]} if "$ref" in node else set()
        return found.union(*(refs(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(refs(v) for v in node))
    return set()


def answered_schemas() -> set[str]:
    """Every schema an operation's answer uses (2xx and the problems), followed through refs."""
    todo = {
        name
        for ops in openapi()["paths"].values()
        for op in ops.values()
        for status, answer in op["responses"].items()
        if status.startswith("2") or status.startswith("4") or status.startswith("5")
        for name in refs(answer)
    }
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen or name in ("HTTPValidationError", "ValidationError"):
            continue
        seen.add(name)
        todo |= refs(schema(name))
    return seen


def operations() -> dict[str, list[Call[Any, Any] | Items[Any, Any]]]:
    """The client's methods by the API operation each calls (``GET /v1/jobs``)."""
    found: dict[str, list[Call[Any, Any] | Items[Any, Any]]] = {}
    for value in vars(Operations).values():
        if isinstance(value, Call | Items):
            found.setdefault(value.route, []).append(value)
    return found


def api_operations() -> dict[str, dict[str, Any]]:
    return {
        f"{method.upper()} {path}": op
        for path, ops in openapi()["paths"].items()
        for method, op in ops.items()
    }


def test_every_api_operation_has_a_client_method_and_every_method_an_operation():
    api, client = set(api_operations()), set(operations())
    assert not api - client, f"API operations with no client method: {sorted(api - client)}"
    assert not client - api, f"client methods of no API operation: {sorted(client - api)}"


def test_every_schema_an_answer_uses_is_a_client_type_with_the_same_fields():
    unknown = answered_schemas() - set(TYPES) - set(ENVELOPES) - {"WhereFilter"}
    assert not unknown, f"schemas the API answers with that the client has no type for: {unknown}"
    faults = []
    for name, cls in TYPES.items():
        properties = schema(name)["properties"]
        fields = set(field_types(cls))
        for missing in sorted(set(properties) - fields):
            faults.append(f"{cls.__name__} lacks {missing!r} (the API's {name} answers it)")
        for stale in sorted(fields - set(properties)):
            faults.append(f"{cls.__name__}.{stale}: not in the API's {name}")
        for field in sorted(set(properties) & fields):
            faults += type_faults(cls, field, properties[field], name)
    for name, (field, cls) in ENVELOPES.items():
        properties = schema(name)["properties"]
        if set(properties) != {field}:
            faults.append(f"{name} is no longer only {field!r}: {sorted(properties)}")
        elif refs(properties[field]) != {_schema_of(cls)}:
            faults.append(f"{name}.{field} is not a list of {cls.__name__}")
    assert not faults, "\n".join(faults)


def _schema_of(cls: type[Result]) -> str:
    return next(name for name, c in TYPES.items() if c is cls)


def _arms(hint: Any) -> set[Any]:
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        return set(typing.get_args(hint))
    return {hint}


def type_faults(cls: type[Result], field: str, prop: dict[str, Any], name: str) -> list[str]:
    """How the client's type of one field disagrees with the schema's: null allowed or not, and
    the JSON type of the value (an integer, a string, a list, an object, another schema)."""
    hint = field_types(cls)[field]
    arms = _arms(hint)
    options = prop.get("anyOf", [prop])
    nullable = any(o.get("type") == "null" for o in options)
    faults = []
    if nullable and type(None) not in arms:
        faults.append(f"{cls.__name__}.{field}: the API's {name} answers null; the type is {hint}")
    values = [o for o in options if o.get("type") != "null"]
    for option in values:
        if "$ref" in option:
            want = TYPES.get(option["$ref"].rsplit("/", 1)[-1])
            if want not in arms:
                faults.append(f"{cls.__name__}.{field}: {want} expected, the type is {hint}")
        elif option.get("type") in JSON_TYPES:
            want_type = JSON_TYPES[option["type"]]
            if want_type not in arms and not (want_type is int and float in arms):
                faults.append(f"{cls.__name__}.{field}: {want_type} expected, the type is {hint}")
        elif option.get("type") in ("array", "object"):
            origin = list if option["type"] == "array" else dict
            if not any(typing.get_origin(a) is origin for a in arms):
                faults.append(f"{cls.__name__}.{field}: {origin} expected, the type is {hint}")
    return faults


def test_every_parameter_and_body_field_an_operation_takes_is_a_parameter_of_its_method():
    faults = []
    for route, op in api_operations().items():
        taken = {p["name"] for p in op.get("parameters", []) if p["in"] in ("query", "header")} - {
            "if-none-match"
        }
        for content in op.get("requestBody", {}).get("content", {}).values():
            body = content["schema"]
            body = schema(next(iter(refs(body)))) if "$ref" in body else body
            taken |= set(body.get("properties", {}))
        params = {p for method in operations().get(route, []) for p in method.signature.parameters}
        for name in sorted(taken):
            if name not in params and not ALIASES.get(name, set()) & params:
                faults.append(f"{route}: the API takes {name!r}; no client method does")
    assert not faults, "\n".join(faults)


def test_search_takes_every_field_of_the_apis_search_body_by_name():
    params = Operations.search.signature.parameters
    fields = set(schema("SearchIn")["properties"])
    assert not fields - set(params), f"search() lacks {sorted(fields - set(params))}"


def test_the_sync_and_async_clients_have_the_same_methods():
    sync, other = Client("http://127.0.0.1:9", "k"), AsyncClient("http://127.0.0.1:9", "k")
    try:
        for name, value in vars(Operations).items():
            if isinstance(value, Call):
                assert not inspect.iscoroutinefunction(getattr(sync, name)), name
                assert inspect.iscoroutinefunction(getattr(other, name)), name
            elif isinstance(value, Items):
                assert inspect.isgeneratorfunction(getattr(sync, name)), name
                assert inspect.isasyncgenfunction(getattr(other, name)), name
            else:
                continue
            assert inspect.signature(getattr(sync, name)) == inspect.signature(getattr(other, name))
            assert getattr(sync, name).__doc__, f"{name} says what it does"
    finally:
        sync.close()
        asyncio.run(other.aclose())


PACKAGE = Path(client_package.__file__).resolve().parent


def test_the_client_imports_nothing_else_of_sluice():
    foreign = []
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            foreign += [
                f"{path.name}:{node.lineno} {n}" for n in names if n.split(".")[0] == "sluice"
            ]
    assert not foreign, "the client must stay copyable:\n" + "\n".join(foreign)


def test_a_copy_of_the_client_under_another_name_works_without_sluice(tmp_path):
    shutil.copytree(
        PACKAGE, tmp_path / "vendored_sluice_api", ignore=shutil.ignore_patterns("__pycache__")
    )
    script = (
        "import sys, vendored_sluice_api as s\n"
        "c = s.Client('http://127.0.0.1:9', 'k', dataset='docs')\n"
        "job = s.Job.from_dict({'id': 1, 'status': 'pending', 'surprise': True})\n"
        "assert job['status'] == 'pending' and job.raw['surprise'] and job.final is None\n"
        "c.close()\n"
        "assert not [m for m in sys.modules if m == 'sluice' or m.startswith('sluice.')]\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_results_read_as_the_dicts_they_were_and_keep_what_they_do_not_know():
    raw = {
        "job_id": 7,
        "document_id": 3,
        "filename": "a.txt",
        "status": "pending",
        "existing": False,
        "new_field": [1],
    }
    job = UploadedJob.from_dict(raw)
    assert job.job_id == job["job_id"] == 7 and job.get("nope", 5) == 5
    assert job["new_field"] == [1] and "new_field" in job and job.raw == raw
    assert job == raw and job == UploadedJob.from_dict(dict(raw))
    assert job.external_id is None and dataclasses.is_dataclass(job)
    with pytest.raises(KeyError):
        job["nope"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.job_id = 8  # type: ignore[misc]
    action = ActionResult.from_dict(
        {"ok": True, "message": "m", "job": {"id": 1, "status": "pending", "waiting": None}}
    )
    assert isinstance(action.job, Job) and action["job"]["status"] == "pending"
    assert action.warnings == [] and action.queue_note == ""
