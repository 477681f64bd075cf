"""Small pieces the pages share: the dataset scope, status labels, durations, confirmations and the
messages an action leaves for the next run.

Session state holds UI selections only (the dataset picked, a pending confirmation, the last
action's message); job records always come fresh from the database.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any
from zoneinfo import ZoneInfo

import streamlit as st
from PIL import Image, ImageDraw

from sluice.ops.access import LOCAL_OPERATOR, Operator
from sluice.ops.actions import ActionReport
from sluice.storage.models import utcnow

ALL_DATASETS = "All datasets"
DATASET_KEY = "dataset"
OPERATOR_KEY = "sluice_operator"
FLASH_KEY = "sluice_flash"
JOBS_PAGE = "views/jobs_page.py"
DOCUMENT_PAGE = "views/document_page.py"


@lru_cache(maxsize=1)
def page_icon() -> Image.Image:
    """The tab's icon, drawn here: Streamlit serves an image from its own media store, whereas a
    material or emoji ``page_icon`` becomes a favicon link to fonts.gstatic.com or a CDN (a request
    that fails offline and tells a third party the console was opened)."""
    size = 64
    icon = Image.new("RGBA", (size, size), (0, 0, 0, 0))
    draw = ImageDraw.Draw(icon)
    blue = (30, 110, 200, 255)
    draw.ellipse((12, 24, 52, 62), fill=blue)  # a drop: a round body under a point
    draw.polygon([(32, 2), (14, 36), (50, 36)], fill=blue)
    draw.arc((20, 34, 40, 54), 100, 190, fill=(255, 255, 255, 220), width=3)
    return icon


STATUS_ICON = {  # Material icons: they come with Streamlit's own font, so every browser draws them
    "pending": ":material/schedule:",
    "running": ":material/progress_activity:",
    "retrying": ":material/replay:",
    "succeeded": ":material/check_circle:",
    "failed": ":material/error:",
    "cancelled": ":material/block:",
    "superseded": ":material/layers:",
    "deleted": ":material/delete:",
}
STATUS_COLOR = {
    "pending": "gray",
    "running": "blue",
    "retrying": "orange",
    "succeeded": "green",
    "failed": "red",
    "cancelled": "violet",
    "superseded": "gray",
    "deleted": "gray",
}
STATUS_CELL = {  # background of the status cell in tables
    "running": "#e3f2fd",
    "retrying": "#fff3e0",
    "succeeded": "#e8f5e9",
    "failed": "#ffebee",
    "cancelled": "#f3e5f5",
}
KIND_LABEL = {
    "transient": "transient error",
    "permanent": "permanent error",
    "user_action_required": "needs your action",
    "unknown": "unknown error",
}


def words(code: str | None) -> str:
    """An error code or enum value as words: no_text_layer -> no text layer."""
    return (code or "").replace("_", " ")


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``1 chunk``, ``2 chunks``, ``1,200 chunks``."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def job_cells(r: dict) -> dict[str, str]:
    """A job row as the tables say it: in words, and never promising attempts that will not come."""
    active = r["status"] in ("pending", "running", "retrying")
    status = "cancelling" if r["cancel_requested"] and active else r["status"]
    if r["status"] == "succeeded":
        progress = count(r["chunk_count"] or 0, "chunk")
    elif active:
        progress = r["progress"]
    elif r["status"] in ("failed", "cancelled"):
        progress = f"stopped at {r['stage']}"
    else:
        progress = ""
    attempts = f"{r['attempt']} of {r['max_attempts']}" if active else str(r["attempt"])
    error = ""
    if r["error_message"]:
        kind = KIND_LABEL.get(r["error_kind"] or "", "")
        error = (
            f"{kind}: {r['error_message']}"
            if kind and r["status"] != "cancelled"
            else r["error_message"]
        )
    return {"status": status, "progress": progress, "attempts": attempts, "error": error}


# --- who and where --------------------------------------------------------------------------------


def operator() -> Operator:
    """The signed-in operator (set by the login gate in app.py)."""
    return st.session_state.get(OPERATOR_KEY) or LOCAL_OPERATOR


@dataclass(frozen=True)
class Scope:
    dataset_id: int | None
    dataset: str | None  # None = all datasets

    @property
    def label(self) -> str:
        return f"dataset {self.dataset}" if self.dataset else "all datasets"


def scope() -> Scope:
    from sluice.ops import reads

    name = st.session_state.get(DATASET_KEY) or ALL_DATASETS
    if name == ALL_DATASETS:
        return Scope(None, None)
    for ds in reads.datasets():
        if ds.name == name:
            return Scope(ds.id, ds.name)
    return Scope(None, None)


# --- words ----------------------------------------------------------------------------------------

_MARKDOWN_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")


def plain(value: object) -> str:
    """A string to put inside Markdown that shows as its own text: names, metadata, error messages.

    Every ASCII punctuation character is backslash-escaped (CommonMark allows it for all of them),
    so no link, image, emphasis, heading, HTML, URL autolink, emoji or Streamlit directive can form.
    """
    return _MARKDOWN_PUNCTUATION.sub(r"\\\1", " ".join(str(value).splitlines()))


_CELL_BORDER = re.compile(r"(?<!\\)\|")  # a cell border: a pipe the chunker did not escape
_RULE_CELL = re.compile(r"^\s*:?-{3,}:?\s*$")


def _table_row(line: str) -> list[str]:
    """The cells of one Markdown table row as the chunker wrote it (``\\|``: a pipe in a cell)."""
    return [c.strip().replace("\\|", "|") for c in _CELL_BORDER.split(line)[1:-1]]


def chunk_markdown(text: str) -> str:
    """A chunk's text as Markdown that shows it as it is, its table rows as a table: every cell
    and every other line escaped like ``plain``, the heading path in italics above."""
    from sluice.pipeline.running.chunk import heading_of

    path, body = heading_of(text)
    blocks: list[str] = [f"*{plain(path)}*"] if path else []
    table: list[list[str]] = []

    def close_table() -> None:
        if not table:
            return
        header, rows = table[0], table[1:]
        if rows and all(_RULE_CELL.match(c) for c in rows[0]):
            rows = rows[1:]
        width = max(len(r) for r in table)

        def line(cells: list[str]) -> str:
            return "| " + " | ".join([plain(c) for c in cells] + [""] * (width - len(cells))) + " |"

        blocks.append("\n".join([line(header), "|" + " --- |" * width, *map(line, rows)]))
        table.clear()

    paragraph: list[str] = []
    for raw in body.split("\n"):
        row = raw.strip()
        if len(row) > 2 and row.startswith("|") and row.endswith("|"):
            if paragraph:
                blocks.append("  \n".join(paragraph))
                paragraph = []
            table.append(_table_row(row))
            continue
        close_table()
        if row:
            paragraph.append(plain(raw))
        elif paragraph:
            blocks.append("  \n".join(paragraph))
            paragraph = []
    close_table()
    if paragraph:
        blocks.append("  \n".join(paragraph))
    return "\n\n".join(blocks)


_CLI_ASIDE = re.compile(r"\s*\([^()]*--[a-z][^()]*\)")


def without_cli_asides(text: str) -> str:
    """An ops message as a console page says it: the asides that tell a shell what to type
    ("confirm (--yes) to remove them") dropped, as the page's own button is what does it here."""
    return _CLI_ASIDE.sub("", text)


def highlighted(snippet: str) -> str:
    """A search snippet whose matched words come wrapped in ``**``: everything shown as text, only
    the matches bold (a ``**`` inside the document's own text at worst moves a highlight)."""
    parts = snippet.split("**")
    return "".join(f"**{plain(p)}**" if i % 2 and p else plain(p) for i, p in enumerate(parts))


def status_badge(status: str, where=st) -> None:
    where.badge(status, icon=STATUS_ICON.get(status), color=STATUS_COLOR.get(status, "gray"))


def status_cell_style(value: str) -> str:
    color = STATUS_CELL.get(str(value).split(" ")[0])
    return f"background-color: {color}" if color else ""


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    seconds = max(0.0, seconds)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 90:
        return f"{seconds:.1f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def ago(when: datetime | str | None, now: datetime | None = None) -> str:
    if when is None:
        return "—"
    if isinstance(when, str):
        when = datetime.fromisoformat(when)
    return duration(((now or utcnow()) - when).total_seconds()) + " ago"


def local_time(when: datetime | str | None) -> str:
    """A moment in the viewer's own time zone (as the browser reports it), to the second."""
    if when is None:
        return "—"
    if isinstance(when, str):
        when = datetime.fromisoformat(when)
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    try:
        zone = ZoneInfo(st.context.timezone) if st.context.timezone else None
    except Exception:  # an unknown zone name, or no browser (AppTest): the server's local time
        zone = None
    return when.astimezone(zone).strftime("%Y-%m-%d %H:%M:%S")


def eta(delta: timedelta | None) -> str:
    return "—" if delta is None else duration(delta.total_seconds())


# --- actions: results and confirmations -----------------------------------------------------------


def flash(level: str, text: str) -> None:
    st.session_state.setdefault(FLASH_KEY, []).append((level, text))


def flash_outcome(outcome: ActionReport, verb: str) -> None:
    if outcome.ok:
        done = [r for r in outcome.results if r.ok]
        if len(done) == 1:
            flash("success", f"{verb}: 1 job(s). {done[0].message}")
        else:  # one line for many jobs: their ids, not the same sentence again and again
            ids = ", ".join(str(r.job_id) for r in done[:30]) + (
                f" and {len(done) - 30} more" if len(done) > 30 else ""
            )
            flash("success", f"{verb}: {len(done)} job(s): {ids}.")
    for text in outcome.warnings[:5]:
        flash("warning", text)
    if len(outcome.warnings) > 5:
        flash("warning", f"... and {len(outcome.warnings) - 5} more of the same kind")
    for r in outcome.refused[:10]:
        flash("error", r.message)
    if len(outcome.refused) > 10:
        flash("error", f"... and {len(outcome.refused) - 10} more refused")
    if outcome.queue_note:
        flash("warning", outcome.queue_note)


def show_flashes() -> None:
    for level, text in st.session_state.pop(FLASH_KEY, []):
        getattr(st, level)(plain(text))  # messages carry names: shown as text


def confirm_button(
    label: str,
    *,
    key: str,
    prompt: str | Callable[[], str],
    on_confirm: Callable[[], None],
    disabled: bool = False,
    help: str | None = None,
    danger: bool = True,
) -> None:
    """A button that asks first: the first click shows the prompt with Confirm / Keep buttons.

    ``prompt`` may be a callable, for prompts that cost a query (only built once asked)."""
    flag = f"confirm:{key}"
    if not st.session_state.get(flag):
        st.button(
            label,
            key=key,
            disabled=disabled,
            help=help,
            on_click=lambda: st.session_state.__setitem__(flag, True),
        )
        return
    box = st.container(border=True)
    (box.warning if danger else box.info)(prompt() if callable(prompt) else prompt)
    left, right = box.columns(2)

    def yes() -> None:
        st.session_state.pop(flag, None)
        on_confirm()

    left.button(
        f"Confirm: {label}", key=f"{key}:yes", type="primary", disabled=disabled, on_click=yes
    )
    right.button("Keep as is", key=f"{key}:no", on_click=lambda: st.session_state.pop(flag, None))


def read_only_note(who: Operator) -> None:
    if not who.can_act:
        st.info(
            "You are signed in read-only: you see everything, and actions are disabled.",
            icon=":material/lock:",
        )


def scope_caption(sc: Scope) -> None:
    st.caption(f"Showing {sc.label}. Pick another dataset in the sidebar.")


def hit_table(rows: list[dict]) -> Any:
    """Hits as a table whose empty cells (a ranker that did not find the hit) read "—", not
    "None"; the numbers stay numbers, so the columns still sort."""
    import pandas as pd

    return pd.DataFrame(rows).style.format(na_rep="—", precision=4)
