"""The README's code layout names every module of the package, and nothing that is not one, the way
tests/test_settings.py holds .env.example to the settings.

The layout is the first code block under ``## Code layout``: a tree, two spaces per level, where a
line's first word is a folder (``storage/``) or a module (``jobs.py``) of the folder above it, and
the rest of the line says what it is.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
ENTRY = re.compile(r"^(?P<indent> *)(?P<name>[\w.-]+(?:/|\.py))(?:\s+(?P<what>\S.*))?$")


def layout_block(text: str) -> list[str]:
    section = text.split("\n## Code layout\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```", 2)[1].splitlines()[1:]


def listed_modules(lines: list[str]) -> dict[str, str]:
    """{path of each module the tree lists: what its line says}, paths from the repository root."""
    folders: list[tuple[int, str]] = []  # (indent, path) of the folders above the current line
    found: dict[str, str] = {}
    for line in lines:
        m = ENTRY.match(line)
        if not m:
            continue
        indent, name = len(m["indent"]), m["name"]
        while folders and folders[-1][0] >= indent:
            folders.pop()
        path = (folders[-1][1] if folders else "") + name
        if name.endswith("/"):
            folders.append((indent, path))
        else:
            assert path not in found, f"{path} is listed twice in the README's layout"
            found[path] = (m["what"] or "").strip()
    return found


def package_modules() -> set[str]:
    return {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "sluice").rglob("*.py")
        if p.name != "__init__.py"
    }


def test_the_tree_reader_follows_folders():
    lines = [
        "sluice/",
        "  errors.py   the ground",
        "  storage/    state",
        "    jobs.py   transitions",
        "  ops/",
        "    reads.py  pages read",
        "tests/        pytest",
    ]
    assert listed_modules(lines) == {
        "sluice/errors.py": "the ground",
        "sluice/storage/jobs.py": "transitions",
        "sluice/ops/reads.py": "pages read",
    }


def test_readme_layout_lists_every_module_of_the_package_once_with_what_it_is():
    listed = listed_modules(layout_block(README.read_text()))
    actual = package_modules()
    named = {path for path in listed if path.startswith("sluice/")}
    assert named == actual, (
        f"missing from the README's code layout: {sorted(actual - named)}; "
        f"listed there but not a module: {sorted(named - actual)}"
    )
    unexplained = sorted(path for path in named if not listed[path])
    assert not unexplained, f"say in a few words what each of these is: {unexplained}"


def test_the_command_reference_is_the_parsers_own():
    """docs/cli.md is made from the parser; a command or option changed without it fails here."""
    from sluice.cli.manual import render

    assert (ROOT / "docs" / "cli.md").read_text() == render(), (
        "docs/cli.md is out of date: run `python -m sluice.cli.manual > docs/cli.md`"
    )
