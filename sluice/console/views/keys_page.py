"""API keys: make one (its token shown once, in the run that made it), list them, revoke one.

The same functions as ``sluice keys``; only an operator who may act sees the keys or the
controls."""

import pandas as pd
import streamlit as st

from sluice.console import ui
from sluice.ops import keys, reads

who = ui.operator()
st.title("API keys")
if not who.can_act:
    st.info(
        "API keys are managed by operators: you are signed in read-only.", icon=":material/lock:"
    )
    st.stop()

st.caption(
    "Keys of the HTTP API (docs/api.md). A key reaches some datasets or all of them, with a scope: "
    "read, ingest (read and upload, retry, cancel, unlock) or manage (ingest and delete)."
)

with st.form("create_key", clear_on_submit=True, border=True):
    st.markdown("**New key**")
    left, right = st.columns(2)
    name = left.text_input("Name", key="key_name", placeholder="e.g. billing-app")
    scope = right.selectbox("Scope", list(keys.SCOPES), key="key_scope")
    chosen = left.multiselect("Datasets", [d.name for d in reads.datasets()], key="key_datasets")
    every = right.checkbox("Every dataset, also later ones", key="key_all_datasets")
    made = st.form_submit_button("Create the key")

if made:
    try:
        if bool(chosen) == every:
            raise keys.KeyRefused("Pick the key's datasets, or give it every dataset.")
        view, token = keys.create_key(
            who, name.strip(), datasets=None if every else list(chosen), scope=scope
        )
    except keys.KeyRefused as exc:
        st.error(ui.plain(str(exc)))
    else:  # the token lives only in this run: it is in no session state and no rerun shows it
        st.success(
            ui.plain(f"Key {view.name!r} made. Copy its token now: it is shown only this once.")
        )
        st.code(token, language=None)

rows = keys.list_keys()
if not rows:
    st.info("No API key yet.")
    st.stop()
st.dataframe(
    pd.DataFrame(
        [
            {
                "Name": v.name,
                "Scope": v.scope,
                "Datasets": "every dataset" if v.datasets == ["*"] else ", ".join(v.datasets),
                "Created": ui.local_time(v.created_at),
                "By": v.created_by,
                "Last used": ui.local_time(v.last_used_at),
                "Revoked": ui.local_time(v.revoked_at) if v.revoked else "",
            }
            for v in rows
        ]
    ),
    hide_index=True,
    width="stretch",
)
touch_seconds = int(keys.LAST_USED_EVERY.total_seconds())
st.caption(
    f"Last used is written at most once every {touch_seconds} s per key (a busy key's every "
    "request would otherwise be a write), so it can be that much behind."
)

live = [v.name for v in rows if not v.revoked]
if live:
    target = st.selectbox("Key to revoke", live, key="revoke_key_name")

    def _revoke() -> None:
        ok, message = keys.revoke_key(who, target)
        ui.flash("success" if ok else "error", message)

    ui.confirm_button(
        "Revoke",
        key="revoke_key",
        on_confirm=_revoke,
        prompt=f"Revoke {target}? Its requests answer 401 from now on; this cannot be undone.",
    )
