"""Upload: many files at once; per chosen file a line: a new job, the existing one, or why not.

The widget takes any file: what Sluice can read is decided from the bytes on the server, so a file
it cannot read gets a line saying why instead of vanishing in the browser. The result follows its
jobs live until they have all finished."""

from functools import partial

import streamlit as st

from sluice.console import ui
from sluice.ops import actions, reads, replacing
from sluice.ops import metadata as meta

RESULTS_KEY = "upload_results"

who = ui.operator()
sc = ui.scope()
st.title("Upload")
ui.read_only_note(who)

names = [d.name for d in reads.datasets()]
target = st.selectbox(
    "Into dataset",
    names,
    index=names.index(sc.dataset or "default") if (sc.dataset or "default") in names else 0,
    key="upload_dataset",
    help="Defaults to the dataset picked in the sidebar.",
)

with st.form("upload_form", clear_on_submit=True):
    files = st.file_uploader(
        "PDF, Word, PowerPoint, EPUB, HTML, CSV, text or Markdown files",
        accept_multiple_files=True,
        disabled=not who.can_act,
        key="upload_files",
        help="Any file may be chosen; each one gets a line below saying what became of it.",
    )
    external_id = st.text_input(
        "External id (optional, one file)",
        key="upload_external_id",
        disabled=not who.can_act,
        help="Your own id of this document. New bytes under an id already known become its new "
        "version: the old one keeps serving until the new one is indexed, then replaces it.",
    ).strip()
    metadata_text = st.text_area(
        "Metadata (optional, every file)",
        key="upload_metadata",
        disabled=not who.can_act,
        height=68,
        placeholder='{"lang": "de", "year": 2024, "team": ["a", "b"]}',
        help="A JSON object of your own fields, searchable with a metadata filter. Keys: a "
        "lower-case letter, then lower-case letters, digits or _ (up to 64); values: text, "
        "numbers, true/false or lists of text; at most 8 KB.",
    )
    submitted = st.form_submit_button("Upload and index", type="primary", disabled=not who.can_act)

metadata_value: dict | None = None
metadata_error = ""
if submitted and metadata_text.strip():
    try:
        metadata_value = meta.parse_json(metadata_text)
    except meta.MetadataError as exc:
        metadata_error = str(exc)

if submitted and metadata_error:
    st.error(f"Nothing was uploaded: {ui.plain(metadata_error)}.")
elif submitted and files and external_id and len(files) > 1:
    st.warning(f"An external id names one file: {len(files)} were picked; upload them one by one.")
elif submitted and files:
    results = []
    with st.status(f"Uploading {len(files)} file(s)...", expanded=False) as status:
        for f in files:
            r = actions.upload(
                who,
                dataset=target,
                filename=f.name,
                stream=f,
                external_id=external_id or None,
                metadata=metadata_value,
            )
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


LIVE_SECONDS = 2


def _results_section(results: list[dict], following: bool) -> None:
    live = {r["id"]: r for r in reads.job_rows([r["job_id"] for r in results if r["accepted"]])}
    new = sum(1 for r in results if r["accepted"] and not r["duplicate"])
    dup = sum(1 for r in results if r["duplicate"])
    refused = sum(1 for r in results if not r["accepted"])
    done = sum(1 for j in live.values() if j["status"] in reads.FINAL)
    st.subheader("Last upload")
    st.caption(
        f"{len(results)} file(s) chosen: {new} new job(s), {dup} already uploaded, {refused} "
        f"refused. {done} of {len(live)} job(s) finished"
        + ("; following them live." if done < len(live) else ".")
    )
    for i, r in enumerate(results):
        with st.container(border=True):
            head, state, link = st.columns([4, 2, 1])
            if not r["accepted"]:
                head.text(f"{r['filename']} — refused: {r['message']}")
                if r["fix_hint"]:
                    head.caption(f"What to do: {ui.plain(r['fix_hint'])}")
                state.badge("refused", icon=ui.STATUS_ICON["failed"], color="red")
                continue
            job = live.get(r["job_id"], {})
            status = job.get("status", r["status"])
            verb = "already uploaded: " if r["duplicate"] else ""
            head.text(f"{r['filename']} — {verb}{r['message']}")
            ui.status_badge(status, state)
            if r.get("external_id") and r.get("document_id"):
                version = replacing.version_state(reads.ctx(), r["document_id"])
                head.caption(ui.plain(f"External id {r['external_id']}: {version.message}"))
            if status in reads.ACTIVE and job:
                state.caption(job["progress"])
            elif job.get("error_message") and status == "failed":
                head.caption(
                    f"{ui.KIND_LABEL.get(job['error_kind'] or '', '')}: "
                    f"{ui.plain(job['error_message'])}"
                )
            link.page_link(
                ui.JOBS_PAGE,
                label=f"Open job {r['job_id']}",
                query_params={"job": str(r["job_id"])},
            )
            if r["duplicate"] and status == "succeeded":
                with head:
                    ui.confirm_button(
                        "Reindex",
                        key=f"upload_reindex_{i}",
                        disabled=not who.can_act,
                        prompt=f"Rebuild the chunks of job {r['job_id']}? Search keeps serving "
                        "the current chunks until the new run succeeds.",
                        on_confirm=partial(_reindex, r["job_id"]),
                        danger=False,
                    )
            elif r["duplicate"] and status in ("failed", "cancelled"):
                head.button(
                    "Retry it",
                    key=f"upload_retry_{i}",
                    disabled=not who.can_act,
                    on_click=_retry,
                    args=(r["job_id"],),
                )
    if following and done == len(live):
        st.rerun()  # the last job finished: draw the page once more, and stop following


results = st.session_state.get(RESULTS_KEY) or []
if results:
    waiting = reads.job_rows([r["job_id"] for r in results if r["accepted"]])
    following = any(j["status"] in reads.ACTIVE for j in waiting)
    st.fragment(_results_section, run_every=LIVE_SECONDS if following else None)(results, following)
else:
    st.caption(
        "Files are checked before anything is stored: over the size limit, or bytes that are not "
        "PDF or text, are refused with the reason. The same file uploaded again into the same "
        "dataset returns its existing job instead of indexing it twice."
    )
