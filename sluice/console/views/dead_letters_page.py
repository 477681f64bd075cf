"""Dead letters: failed jobs grouped by kind and reason, with the fix; retry one, some or all;
dismiss."""

from functools import partial

import pandas as pd
import streamlit as st

from sluice.console import ui
from sluice.ops import actions, reads

LIMIT = 200
PASSWORD_LINKS = 10  # links to the password forms shown under a group of locked files
JOBS_URL = "jobs"  # the Jobs page's url_path (app.py), relative to this page's

who = ui.operator()
sc = ui.scope()
st.title("Dead letters")
ui.scope_caption(sc)
ui.read_only_note(who)

groups = reads.dead_letter_groups(sc.dataset_id)
if not groups:
    st.success("No dead letters: no failed job is waiting for you.")
    st.stop()

total = sum(g["count"] for g in groups)
st.caption(
    f"{total:,} failed job(s) in {len(groups)} group(s). A failed job stays here until it is "
    "retried or dismissed; dismissing hides it and keeps its history."
)


def _gen_key(kind: str, code: str) -> str:
    return f"dl_gen:{kind}:{code}"


def _bump(kind: str, code: str) -> None:
    """A new table key after an action, so a stale row selection never points at another job."""
    st.session_state[_gen_key(kind, code)] = st.session_state.get(_gen_key(kind, code), 0) + 1


def _selected(table_key: str, ids: list[int]) -> list[int]:
    state = st.session_state.get(table_key)
    rows = state["selection"]["rows"] if state else []
    return [ids[i] for i in rows if i < len(ids)]


def _on_selected(action, verb: str, table_key: str, ids: list[int], kind: str, code: str) -> None:
    chosen = _selected(table_key, ids)
    if not chosen:
        ui.flash("warning", "Select one or more rows first.")
        return
    ui.flash_outcome(action(who, chosen), verb)
    _bump(kind, code)


def _retry_prompt(kind: str, code: str, n: int) -> str:
    return (
        f"Retry all {n:,} job(s) of this group? Each goes back to pending with a "
        f"fresh attempt budget. Cost: {reads.retry_preview(kind, code, sc.dataset_id)}."
        + (
            " These failed because of the files themselves: the same bytes will fail "
            "the same way unless the cause has been fixed outside them."
            if kind in ("user_action_required", "permanent")
            else ""
        )
    )


def _on_group(action, verb: str, kind: str, code: str) -> None:
    ids = reads.dead_letter_ids(kind, code, sc.dataset_id)
    ui.flash_outcome(action(who, ids), verb)
    _bump(kind, code)


for g in groups:
    kind, code, n = g["kind"], g["code"], g["count"]
    box = st.container(border=True)
    head, when = box.columns([4, 1])
    head.subheader(f"{ui.KIND_LABEL.get(kind, kind)} · {ui.plain(ui.words(code))}")
    when.metric("jobs", f"{n:,}")
    box.caption(f"Latest failure {ui.ago(g['latest'])}.")
    if g["fix_hint"]:
        box.info(f"**What to do:** {ui.plain(g['fix_hint'])}", icon=":material/build:")
    locked = code in actions.LOCKED_CODES
    if locked:
        box.caption(
            "Retrying runs the same bytes again, so it fails again: give each file's password on "
            "its job (the links below the table), or upload a copy without one."
        )
    elif kind in ("user_action_required", "permanent"):
        box.caption(
            "Retrying runs the same bytes again, so it fails again until the cause is fixed; "
            "usually the fix is a new upload of a corrected file."
        )

    rows = reads.dead_letters_in_group(kind, code, sc.dataset_id, limit=LIMIT)
    ids = [r["id"] for r in rows]
    table_key = f"dl:{kind}:{code}:{st.session_state.get(_gen_key(kind, code), 0)}"
    box.dataframe(
        pd.DataFrame(
            [
                {
                    "job": r["id"],
                    "open": f"{JOBS_URL}?job={r['id']}",
                    "file": r["filename"],
                    "dataset": r["dataset"],
                    "attempts": r["attempt"],
                    "error": r["error_message"],
                    "failed": ui.ago(r["finished_at"]),
                }
                for r in rows
            ]
        ),
        hide_index=True,
        key=table_key,
        on_select="rerun",
        selection_mode="multi-row",
        height=min(280, 35 * (len(rows) + 1) + 3),
        column_config={
            "job": st.column_config.NumberColumn("job", format="%d", width="small"),
            "open": st.column_config.LinkColumn(
                "open", display_text=r"job=(\d+)$", width="small", help="The job's page"
            ),
            "error": st.column_config.TextColumn("error", width="large"),
        },
    )
    if n > LIMIT:
        box.caption(
            f"Showing the latest {LIMIT} of {n:,}; 'Retry all' and 'Dismiss all' act on all {n:,}."
        )
    if locked:  # the password form is on each job's page: one link per file, no row to tick
        for r in rows[:PASSWORD_LINKS]:
            box.page_link(
                ui.JOBS_PAGE,
                label=f"Give the password of {r['filename']} (job {r['id']})",
                query_params={"job": str(r["id"])},
                icon=":material/key:",
            )
    chosen = _selected(table_key, ids)
    b = box.container(horizontal=True)
    b.button(
        f"Retry selected ({len(chosen)})",
        key=f"retry_sel:{kind}:{code}",
        disabled=not (who.can_act and chosen),
        on_click=_on_selected,
        args=(actions.retry, "Retry", table_key, ids, kind, code),
    )
    b.button(
        f"Dismiss selected ({len(chosen)})",
        key=f"dismiss_sel:{kind}:{code}",
        disabled=not (who.can_act and chosen),
        on_click=_on_selected,
        args=(actions.dismiss, "Dismiss", table_key, ids, kind, code),
    )
    with b:
        ui.confirm_button(
            f"Retry all {n:,}",
            key=f"retry_all:{kind}:{code}",
            disabled=not who.can_act,
            danger=False,
            prompt=partial(_retry_prompt, kind, code, n),
            on_confirm=partial(_on_group, actions.retry, "Retry", kind, code),
        )
    with b:
        ui.confirm_button(
            f"Dismiss all {n:,}",
            key=f"dismiss_all:{kind}:{code}",
            disabled=not who.can_act,
            prompt=f"Dismiss all {n:,} job(s) of this group? They stay failed, with their "
            "history, but leave this list.",
            on_confirm=partial(_on_group, actions.dismiss, "Dismiss", kind, code),
        )
    if len(chosen) == 1:
        box.page_link(
            ui.JOBS_PAGE, label=f"Open job {chosen[0]}", query_params={"job": str(chosen[0])}
        )
