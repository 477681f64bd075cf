"""Imported by the parse fork server (``sluice.pipeline.parsing.parse``) before it forks any child:
the extraction module and PyMuPDF (without its optional layout modules: they would more than double
the server's memory, and every fork copies the page tables of all of it), then ``gc.freeze()``, so
that a child's collections never walk (and copy, page by page) the fork server's objects."""

import gc

from sluice.pipeline.parsing import (
    extract,  # noqa: F401
)

extract.skip_optional_pymupdf_imports()

import pymupdf  # noqa: E402, F401

gc.freeze()
