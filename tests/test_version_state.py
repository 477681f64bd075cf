"""A job's place among its document's versions, where a job is shown (the Jobs page and
``sluice show JOB``) as the Document page shows it: whether the job serves search, which job
replaced it, and the version line of its external id."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sluice.ops.ingest import ingest_bytes
from sluice.pipeline.running.runner import run_job
from tests.support.apptest import assert_ok, open_console, texts

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.parametrize("database_url", ["sqlite"], indirect=True),
]

OLD = b"Kestrels hover over the meadow before they drop on a vole below. " * 30
NEW = b"Kestrels hover over the dunes before they drop on a beetle below. " * 30
CORRUPT = b"%PDF-1.7\n1 0 obj <<>> garbage that is no PDF at all\n" * 4


def _version(ctx, data: bytes, filename: str = "kestrel.txt") -> int:
    made = ingest_bytes(ctx, data, dataset="default", filename=filename, external_id="kestrel")
    assert made.accepted and made.job_id is not None, made.message
    run_job(made.job_id, ctx=ctx)
    return made.job_id


@pytest.fixture
def versions(database_url, ctx) -> tuple[int, int, int]:
    """Version 1 built then replaced by version 2, and a version 3 whose build failed."""
    first = _version(ctx, OLD)
    second = _version(ctx, NEW)
    failed = _version(ctx, CORRUPT, filename="kestrel.pdf")
    return first, second, failed


def _jobs_page_says(job_id: int) -> str:
    at = open_console("jobs", query={"job": str(job_id)})
    assert_ok(at)
    return texts(at)


def test_the_jobs_page_says_what_each_version_is_to_search(versions):
    first, second, failed = versions
    said = _jobs_page_says(first)
    assert f"Replaced by job {second}, which serves search now" in said
    assert "external id kestrel: replaced by document" in said
    said = _jobs_page_says(second)
    assert "Serves search (the document's active job)" in said
    assert "version 2 (live); version 3 (replacement) failed" in said
    said = _jobs_page_says(failed)
    assert f"Does not serve search: job {second} does" in said
    assert "replacement failed; version 2 still serving" in said


def _sluice(*args: str) -> subprocess.CompletedProcess:
    """The installed ``sluice`` command, in a process of its own."""
    argv = [str(Path(sys.executable).with_name("sluice")), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=dict(os.environ))


def test_sluice_show_says_what_the_job_is_to_search(versions):
    first, second, failed = versions
    shown = _sluice("show", str(first))
    assert shown.returncode == 0, shown.stderr
    [line] = [x for x in shown.stdout.splitlines() if x.startswith("search ")]
    assert f"replaced by job {second}, which serves search now" in line
    assert "external id kestrel: replaced by document" in line
    shown = _sluice("show", str(failed), "--json")
    assert shown.returncode == 0, shown.stderr
    version = json.loads(shown.stdout)["version"]
    assert (version["serves_search"], version["serving_job_id"], version["replaced_by_job"]) == (
        False,
        second,
        None,
    )
    assert version["version_state"] == "replacement_failed"
    assert version["version_message"] == "replacement failed; version 2 still serving"
