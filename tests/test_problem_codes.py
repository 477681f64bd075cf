"""Every problem code the API can answer is a row of docs/api.md's table of errors, with its status.

The codes are collected from the code itself, so a new one cannot go undocumented:

- the ``code`` (and ``status``) of every ``OperationError`` subclass (sluice.errors; one handler
  answers them all, sluice.api.problems), and the codes their raise sites pass as literals;
- every ``Problem(status, "code", ...)`` and ``problem_response(status, "code", ...)`` literal in
  sluice.api, and its tables of codes (``CODES``, ``*STATUS``);
- the codes of the ``PipelineError``s an upload is refused with before anything is stored (the
  functions the upload path runs, read with ``ast``: their ``IngestResult`` becomes the answer),
  and the codes of a dataset's rename and delete refusals (sluice.ops.dataset_admin).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import sluice
from sluice import errors
from sluice.api.problems import Problem
from sluice.errors import OperationError

PACKAGE = Path(sluice.__file__).resolve().parent
DOCS = PACKAGE.parent / "docs" / "api.md"
BASE_CODE = OperationError.code
# The upload path: what runs between the request and its answer, where a PipelineError's code (or
# an IngestResult's error_code) becomes the problem's code. A module, or a package (its modules),
# under sluice/; None: all of it, else the functions named (each must be found there).
UPLOAD_PATH: dict[str, tuple[str, ...] | None] = {
    "ops/ingest": None,
    "api/uploads": None,
    "api/routes_uploads": None,
    "api/scoped": ("type_refusal", "check_upload", "upload"),
    "pipeline/parsing/parse": ("sniff_type", "archive_type"),
    "pipeline/parsing/formats": ("archive_type", "_bomb"),
    "storage/db": ("refuse_if_deleting",),
    "storage/jobs": ("_contended",),
    "storage/replacements": ("_conflict",),
    "storage/s3_blobs": ("_outage", "_auth_error"),
}

Codes = dict[str, set[int | None]]  # code -> the statuses it answers (None: unknown here)


def _import_all(*packages: str) -> None:
    for name in packages:
        package = importlib.import_module(name)
        for info in pkgutil.walk_packages(package.__path__, f"{name}."):
            importlib.import_module(info.name)


def operation_errors() -> list[type[OperationError]]:
    """OperationError and every subclass of it in sluice.ops and sluice.api, by __subclasses__()."""
    _import_all("sluice.ops", "sluice.api")
    found: list[type[OperationError]] = []
    stack: list[type[OperationError]] = [OperationError]
    while stack:
        cls = stack.pop()
        if cls not in found:
            found.append(cls)
            stack += cls.__subclasses__()
    return found


def _sources(under: str = "") -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted((PACKAGE / under).rglob("*.py")):
        yield path, ast.parse(path.read_text(), filename=str(path))


def _name(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    return func.attr if isinstance(func, ast.Attribute) else ""


def _literal(node: ast.expr | None) -> str | None:
    """A string literal, or the literal fallback of ``x or "code"``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
        return _literal(node.values[-1])
    return None


def _int(node: ast.expr | None) -> int | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    return None


def _calls(tree: ast.AST) -> Iterator[ast.Call]:
    return (n for n in ast.walk(tree) if isinstance(n, ast.Call))


def _kwarg(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _takes_code_first(cls: type) -> bool:
    params = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    return bool(params) and params[0] == "code"


def _add(codes: Codes, code: str | None, status: int | None) -> None:
    if code:
        codes[code].add(status)


def class_codes(codes: Codes) -> None:
    """The class codes, and the literal codes raise sites pass (``code=``, or a first ``code``)."""
    classes = {c.__name__: c for c in operation_errors() if c is not Problem}
    for cls in classes.values():
        if cls is not OperationError and not _takes_code_first(cls):
            _add(codes, cls.code, cls.status)
    for _, tree in _sources():
        for call in _calls(tree):
            cls = classes.get(_name(call.func))
            if cls is None:
                continue
            if issubclass(cls, OperationError):
                given = _literal(_kwarg(call, "code"))
                if given is None and cls is OperationError:
                    given = BASE_CODE  # a bare OperationError answers the base's code
                _add(codes, given, cls.status)
            if _takes_code_first(cls) and call.args:
                _add(codes, _literal(call.args[0]), None)


def api_codes(codes: Codes) -> None:
    """Problem(...) and problem_response(...) literals, and the code tables of sluice.api."""
    for _, tree in _sources("api"):
        for call in _calls(tree):
            if _name(call.func) in ("Problem", "problem_response") and len(call.args) >= 2:
                _add(codes, _literal(call.args[1]), _int(call.args[0]))
        for node in tree.body:
            if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)):
                continue
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            pairs = list(zip(node.value.keys, node.value.values, strict=True))
            if any(n.endswith("STATUS") for n in names):
                for key, value in pairs:
                    _add(codes, _literal(key), _int(value))
            if "CODES" in names:
                for key, value in pairs:
                    _add(codes, _literal(value), _int(key))


def _pipeline_error_names() -> set[str]:
    names, stack = set(), [errors.PipelineError]
    while stack:
        cls = stack.pop()
        names.add(cls.__name__)
        stack += cls.__subclasses__()
    return names


def upload_codes(codes: Codes) -> None:
    """The codes an upload is refused with, at the status the upload route gives each."""
    from sluice.api.routes_uploads import REFUSAL_STATUS

    raisers = _pipeline_error_names()
    for relative, functions in UPLOAD_PATH.items():
        where = PACKAGE / relative
        paths = sorted(where.rglob("*.py")) if where.is_dir() else [where.with_suffix(".py")]
        trees = [ast.parse(path.read_text(), filename=str(path)) for path in paths]
        scopes: list[ast.AST] = list(trees)
        if functions is not None:
            defs = {
                n.name: n
                for tree in trees
                for n in ast.walk(tree)
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
            }
            missing = [f for f in functions if f not in defs]
            assert not missing, f"sluice/{relative} has no {missing}: update UPLOAD_PATH"
            scopes = [defs[f] for f in functions]
        for scope in scopes:
            for call in _calls(scope):
                name = _name(call.func)
                code = None
                if name in raisers and call.args:
                    code = _literal(call.args[0])
                elif name == "FormatRefusal" and len(call.args) >= 2:
                    code = _literal(call.args[1])  # (kind, code, message, hint)
                elif name == "IngestResult":
                    code = _literal(_kwarg(call, "error_code"))
                if code:
                    _add(codes, code, REFUSAL_STATUS.get(code, 422))


def dataset_admin_codes(codes: Codes) -> None:
    """A rename's or a delete's refusal (AdminResult's third field), at the route's status."""
    from sluice.api.routes_datasets import STATUS

    path = PACKAGE / "ops" / "dataset_admin.py"
    for call in _calls(ast.parse(path.read_text())):
        if _name(call.func) == "AdminResult" and len(call.args) >= 3:
            code = _literal(call.args[2])
            if code:
                _add(codes, code, STATUS.get(code, 409))


def answerable() -> Codes:
    codes: Codes = defaultdict(set)
    class_codes(codes)
    api_codes(codes)
    upload_codes(codes)
    dataset_admin_codes(codes)
    return codes


def documented() -> dict[str, str]:
    """docs/api.md's table of errors: code -> its status cell."""
    text = DOCS.read_text()
    section = text.split("\n## Errors\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z0-9_<>]+)` \| ([^|]*) \|", section, re.MULTILINE)
    return {code: status for code, status in rows}


def test_every_code_the_api_answers_is_documented_with_its_status():
    codes, table = answerable(), documented()
    assert {"not_found", "empty_file", "invalid_filter", "idempotency_in_flight"} <= set(codes)
    missing = sorted(set(codes) - set(table))
    assert not missing, f"codes the API answers that docs/api.md's table of errors lacks: {missing}"
    wrong = {
        code: sorted(s for s in statuses if s is not None and str(s) not in table[code])
        for code, statuses in codes.items()
    }
    wrong = {code: statuses for code, statuses in wrong.items() if statuses}
    assert not wrong, f"statuses missing from their code's row in docs/api.md: {wrong}"


def test_every_operation_error_has_its_own_code_status_and_hint():
    """A refusal answers by its own code and hint; only Problem (a route's own answer) and the
    classes whose instances carry their code (``code`` first) take the base's."""
    faults = []
    for cls in operation_errors():
        if cls in (OperationError, Problem):
            continue
        where = f"{cls.__module__}.{cls.__qualname__}"
        if cls.code == BASE_CODE and not _takes_code_first(cls):
            faults.append(f"{where}: no code of its own")
        if not 400 <= cls.status < 600:
            faults.append(f"{where}: status {cls.status}")
        if not cls.hint:
            faults.append(f"{where}: no hint")
    assert not faults, faults
