"""The ``sluice`` command line: a parser and thin commands over ``sluice.ops``."""

from sluice.cli.main import main

__all__ = ["main"]
