"""Tables as CSV files for a person's spreadsheet, with every cell safe to open.

A cell that starts with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return is a formula to
Excel, LibreOffice and Google Sheets: a file named ``=HYPERLINK("https://evil.example", "x")``
would come out of an export as a live link or worse. OWASP's rule: such a cell is prefixed with a
single quote, so it is shown as the text it is. The console's own CSV download (Streamlit's
table toolbar, which cannot do this) is switched off; every export goes through here.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def safe_cell(value: Any) -> str:
    """The cell as text a spreadsheet will not evaluate."""
    if value is None:
        return ""
    text = value if isinstance(value, str) else str(value)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return text  # a number, negative ones included, stays a number
    return f"'{text}" if text.startswith(FORMULA_STARTS) else text


def table_csv(rows: Iterable[Mapping[str, Any]], columns: Sequence[str]) -> bytes:
    """``rows`` as UTF-8 CSV (with a BOM, so spreadsheets read the encoding), header first."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow([safe_cell(c) for c in columns])
    for row in rows:
        writer.writerow([safe_cell(row.get(c)) for c in columns])
    return ("\ufeff" + out.getvalue()).encode("utf-8")
