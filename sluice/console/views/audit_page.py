"""The audit log: who changed what, when, from where, and what was refused; newest first, filtered
and paged by the database (the same rows as ``sluice audit`` and ``GET /v1/audit``)."""

import pandas as pd
import streamlit as st

from sluice.console import ui
from sluice.ops import audit_trail

PAGE = 50
CURSOR_KEY = "audit_before"  # the id the current page starts below (None: the newest)

st.title("Audit")
sc = ui.scope()
st.caption(
    "Every change made at the console, with the `sluice` command or with an API key, and every "
    "refusal (a read-only operator, a cancel of a finished job, a dead key, a wrong password). "
    + (f"Showing {sc.label} (the sidebar's dataset)." if sc.dataset else "")
)


def _reset() -> None:
    st.session_state[CURSOR_KEY] = None


left, mid, right = st.columns(3)
since = left.text_input(
    "Since", value="7d", key="audit_since", help="2h, 30m, 7d, or an ISO time", on_change=_reset
)
actor = mid.text_input("Actor", key="audit_actor", placeholder="a name", on_change=_reset)
action = right.text_input(
    "Action", key="audit_action", placeholder="job.retry, or job", on_change=_reset
)
outcome = left.selectbox(
    "Outcome", ["any", "done", "refused"], key="audit_outcome", on_change=_reset
)

try:
    rows = audit_trail.rows(
        since=since,
        actor=actor.strip() or None,
        action=action.strip() or None,
        dataset=sc.dataset,
        outcome=None if outcome == "any" else outcome,
        before_id=st.session_state.get(CURSOR_KEY),
        limit=PAGE + 1,
    )
except audit_trail.BadAuditQuery as exc:
    st.error(str(exc))
    st.stop()

more, rows = len(rows) > PAGE, rows[:PAGE]
if not rows:
    st.info("No audit rows match.")
else:
    table = pd.DataFrame(
        [
            {
                "When": ui.local_time(r["at"]),
                "Who": f"{r['actor_kind']}:{r['actor_name']}",
                "From": r["address"] or "",
                "Action": r["action"],
                "Target": f"{r['target_kind']} {r['target_id'] or ''}".strip(),
                "Dataset": r["dataset"] or "",
                "Outcome": r["outcome"],
                "Reason": r["reason"],
                "Parameters": ", ".join(f"{k}={v}" for k, v in (r["params"] or {}).items()),
            }
            for r in rows
        ]
    )
    st.dataframe(table, hide_index=True, width="stretch")
back, forward = st.columns(2)
if st.session_state.get(CURSOR_KEY) is not None:
    back.button("Newest", key="audit_newest", on_click=_reset)
if more:
    forward.button(
        "Older",
        key="audit_older",
        on_click=lambda: st.session_state.__setitem__(CURSOR_KEY, rows[-1]["id"]),
    )
