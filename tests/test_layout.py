"""The package's floors only look down: no module imports from a floor above its own.

    sluice.errors < sluice.storage < sluice.pipeline < sluice.ops < sluice.console, sluice.cli

The two front ends sit side by side and never import each other. Imports are read from the source
(every ``import`` and ``from ... import``, also those inside functions), so a lazy import cannot
hide an upward arrow.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import sluice

PACKAGE = Path(sluice.__file__).resolve().parent
FLOORS = {"errors": 0, "storage": 1, "pipeline": 2, "ops": 3, "console": 4, "cli": 4}


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
            base = importlib.util.resolve_name("." * node.level + (node.module or ""), package) \
                if node.level else node.module or ""
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
            if FLOORS[other] > FLOORS[own] or (FLOORS[other] == FLOORS[own]):
                upward.append(f"{module}:{line} imports {target}")
    assert not upward, "imports that look up a floor (or sideways between front ends):\n" + "\n".join(upward)


def test_every_floor_is_a_module_or_package():
    assert sorted(FLOORS) == sorted(
        p.stem if p.is_file() else p.name
        for p in PACKAGE.iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists())
    )


def test_no_generic_top_level_packages_are_installed():
    for name in ("storage", "pipeline", "console"):
        assert importlib.util.find_spec(name) is None, f"a top-level {name!r} package is importable"
