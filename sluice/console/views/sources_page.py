"""Sources: each folder or S3 prefix a dataset follows, with its last sync (when, how long, what
it added, changed, renamed, removed and failed) and the next one; a preview of what a sync would
do and cost, the sync itself, the confirmation a new source's first sync waits for, and the one
the guard asks for before mass removals.

The same functions as ``sluice sources`` and ``sluice sync``."""

import pandas as pd
import streamlit as st

from sluice.console import ui
from sluice.errors import OperationError
from sluice.ops.sources import manage

PREVIEW = "sources_preview"  # the last preview's words, per source: what the person just asked

who = ui.operator()
st.title("Sources")
st.caption(
    "Folders and S3 prefixes that datasets follow (add one with `sluice sources add`). A new "
    "source uploads nothing until you confirm its first sync. A sync "
    "uploads new files, makes a changed file a new version, moves renamed ones without embedding "
    "them, and takes removed ones out of search (kept for SLUICE_SYNC_TOMBSTONE_HOURS, undo "
    "brings them back). A sync that would remove many documents, or saw an empty or failed "
    "listing, removes nothing until you confirm."
)
ui.read_only_note(who)
ui.show_flashes()

# What the sync says is said for every front end; the CLI's flags are this page's buttons.
_said = ui.without_cli_asides
views = manage.list_sources()
if not views:
    st.info("No source yet: `sluice sources add NAME --dataset D --folder PATH`.")
    st.stop()


def _row(v) -> dict:
    run = v.last_run or {}
    took = ""
    if run.get("finished_at") and run.get("started_at"):
        start = pd.Timestamp(run["started_at"])
        took = f"{(pd.Timestamp(run['finished_at']) - start).total_seconds():.1f} s"
    return {
        "Source": v.name,
        "Dataset": v.dataset,
        "Where": f"{v.kind} {v.location}",
        "Documents": v.documents,
        "Tombstoned": v.tombstoned,
        "Last sync": ui.local_time(run.get("finished_at") or run.get("started_at")),
        "Took": took,
        "Result": run.get("status", "never synced" if v.confirmed else "waits for confirmation"),
        "Added": run.get("added", 0),
        "Changed": run.get("changed", 0),
        "Renamed": run.get("renamed", 0),
        "Removed": run.get("removed", 0),
        "Failed": run.get("failed", 0),
        "Held": run.get("held", 0),
        "Next": "after confirmation"
        if not v.confirmed
        else ui.local_time(v.next_run_at)
        if v.next_run_at
        else "when asked",
    }


st.dataframe(pd.DataFrame([_row(v) for v in views]), hide_index=True, width="stretch")

name = st.selectbox("Source", [v.name for v in views], key="source_name")
chosen = next(v for v in views if v.name == name)
if chosen.last_run and chosen.last_run.get("message"):
    st.markdown(ui.plain(f"Last sync: {_said(chosen.last_run['message'])}"))


def _run(*, confirm: bool = False) -> None:
    try:
        result = manage.sync(who, name, confirm=confirm)
    except OperationError as exc:
        ui.flash("error", _said(exc.message))
        return
    st.session_state.pop(PREVIEW, None)
    level = "success" if result.status == "done" else "warning"
    ui.flash(level, f"{name}: {_said(result.message)}")
    if result.held_reason:
        ui.flash("warning", f"Removals held: {_said(result.held_reason)}")


def _undo() -> None:
    try:
        ui.flash("success", _said(manage.undo(who, name)))
    except OperationError as exc:
        ui.flash("error", _said(exc.message))


left, middle, right = st.columns(3)
if left.button("Preview the sync", key="source_preview"):
    with st.spinner("Listing the source and reading what changed…"):
        try:
            preview = manage.sync(who, name, preview=True)
        except OperationError as exc:
            st.error(ui.plain(_said(exc.message)))
        else:
            st.session_state[PREVIEW] = {"source": name, "result": preview.to_dict()}
middle.button(
    "Sync now", key="source_sync", disabled=not who.can_act, on_click=lambda: _run(confirm=False)
)
with right:
    ui.confirm_button(
        "Undo removals",
        key="source_undo",
        disabled=not who.can_act or not chosen.tombstoned,
        prompt=f"Bring the {chosen.tombstoned} tombstoned document(s) of {name} back into search?",
        on_confirm=lambda: _undo(),
        danger=False,
    )


def _confirm(box, held: int, reason: str) -> None:
    box.warning(ui.plain(f"Removals held: {_said(reason)}"))
    with box:
        ui.confirm_button(
            "Sync and remove them",
            key="source_confirm",
            disabled=not who.can_act,
            prompt=f"Sync {name} and remove the {held} document(s) the guard holds back? They "
            "leave search at once (undo brings them back).",
            on_confirm=lambda: _run(confirm=True),
        )


shown = st.session_state.get(PREVIEW)
last = chosen.last_run or {}
if not chosen.confirmed:
    first = st.container(border=True)
    first.info(
        ui.plain(
            f"{name} is new: nothing is uploaded until you confirm its first sync. Preview it "
            "to see what it would add."
        )
    )
    with first:
        ui.confirm_button(
            "Confirm the first sync",
            key="source_first",
            disabled=not who.can_act,
            prompt=f"Sync {name} now and upload what its plan adds? The workers follow it from "
            "then on.",
            on_confirm=lambda: _run(confirm=True),
            danger=False,
        )
if shown and shown["source"] == name:
    result = shown["result"]
    box = st.container(border=True)
    box.markdown(ui.plain(f"Preview: {_said(result['message'])}"))
    for failure in result["failed"][:20]:
        box.markdown(ui.plain(f"cannot read {failure['path']}: {_said(failure['error'])}"))
    if result["held_reason"]:
        _confirm(box, result["counts"]["held"], result["held_reason"])
elif last.get("status") == "held":
    _confirm(st.container(border=True), last["held"], last["message"])
