"""The package's floors only look down: no module imports from a floor above its own.

    the ground (errors, settings, files, faults) < sluice.storage, sluice.servers < sluice.pipeline
        < sluice.ops < sluice.console, sluice.cli, sluice.api, sluice.worker, sluice.exporter
        < sluice.client

The ground floor's modules may import each other; the other floors that share a level (storage and
servers, the two front ends) sit side by side and never import each other. Imports are read from the
source (every ``import`` and ``from ... import``, also those inside functions), so a lazy import
cannot hide an upward arrow.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import sluice

PACKAGE = Path(sluice.__file__).resolve().parent
GROUND = ("errors", "settings", "files", "faults")
FLOORS = {
    **dict.fromkeys(GROUND, 0),
    "storage": 1,
    "servers": 1,
    "pipeline": 2,
    "ops": 3,
    "console": 4,
    "cli": 4,
    "api": 4,
    "worker": 4,
    "exporter": 4,
    "client": 5,  # the API's Python client: for applications, imports nothing of sluice
}


def _floor(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "sluice" or len(parts) < 2:
        return None
    return parts[1]


def _imports(path: Path, module: str) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = (
                importlib.util.resolve_name("." * node.level + (node.module or ""), package)
                if node.level
                else node.module or ""
            )
            found.append((node.lineno, base))
            # `from sluice import ops` names a floor through the imported name
            if base == "sluice":
                found += [(node.lineno, f"sluice.{alias.name}") for alias in node.names]
    return found


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield path, ".".join(parts)


def test_no_module_imports_from_a_floor_above_it():
    upward = []
    for path, module in _modules():
        own = _floor(module)
        if own is None:
            continue
        for line, target in _imports(path, module):
            other = _floor(target)
            if other is None or other == own:
                continue
            if FLOORS[other] > FLOORS[own] or (FLOORS[other] == FLOORS[own] and own not in GROUND):
                upward.append(f"{module}:{line} imports {target}")
    assert not upward, (
        "imports that look up a floor (or sideways between front ends):\n" + "\n".join(upward)
    )


def test_every_floor_is_a_module_or_package():
    assert sorted(FLOORS) == sorted(
        p.stem if p.is_file() else p.name
        for p in PACKAGE.iterdir()
        if (p.suffix == ".py" and p.stem != "__init__")
        or (p.is_dir() and (p / "__init__.py").exists())
    )


def test_no_generic_top_level_packages_are_installed():
    for name in ("storage", "pipeline", "console"):
        assert importlib.util.find_spec(name) is None, f"a top-level {name!r} package is importable"


def _module_graph() -> dict[str, set[str]]:
    """Module -> the sluice modules it imports (a ``from package import name`` that names a module
    is an edge to that module, not to the package)."""
    modules = {module: path for path, module in _modules()}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = (
                    importlib.util.resolve_name("." * node.level + (node.module or ""), package)
                    if node.level
                    else node.module or ""
                )
                subs = [
                    f"{base}.{alias.name}"
                    for alias in node.names
                    if f"{base}.{alias.name}" in modules
                ]
                targets = subs if len(subs) == len(node.names) else [base, *subs]
            graph[module] |= {t for t in targets if t in modules and t != module}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_between_modules():
    """Lazy imports inside functions count: a cycle hidden in a function is still a cycle."""
    cycles = _cycles(_module_graph())
    assert not cycles, "modules that import each other, directly or around a loop:\n" + "\n".join(
        " <-> ".join(c) for c in cycles
    )


def _private_imports(path: Path, module: str) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = (
                importlib.util.resolve_name("." * node.level + (node.module or ""), package)
                if node.level
                else node.module or ""
            )
            if base.split(".")[0] != "sluice" or base == module:
                continue
            found += [
                f"{module}:{node.lineno} imports {base}.{a.name}"
                for a in node.names
                if a.name.startswith("_") and not a.name.startswith("__")
            ]
    return found


def test_no_module_imports_another_modules_private_names():
    private = [line for path, module in _modules() for line in _private_imports(path, module)]
    assert not private, (
        "private names imported across modules (make them public or pass them in):\n"
        + "\n".join(private)
    )


def test_no_two_modules_share_a_name():
    names: dict[str, list[str]] = {}
    for path, module in _modules():
        if path.name != "__init__.py":
            names.setdefault(path.stem, []).append(module)
    shared = {name: mods for name, mods in names.items() if len(mods) > 1}
    assert not shared, f"module names used twice: {shared}"


MAX_FUNCTION_LINES = 80


def _long_functions(path: Path, module: str, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """Functions (and methods, nested ones too) longer than ``limit`` lines, from def to end."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        f"{module}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > limit
    ]


def test_the_length_finder_finds_a_long_function(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "def short():\n    pass\n\n\nasync def long():\n" + "    x = 1\n" * 80 + "\n\nclass C:\n"
        "    def method(self):\n" + "        y = 2\n" * 79
    )
    assert _long_functions(source, "m") == ["m:5 long (81 lines)"]


def test_no_function_is_longer_than_80_lines():
    """A function that long holds steps without names: split it into functions that name them."""
    long = [line for path, module in _modules() for line in _long_functions(path, module)]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


MAX_MODULE_LINES = 900


def _long_modules(root: Path, limit: int = MAX_MODULE_LINES) -> list[str]:
    """Modules under ``root`` longer than ``limit`` lines: a room that holds several concepts."""
    return [
        f"{path.relative_to(root)} ({n} lines)"
        for path in sorted(root.rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > limit
    ]


def test_the_module_length_finder_finds_a_long_module(tmp_path):
    (tmp_path / "short.py").write_text("x = 1\n" * 900)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "long.py").write_text("x = 1\n" * 901)
    assert _long_modules(tmp_path) == ["pkg/long.py (901 lines)"]


def test_no_module_is_longer_than_900_lines():
    """A module that long is several concepts in one room: make it a package of modules."""
    long = _long_modules(PACKAGE)
    assert not long, f"modules over {MAX_MODULE_LINES} lines:\n" + "\n".join(long)


def _prefixed_families(folder: Path, size: int = 3) -> dict[str, list[str]]:
    """Modules of one folder whose names share a prefix (``sources_plan``, ``sources_listing``):
    ``size`` or more of them are a package waiting to be made."""
    families: dict[str, list[str]] = {}
    for path in sorted(folder.glob("*.py")):
        prefix, sep, _ = path.stem.partition("_")
        if sep and path.stem != "__init__":
            families.setdefault(prefix, []).append(path.stem)
    return {prefix: names for prefix, names in families.items() if len(names) >= size}


def test_the_family_finder_finds_a_flat_family(tmp_path):
    for name in ("sources_plan", "sources_listing", "sources_follow", "search", "audit_trail"):
        (tmp_path / f"{name}.py").write_text("")
    assert _prefixed_families(tmp_path) == {
        "sources": ["sources_follow", "sources_listing", "sources_plan"]
    }


def test_ops_has_no_flat_family_of_prefixed_modules():
    """A subsystem of several modules in ops is a package (``ops/sources/``), not a prefix."""
    families = _prefixed_families(PACKAGE / "ops")
    assert not families, f"make these packages of sluice.ops: {families}"


TOP_FLOOR = max(FLOORS.values()) - 1  # the processes' homes; the client stands apart above them


def _dynamic_imports(path: Path) -> list[int]:
    """Lines of calls that import a module by a string (``importlib.import_module``,
    ``__import__``): an arrow the floor test cannot read."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (
            (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
            or (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__"))
        )
    ]


def test_the_dynamic_import_finder_finds_one(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "import importlib\nfrom importlib import import_module\n"
        "a = importlib.import_module('x')\nb = import_module('y')\nc = __import__('z')\n"
    )
    assert _dynamic_imports(source) == [3, 4, 5]


def test_no_module_below_the_top_floor_imports_by_a_string():
    """Only the processes' homes (the CLI naming its commands) may import by name."""
    found = [
        f"{module}:{line}"
        for path, module in _modules()
        if (floor := _floor(module)) is not None and FLOORS[floor] < TOP_FLOOR
        for line in _dynamic_imports(path)
    ]
    assert not found, "imports by a string below the top floor:\n" + "\n".join(found)
