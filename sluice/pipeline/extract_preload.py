"""Imported by the parse fork server (``sluice.pipeline.parse``) before it forks any child: the
extraction module and PyMuPDF, then ``gc.freeze()``, so that a child's collections never walk (and
copy, page by page) the fork server's objects."""

import gc

import pymupdf  # noqa: F401

from sluice.pipeline import extract, forking  # noqa: F401

gc.freeze()
