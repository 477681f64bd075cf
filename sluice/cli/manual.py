"""The command reference, made from the parser itself: ``docs/cli.md`` is its output, so the help
and the reference cannot disagree (``python -m sluice.cli.manual > docs/cli.md``)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator

from sluice.cli.main import build_parser

WIDTH = 100
HEADER = (
    "# The `sluice` command\n\n"
    "Made by `python -m sluice.cli.manual > docs/cli.md` from the parser that `sluice --help` "
    "prints; a test fails when the two disagree. Run it as `.venv/bin/sluice`, or with `.venv/bin` "
    "on your `PATH`.\n"
)


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Each subcommand's help line and parser, in the order they were added, depth first."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, child in action.choices.items():
                yield helps.get(name, ""), child


def _option(action: argparse.Action) -> str:
    name = ", ".join(action.option_strings) or action.metavar or action.dest
    return f"- `{name}`: {action.help}" if action.help else f"- `{name}`"


def _sections(parser: argparse.ArgumentParser, depth: int) -> Iterator[str]:
    for summary, child in _subcommands(parser):
        nested = list(_subcommands(child))
        yield f"{'#' * depth} `{child.prog}`\n" + (f"\n{summary}\n" if summary else "")
        if not nested:
            yield f"```\n{child.format_usage().removeprefix('usage: ').rstrip()}\n```\n"
            options = [
                a for a in child._actions if a.help != argparse.SUPPRESS and a.dest != "help"
            ]
            if options:
                yield "\n".join(_option(a) for a in options) + "\n"
        yield from _sections(child, depth + 1)


def render() -> str:
    """The whole reference as Markdown, at a fixed width: the same on every terminal."""
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(WIDTH)
    try:
        parser = build_parser()
        parts = [HEADER, f"```\n{parser.format_usage().removeprefix('usage: ').rstrip()}\n```\n"]
        parts += list(_sections(parser, 2))
    finally:
        if before is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = before
    return "\n".join(parts)


if __name__ == "__main__":
    sys.stdout.write(render())
