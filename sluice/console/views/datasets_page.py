"""Datasets: each dataset's documents, chunks and parse settings; change a dataset's chunking or OCR
with a preview of what the change costs, then rebuild that dataset (and nothing else) with it."""

import pandas as pd
import streamlit as st

from sluice.console import ui
from sluice.ops import actions, reads
from sluice.ops.settings_changes import UnknownDataset
from sluice.storage.dataset_settings import KEYS

OCR_MODES = ("auto", "always", "off")

who = ui.operator()
sc = ui.scope()
st.title("Datasets")
ui.read_only_note(who)

summaries = reads.dataset_summaries()
if not summaries:
    st.info("No dataset yet: create one in the sidebar.")
    st.stop()
st.dataframe(
    pd.DataFrame(
        [
            {"Dataset": r["name"], "Documents": r["documents"], "Chunks": r["chunks"]}
            for r in summaries
        ]
    ),
    hide_index=True,
    width="stretch",
)

names = [r["name"] for r in summaries]
name = st.selectbox(
    "Dataset",
    names,
    index=names.index(sc.dataset) if sc.dataset in names else 0,
    key="settings_dataset",
    help="Whose parse settings to show and change.",
)
try:
    view = actions.dataset_settings(name)
except UnknownDataset as exc:  # deleted between two reruns
    st.warning(ui.plain(str(exc)))
    st.stop()

st.subheader(f"Parse settings of {ui.plain(name)}")
st.dataframe(
    pd.DataFrame(
        [
            {
                "Setting": r.key,
                "Value": str(r.value),
                "From": "this dataset" if r.source == "dataset" else "default (SLUICE_*)",
                "Meaning": r.description,
            }
            for r in view.rows
        ]
    ),
    hide_index=True,
    width="stretch",
)
caption = f"Pipeline **{view.pipeline_version}**."
if view.changed_at:
    caption += f" Changed by {ui.plain(view.changed_by)}, {ui.local_time(view.changed_at)}."
st.caption(caption)
if view.to_rebuild:
    st.warning(
        f"{view.to_rebuild} document(s) still serve chunks of another version (a job was running "
        "when the settings changed, or the SLUICE_* settings changed). Rebuild them on the "
        f"Integrity page or with `sluice reindex --all --dataset {name}`."
    )

# --- the change -----------------------------------------------------------------------------------

current = {r.key: r.value for r in view.rows}
own = view.overrides
form_key = f"settings_form:{name}"
with st.form(form_key, border=True):
    st.markdown(
        "**Change**: what you change here is kept by this dataset; the rest follows the SLUICE_* "
        "defaults. Preview first: nothing is saved until you confirm."
    )
    left, right = st.columns(2)
    size = left.number_input(
        "Chunk size (characters)",
        min_value=100,
        max_value=8000,
        step=50,
        value=int(current["chunk_size"]),
        key=f"{form_key}:chunk_size",
    )
    overlap = right.number_input(
        "Chunk overlap (characters)",
        min_value=0,
        max_value=7999,
        step=10,
        value=int(current["chunk_overlap"]),
        key=f"{form_key}:chunk_overlap",
    )
    mode = left.selectbox(
        "OCR of pages without text",
        OCR_MODES,
        index=OCR_MODES.index(current["ocr_mode"]),
        key=f"{form_key}:ocr_mode",
        help="auto: pages without a usable text layer are read by OCR; always: every page; "
        "off: such files end as needing your action.",
    )
    language = right.text_input(
        "OCR language",
        value=str(current["ocr_language"]),
        key=f"{form_key}:ocr_language",
        help="Tesseract language codes, e.g. eng, deu, eng+fra (installed ones only).",
    )
    defaults = st.checkbox(
        "Use the defaults (SLUICE_*) for everything", key=f"{form_key}:defaults", disabled=not own
    )
    asked = st.form_submit_button("Preview the change", disabled=not who.can_act)

if asked:
    wanted = {
        "chunk_size": size,
        "chunk_overlap": overlap,
        "ocr_mode": mode,
        "ocr_language": language.strip(),
    }
    if defaults:
        assignments = dict.fromkeys(KEYS)
    # only what differs from what the dataset uses now, so untouched keys keep following the
    # defaults
    else:
        assignments = {k: str(v) for k, v in wanted.items() if str(v) != str(current[k])}
    st.session_state["settings_change"] = (name, assignments)

pending = st.session_state.get("settings_change")
if pending and pending[0] == name:
    assignments = pending[1]
    if not assignments:
        st.info("Nothing to change: these are the settings the dataset uses now.")
    else:
        with st.spinner("Parsing a sample of the dataset's documents with the new settings..."):
            change = actions.preview_dataset_settings(name, assignments)
        if not change.ok:
            st.error(ui.plain(change.message))
        else:
            described = ", ".join(
                f"{k} = {v if v is not None else 'default'}" for k, v in assignments.items()
            )
            st.info(ui.plain(f"{described}. {change.message}"))
            if change.plan is not None and change.plan.documents:
                st.caption(f"Time to rebuild: {change.plan.preview.time_at(reads.chunk_rate())}.")

            def _apply() -> None:
                done = actions.set_dataset_settings(who, name, assignments)
                ui.flash("success" if done.ok else "error", done.message)
                st.session_state.pop("settings_change", None)

            ui.confirm_button(
                "Save and rebuild this dataset",
                key=f"apply:{name}",
                on_confirm=_apply,
                disabled=not who.can_act,
                danger=False,
                prompt=f"Save the settings of {name} and queue a rebuild of its documents? Search "
                "keeps serving each document's current chunks until its new job succeeds.",
            )


# --- rename and delete ----------------------------------------------------------------------------


def manage_section(who, name: str) -> None:
    """Rename the dataset, or delete it after typing its name (sluice.ops.dataset_admin)."""
    from sluice.ops import dataset_admin

    st.subheader(f"Rename or delete {ui.plain(name)}")
    plan = dataset_admin.plan_delete(reads.ctx(), name)
    if plan is None:  # deleted between two reruns
        st.warning(ui.plain(f"no dataset named {name!r}"))
        return
    if plan.deleting:
        st.warning(
            ui.plain(
                f"{name} is being deleted: it takes no upload and answers no search. A delete "
                "that stopped halfway is finished here (or by `sluice datasets delete`)."
            )
        )
    left, right = st.columns(2)

    def _rename() -> None:  # a callback: it runs before the dataset picker is drawn again
        new = st.session_state.get(f"rename_to:{name}", "")
        done = dataset_admin.rename(reads.ctx(), who, name, new)
        ui.flash("success" if done.ok else "error", done.message)
        if done.ok:
            st.session_state["settings_dataset"] = new.strip()

    def _delete() -> None:
        if st.session_state.get(f"delete_name:{name}", "").strip() != name:
            ui.flash("error", f"Type {name} exactly to delete it; nothing was deleted.")
            return
        done = dataset_admin.delete(reads.ctx(), who, name)
        ui.flash("success" if done.ok else "error", done.message)

    with left.form(f"rename:{name}", border=True):
        st.text_input("New name", value=name, key=f"rename_to:{name}")
        st.caption("Search, jobs and API keys go on working: they name the dataset by its id.")
        st.form_submit_button("Rename", on_click=_rename, disabled=not who.can_act or plan.deleting)
    with right.form(f"delete:{name}", border=True):
        st.markdown(ui.plain(plan.describe() + "."))
        st.text_input(
            "Type the dataset's name to delete it", key=f"delete_name:{name}", placeholder=name
        )
        st.form_submit_button(
            "Finish the delete" if plan.deleting else "Delete the dataset",
            type="primary",
            on_click=_delete,
            disabled=not who.can_act,
        )


manage_section(who, name)
