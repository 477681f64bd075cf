"""Every real sample PDF ends in the state the corpus table says; the worker survives all of
them."""

import re

from sluice.ops.ingest import ingest_path
from tests.support.helpers import wait_for

OK = "succeeded"
PASSWORD = ("failed", "user_action_required", "password_protected")
NO_TEXT = ("failed", "user_action_required", "no_text_even_by_ocr")  # OCR ran and found no words
UNREADABLE = ("failed", "permanent", "unreadable_pdf")


def expected_outcome(name: str):
    """The first table of tests/data/pdf-samples/README.md, by file-name prefix."""
    number = name.split("-", 1)[0]
    if number == "005":
        return PASSWORD
    if number in ("007", "019", "023"):
        return NO_TEXT
    if number == "017":
        return UNREADABLE
    if number in {
        "001",
        "002",
        "003",
        "004",
        "006",
        "009",
        "011",
        "014",
        "021",
        "025",
        "026",
        "008",
        "010",
        "012",
        "013",
        "015",
        "016",
        "018",
        "020",
        "022",
        "024",
    }:
        return OK
    raise AssertionError(f"{name} is not in the corpus table: classify it")


def test_every_sample_ends_as_its_table_says(ctx, samples, start_worker):
    from sluice.pipeline.queueing.publishing import publish

    table = (samples / "README.md").read_text()
    assert "005-libreoffice-writer-password.pdf" in table and re.search(r"\b017-", table)
    worker = start_worker()
    files = sorted(samples.glob("*.pdf"))
    listed = set(re.findall(r"^\| (\S+\.pdf) \| [\d,]+ \|", table, re.MULTILINE))
    assert listed == {f.name for f in files}, "every sample has its source and licence row"
    assert len(files) >= 29
    results = {f.name: ingest_path(ctx, f, dataset="samples", publish=publish) for f in files}
    assert all(r.accepted for r in results.values()), [
        r for r in results.values() if not r.accepted
    ]
    # 015-habibi.pdf and 015-habibi-oneline-cmap.pdf are the same bytes: one job for both.
    ids = sorted({r.job_id for r in results.values()})

    jobs = {j.id: j for j in wait_for(ctx, ids, timeout=180)}

    mismatches = {}
    for name, r in results.items():
        j = jobs[r.job_id]
        got = OK if j.status.value == OK else (j.status.value, j.error_kind.value, j.error_code)
        if got != expected_outcome(name):
            mismatches[name] = (got, j.error_message)
        if got == NO_TEXT:
            assert "no text found, even by OCR" in j.error_message, name
        if j.status.value == "failed":
            assert j.attempt == 1, f"{name} was retried"
            assert j.error_message and j.fix_hint, name
        else:
            assert j.chunk_count >= 1, name
    assert not mismatches
    assert worker.alive()
