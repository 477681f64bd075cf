"""Upload: many PDF, .txt and .md files at once; per file a new job, the existing one, or why not."""

import streamlit as st

from sluice.console import ui
from sluice.ops import actions, reads

RESULTS_KEY = "upload_results"

who = ui.operator()
sc = ui.scope()
st.title("Upload")
ui.read_only_note(who)

names = [d.name for d in reads.datasets()]
target = st.selectbox("Into dataset", names, index=names.index(sc.dataset or "default")
                      if (sc.dataset or "default") in names else 0, key="upload_dataset",
                      help="Defaults to the dataset picked in the sidebar.")

with st.form("upload_form", clear_on_submit=True):
    files = st.file_uploader("PDF, text or Markdown files", type=["pdf", "txt", "md", "markdown"],
                             accept_multiple_files=True, disabled=not who.can_act, key="upload_files")
    submitted = st.form_submit_button("Upload and index", type="primary", disabled=not who.can_act)

if submitted and files:
    results = []
    with st.status(f"Uploading {len(files)} file(s)...", expanded=False) as status:
        for f in files:
            r = actions.upload(who, dataset=target, filename=f.name, stream=f)
            results.append(r.to_dict())
            status.write(ui.plain(f"{f.name}: {r.message}"))
        status.update(label=f"Uploaded {len(files)} file(s)", state="complete")
    st.session_state[RESULTS_KEY] = results
elif submitted:
    st.warning("Pick at least one file first.")


def _reindex(job_id: int) -> None:
    ui.flash_outcome(actions.reindex(who, [job_id]), "Reindex")


def _retry(job_id: int) -> None:
    ui.flash_outcome(actions.retry(who, [job_id]), "Retry")


results = st.session_state.get(RESULTS_KEY) or []
if results:
    new = sum(1 for r in results if r["accepted"] and not r["duplicate"])
    dup = sum(1 for r in results if r["duplicate"])
    refused = sum(1 for r in results if not r["accepted"])
    st.subheader("Last upload")
    st.caption(f"{new} new job(s), {dup} already uploaded, {refused} refused.")
    for i, r in enumerate(results):
        with st.container(border=True):
            head, link = st.columns([4, 1])
            if not r["accepted"]:
                head.markdown(f"**{ui.plain(r['filename'])}** — refused: {ui.plain(r['message'])}")
                head.caption(f"Fix: {ui.plain(r['fix_hint'])}" if r["fix_hint"] else "")
                continue
            if r["duplicate"]:
                head.markdown(f"**{ui.plain(r['filename'])}** — already uploaded: {ui.plain(r['message'])}")
            else:
                head.markdown(f"**{ui.plain(r['filename'])}** — {ui.plain(r['message'])}")
            link.page_link(ui.JOBS_PAGE, label=f"Open job {r['job_id']}", query_params={"job": str(r["job_id"])})
            if r["duplicate"] and r["status"] == "succeeded":
                with head:
                    ui.confirm_button("Reindex", key=f"upload_reindex_{i}", disabled=not who.can_act,
                                      prompt=f"Rebuild the chunks of job {r['job_id']}? Search keeps serving "
                                             "the current chunks until the new run succeeds.",
                                      on_confirm=lambda jid=r["job_id"]: _reindex(jid), danger=False)
            elif r["duplicate"] and r["status"] in ("failed", "cancelled"):
                head.button("Retry it", key=f"upload_retry_{i}", disabled=not who.can_act,
                            on_click=_retry, args=(r["job_id"],))
else:
    st.caption("Files are checked before anything is stored: over the size limit, or bytes that are not PDF "
               "or text, are refused with the reason. The same file uploaded again into the same dataset "
               "returns its existing job instead of indexing it twice.")
