"""Driving the console in-process with Streamlit's AppTest, against the test's real database.

AppTest runs the page scripts in this process, so the console uses the context the ``ctx`` fixture
installed (its SQLite file, the session's Redis and Chroma). Autorefresh never fires in AppTest:
tests call ``run()`` to refresh.
"""

from __future__ import annotations

import re
from pathlib import Path

from streamlit import config as st_config
from streamlit.testing.v1 import AppTest

APP = Path(__file__).resolve().parents[2] / "sluice" / "console" / "app.py"


def open_console(
    page: str | None = None, *, query: dict | None = None, timeout: float = 60
) -> AppTest:
    """The console on ``page`` (``"jobs"`` = views/jobs_page.py), after a first run of the entry
    point."""
    st_config.set_option("client.showErrorDetails", "full")
    at = AppTest.from_file(str(APP), default_timeout=timeout)
    for key, value in (query or {}).items():
        at.query_params[key] = value
    at.run()
    if page:
        at.switch_page(f"views/{page}_page.py")
        at.run()
    assert_ok(at)
    return at


def assert_ok(at: AppTest) -> None:
    assert not at.exception, "\n".join(
        str(e.value) + "\n" + "\n".join(e.stack_trace) for e in at.exception
    )


def texts(at: AppTest) -> str:
    """Everything the page wrote as text, for "does it say X" checks.

    User strings go into Markdown escaped (``sluice.console.ui.plain``); the escapes are dropped
    here, as the browser drops them, so checks read what a person sees.
    """
    parts = []
    for kind in (
        "markdown",
        "caption",
        "error",
        "warning",
        "info",
        "success",
        "subheader",
        "title",
        "text",
    ):
        parts += [str(e.value) for e in getattr(at, kind)]
    parts += [f"{m.label}: {m.value}" for m in at.metric]
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", "\n".join(parts))


def metric(at: AppTest, label: str) -> str:
    for m in at.metric:
        if m.label == label:
            return m.value
    raise AssertionError(f"no metric {label!r}; metrics: {[m.label for m in at.metric]}")


def select_rows(at: AppTest, key: str, rows: list[int]) -> None:
    at.session_state[key] = {"selection": {"rows": rows, "columns": [], "cells": []}}
