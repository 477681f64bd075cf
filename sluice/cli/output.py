"""How the ``sluice`` command prints: aligned tables with a header, plain values, stable JSON."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # a cold `sluice search` never imports the job store's code
    from sluice.storage.jobs import ActionResult


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=_jsonable))


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def plain(value: Any) -> str:
    """A value as a person reads it: no Python None, timestamps to the second in local time."""
    if value is None or value == "":
        return "-"
    if isinstance(value, datetime):
        return value.astimezone().strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, str) and len(value) >= 19 and value[4] == "-" and value[10] == "T":
        try:
            return plain(datetime.fromisoformat(value))
        except ValueError:
            return value
    return str(value)


def table(
    rows: Sequence[dict], columns: str | Sequence[tuple[str, str]], *, empty: str, out=None
) -> None:
    """Rows under a header, columns padded to their widest cell; ``empty`` when there are none.
    ``columns`` is (key, HEADER) pairs, or their short form ``"name created_at:CREATED"``: a key
    alone is headed by itself in capitals, an underscore of a header is a space."""
    out = out or sys.stdout
    if not rows:
        print(empty, file=out)
        return
    if isinstance(columns, str):
        columns = [_column(word) for word in columns.split()]
    cells = [[header for _, header in columns]]
    cells += [[" ".join(plain(row.get(key)).split()) for key, _ in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    for line in cells:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip(), file=out)


def _column(word: str) -> tuple[str, str]:
    key, _, header = word.partition(":")
    return key, (header or key).upper().replace("_", " ")


def listing(
    rows: Sequence[dict],
    columns: str | Sequence[tuple[str, str]],
    *,
    empty: str,
    as_json: bool,
    json_rows: Any = None,
) -> int:
    """A list command's answer: ``json_rows`` (else ``rows``) as JSON, or ``rows`` as a table."""
    if as_json:
        print_json(rows if json_rows is None else json_rows)
    else:
        table(rows, columns, empty=empty)
    return 0


def report(results: Iterable[ActionResult], *, note: str = "") -> int:
    """One line per job (refusals on stderr); exit 0 only when every job went through."""
    results = list(results)
    for r in results:
        print(r.message, file=sys.stdout if r.ok else sys.stderr)
    if note:
        print(f"sluice: {note}", file=sys.stderr)
    return 0 if results and all(r.ok for r in results) else 1
