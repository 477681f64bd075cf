"""Jobs: filtered, sorted, paginated by the database; live while jobs move; detail of one job."""

from functools import partial

import pandas as pd
import streamlit as st
from sqlmodel import Session
from streamlit_autorefresh import st_autorefresh

from sluice.console import diagnose, ui
from sluice.ops import actions, diagnosis, exports, health, reads, replacing
from sluice.storage.models import ErrorKind, JobStatus, Stage, utcnow
from sluice.storage.queries import SORTABLE, JobFilter

REFRESH_MS = 2000
PAGE_KEY = "jobs_page"

who = ui.operator()
sc = ui.scope()
st.title("Jobs")
ui.scope_caption(sc)
ui.read_only_note(who)

selected = st.query_params.get("job")
detail = reads.job_detail(int(selected)) if selected and selected.isdigit() else None


# --- the detail of one job ------------------------------------------------------------------------
def _do(action, verb: str, job_id: int) -> None:
    ui.flash_outcome(action(who, [job_id]), verb)


def _unlock(job_id: int, key: str) -> None:
    """Give the typed password to the action, then forget it: the field is emptied at once."""
    password = st.session_state.get(key, "")
    st.session_state[key] = ""
    ui.flash_outcome(actions.retry_with_password(who, job_id, password), "Unlock and retry")


def _close() -> None:
    st.query_params.pop("job", None)


def show_detail(d: reads.JobDetail) -> None:
    """One job: what it is, where it stands, why it waits or failed, what can be done, its
    history."""
    box = st.container(border=True)
    _detail_head(box, d)
    _detail_facts(box, d)
    _detail_version(box, d)
    _detail_waiting(box, d)
    _detail_outcome(box, d)
    _detail_actions(box, d.row)
    _detail_history(box, d)


def _detail_head(box, d: reads.JobDetail) -> None:
    r = d.row
    head, close = box.columns([6, 1])
    head.subheader(f"Job {r['id']} · {ui.plain(r['filename'])}")
    close.button("Close", key="close_job", on_click=_close)
    ui.status_badge(r["status"], box)
    box.page_link(
        ui.DOCUMENT_PAGE,
        label="Open the document: its chunks, pages and versions",
        query_params={"doc": f"doc:{r['document_id']}"},
    )


def _detail_facts(box, d: reads.JobDetail) -> None:
    """A row of facts (stage, attempts, counts, worker), and the progress of an active job."""
    r = d.row
    cells = ui.job_cells(r)
    retried = sum(1 for e in d.events if e["kind"] == "retried")
    attempts = cells["attempts"] + (
        f" (after {retried} manual retr{'y' if retried == 1 else 'ies'})" if retried else ""
    )
    pages, chunks = _counts(r)
    facts = [
        ("Stage", cells["progress"] or r["stage"]),
        ("Attempts", attempts),
        ("Dataset", d.dataset),
        ("Pages", pages),
        ("Chunks", chunks),
        ("Worker", r["worker_id"]),
        ("Created", ui.ago(r["created_at"])),
        ("Pipeline", r["pipeline_version"]),
    ]
    for col, (label, value) in zip(box.columns(len(facts)), facts, strict=True):
        col.markdown(f"**{label}**  \n{ui.plain(value) if value not in (None, '') else '—'}")
    if r["total"] and r["status"] in reads.ACTIVE:
        box.progress(min(1.0, r["done"] / r["total"]), text=r["progress"])
    elif r["status"] in reads.ACTIVE:
        box.caption(r["progress"])


def _detail_version(box, d: reads.JobDetail) -> None:
    """What the job is to search: its document's active job, replaced by which job, and the
    version line of an external id (the Document page's words)."""
    version = replacing.job_version(reads.ctx(), d.row["id"])
    if version is None:
        return
    failed = version.version_state in ("failed", "replacement_failed")
    shown = box.warning if failed else box.info if version.version_message else box.caption
    shown(ui.plain(version.message[0].upper() + version.message[1:] + "."))


def _counts(r: dict) -> tuple[str | int | None, str | int | None]:
    """Pages and chunks as they are: a stage's running total only while the job runs (a locked
    file has no page count to tell, a cancelled job's chunks were removed)."""
    active = r["status"] in reads.ACTIVE
    pages: str | int | None = r["page_count"] or (
        r["total"] if active and r["stage"] in ("parsing", "ocr", "chunking") else None
    )
    if not pages and r["error_code"] in actions.LOCKED_CODES:
        pages = "— (locked: no page count without the password)"
    chunks: str | int | None = r["chunk_count"] or (
        r["total"] if active and r["stage"] in ("embedding", "indexing") else None
    )
    if r["status"] == "cancelled" and (chunks or r["stage"] in ("embedding", "indexing")):
        chunks = "0 (removed on cancel)"
    return (f"{pages:,}" if isinstance(pages, int) else pages), (
        f"{chunks:,}" if isinstance(chunks, int) else chunks
    )


def _made(done: dict | None, r: dict) -> str:
    """What a success made, from its event's figures ("1 chunk from 1 page", not "1 chunks")."""
    data = (done or {}).get("data") or {}
    if "chunks" not in data:
        return ui.plain(done["message"]) if done else ui.count(r["chunk_count"] or 0, "chunk")
    made = ui.count(data["chunks"], "chunk")
    if data.get("pages") is not None:
        made += f" from {ui.count(data['pages'], 'page')}"
    return made + f" ({data.get('embedded', 0):,} embedded, {data.get('cached', 0):,} from cache)"


def _detail_waiting(box, d: reads.JobDetail) -> None:
    """Why a paused or active job has not finished yet, when there is something to say."""
    r = d.row
    if d.paused:
        box.warning(
            "**Paused**: this job does not start until resumed. "
            f"{ui.plain(d.paused[0].upper() + d.paused[1:])}. Resume it on the Overview page or "
            "with `sluice resume`.",
            icon=":material/pause_circle:",
        )
    elif r["status"] in reads.ACTIVE:
        position = health.queue_position(r["id"]) if r["status"] == "pending" else None
        ctx = reads.ctx()
        with Session(ctx.engine) as session:  # the API's measures: the same start estimate
            measured = diagnosis.measured(session, ctx.engine, ctx.instance_id)
        why = diagnose.why_waiting(
            r,
            position=position,
            workers=measured.fleet.workers if measured.fleet.reachable else None,
            unsent=d.unsent,
            ahead=d.waiting_ahead,
            lease_seconds=ctx.settings.lease_seconds,
            now=reads.database_now(),
            published_at=d.published_at,
            redeliver_after=ctx.settings.redeliver_after_seconds,
            measured=measured,
        )
        if why:
            getattr(box, why[0])(why[1])


def _detail_outcome(box, d: reads.JobDetail) -> None:
    """What a finished job made, or its error with what to do about it."""
    r = d.row
    if r["status"] == "succeeded":
        done = next((e for e in reversed(d.events) if e["kind"] == "succeeded"), None)
        box.success(
            f"Indexed: {_made(done, r)}; "
            f"finished {ui.ago(r['finished_at'])}. Pipeline {r['pipeline_version']}."
        )
    elif r["error_message"]:
        kind = ui.KIND_LABEL.get(r["error_kind"] or "", r["error_kind"] or "")
        prefix = f"**{kind}** ({ui.plain(ui.words(r['error_code']))}): " if r["error_kind"] else ""
        (box.warning if r["status"] in ("cancelled", "retrying") else box.error)(
            prefix + ui.plain(r["error_message"])
        )
        if r["fix_hint"]:
            box.info(f"**What to do:** {ui.plain(r['fix_hint'])}", icon=":material/build:")
        if d.error_detail:
            with box.expander("Error detail (for developers)"):
                st.code(d.error_detail, language=None)


def _detail_actions(box, r: dict) -> None:
    """The password form of a locked file, then the buttons the job's status allows."""
    job_id, can = r["id"], who.can_act
    if r["status"] == "failed" and r["error_code"] in actions.LOCKED_CODES:
        with box.form(f"unlock_{job_id}", border=False):
            st.text_input(
                "Password of the PDF",
                type="password",
                key=f"password_{job_id}",
                disabled=not can,
                help="Used once to decrypt the file; it is not stored, logged or sent to the "
                "queue.",
            )
            st.form_submit_button(
                "Unlock and retry",
                type="primary",
                disabled=not can,
                on_click=_unlock,
                args=(job_id, f"password_{job_id}"),
            )

    with box.container(horizontal=True):
        if r["status"] in ("pending", "retrying", "running") and not r["cancel_requested"]:
            ui.confirm_button(
                "Cancel job",
                key=f"cancel_{job_id}",
                disabled=not can,
                prompt=(
                    "Stop this job? A running job stops at its next batch and its partial "
                    "chunks are removed; it can be retried later."
                ),
                on_confirm=lambda: _do(actions.cancel, "Cancel", job_id),
            )
        if r["status"] in ("pending", "retrying"):
            st.button(
                "Run next",
                key=f"run_next_{job_id}",
                disabled=not can,
                help="Publish this job before every other waiting job (a priority above theirs).",
                on_click=_do,
                args=(actions.run_next, "Run next", job_id),
            )
        _retry_buttons(r, can)
        if r["status"] == "succeeded":
            ui.confirm_button(
                "Reindex",
                key=f"reindex_{job_id}",
                disabled=not can,
                danger=False,
                prompt=(
                    "Rebuild this document's chunks? Search keeps serving the current "
                    "chunks until the new run succeeds."
                ),
                on_confirm=lambda: _do(actions.reindex, "Reindex", job_id),
            )


def _retry_buttons(r: dict, can: bool) -> None:
    """Retry a failed or cancelled job; when the file itself is the problem, lead with what helps
    (upload a fixed file) and keep retry for a fixed cause."""
    job_id = r["id"]
    outlook = actions.retry_outlook(r)
    if outlook:
        st.page_link(
            "views/upload_page.py", label="Upload a fixed file", icon=":material/upload_file:"
        )
        ui.confirm_button(
            "Retry anyway",
            key=f"retry_{job_id}",
            disabled=not can,
            danger=False,
            prompt=ui.plain(outlook[0].upper() + outlook[1:] + ". Retry anyway?"),
            on_confirm=lambda: _do(actions.retry, "Retry", job_id),
        )
        if not r.get("dismissed"):
            st.button(
                "Dismiss",
                key=f"dismiss_{job_id}",
                disabled=not can,
                help="Take it off the dead-letter list; it stays failed, with its history.",
                on_click=_do,
                args=(actions.dismiss, "Dismiss", job_id),
            )
    elif r["status"] in ("failed", "cancelled"):
        st.button(
            "Retry job",
            key=f"retry_{job_id}",
            type="primary",
            disabled=not can,
            on_click=_do,
            args=(actions.retry, "Retry", job_id),
        )


def _detail_history(box, d: reads.JobDetail) -> None:
    """The timeline of the job's attempts, and every event in an expander."""
    r = d.row
    box.markdown("**Timeline**")
    now = utcnow()
    box.dataframe(
        pd.DataFrame(
            [
                {
                    "phase": p.what,
                    "started": p.started.strftime("%Y-%m-%d %H:%M:%S"),
                    "took": ui.duration(p.seconds)
                    if p.ended
                    else (
                        f"{ui.duration((now - p.started).total_seconds())} so far"
                        if r["status"] in reads.ACTIVE
                        else "—"
                    ),
                    "worker": p.worker,
                    "outcome": p.outcome,
                    "stage reached": p.reached,
                }
                for p in d.phases
            ]
        ),
        hide_index=True,
    )
    with box.expander(f"All events ({len(d.events)})", expanded=r["status"] not in ("succeeded",)):
        st.dataframe(
            pd.DataFrame(
                [
                    {
                        "at": e["at"].strftime("%H:%M:%S.%f")[:-3],
                        "event": e["kind"],
                        "status": f"{e['from'] or ''} → {e['to']}" if e["to"] else "",
                        "stage": e["stage"],
                        "attempt": e["attempt"],
                        "by": e["actor"],
                        "message": e["message"],
                    }
                    for e in d.events
                ]
            ),
            hide_index=True,
        )


if selected:
    if detail is None:
        st.warning(f"There is no job {ui.plain(selected)}.")
    else:
        show_detail(detail)


# --- filters --------------------------------------------------------------------------------------
c1, c2, c3, c4 = st.columns([2, 2, 2, 3])
statuses = c1.multiselect("Status", [s.value for s in JobStatus], key="status", bind="query-params")
stages = c2.multiselect("Stage", [s.value for s in Stage], key="stage", bind="query-params")
kinds = c3.multiselect("Error kind", [k.value for k in ErrorKind], key="kind", bind="query-params")
name = c4.text_input("File name contains", key="q", bind="query-params")
c5, c6, c7, c8 = st.columns([2, 2, 2, 3])
sort = c5.selectbox("Sort by", list(SORTABLE), key="sort", bind="query-params")
descending = c6.toggle("Descending", value=True, key="desc")
page_size = c7.selectbox("Rows per page", [25, 50, 100], index=1, key="rows")
paused = c8.toggle(
    "Pause live refresh",
    key="pause_refresh",
    help=f"While any job on this page is active, the page refreshes every {REFRESH_MS / 1000:.0f} "
    "s.",
)

f = JobFilter(
    dataset_id=sc.dataset_id,
    statuses=statuses,
    stages=stages,
    error_kinds=kinds,
    name_contains=name.strip(),
)
page = reads.jobs_page(
    f, sort=sort, descending=descending, page=st.session_state.get(PAGE_KEY, 1), page_size=page_size
)

active = page.any_active or (detail is not None and detail.row["status"] in reads.ACTIVE)
if active and not paused:
    st_autorefresh(interval=REFRESH_MS, key="jobs_autorefresh")

first = (page.page - 1) * page.page_size + 1
shown = f"{first:,}–{first + len(page.rows) - 1:,}" if page.rows else "0"
live = (
    "paused"
    if paused
    else (f"live, every {REFRESH_MS / 1000:.0f} s" if active else "live once jobs are active")
)
st.caption(f"Jobs {shown} of {page.total:,} ({live}). Select a row to open the job.")


# --- the table ------------------------------------------------------------------------------------
def _fraction(r: dict) -> float | None:
    """A bar only where it means something: the current stage of an active job, or a finished
    one."""
    if r["status"] == "succeeded":
        return 1.0
    if r["status"] in reads.ACTIVE and r["total"]:
        return r["done"] / r["total"]
    return None


def _pick(key: str, ids: list[int]) -> None:
    rows = st.session_state[key]["selection"]["rows"]
    if rows:
        st.query_params["job"] = str(ids[rows[0]])


ids = [r["id"] for r in page.rows]
table = pd.DataFrame(
    [
        {
            "job": r["id"],
            **{k: v for k, v in ui.job_cells(r).items() if k != "error"},
            "file": r["filename"],
            "dataset": r["dataset"],
            "stage progress": _fraction(r),
            "updated": ui.ago(r["updated_at"]),
            "error": ui.job_cells(r)["error"],
        }
        for r in page.rows
    ],
    columns=[
        "job",
        "status",
        "file",
        "dataset",
        "stage progress",
        "progress",
        "attempts",
        "updated",
        "error",
    ],
)
if sc.dataset:
    table = table.drop(columns=["dataset"])
table_key = f"jobs_table_{hash(tuple(ids))}"
st.dataframe(
    table.style.map(ui.status_cell_style, subset=["status"]),
    hide_index=True,
    key=table_key,
    on_select=partial(_pick, table_key, ids),
    selection_mode="single-row",
    placeholder="",
    column_config={
        "job": st.column_config.NumberColumn("job", format="%d", width="small"),
        "stage progress": st.column_config.ProgressColumn(
            "stage progress",
            min_value=0.0,
            max_value=1.0,
            format="percent",
            help="Done of total in the current stage (pages while parsing and chunking, chunks "
            "while embedding and indexing); empty while queued.",
        ),
        "progress": st.column_config.TextColumn(
            "counts",
            width="medium",
            help="Stage with its counts while active; where it stopped once failed or cancelled.",
        ),
        "file": st.column_config.TextColumn("file", width="medium"),
        "status": st.column_config.TextColumn("status", width="small"),
        "attempts": st.column_config.TextColumn(
            "attempts", width="small", help="Attempts used; while a job is active, of how many."
        ),
        "updated": st.column_config.TextColumn("updated", width="small"),
        "error": st.column_config.TextColumn("error", width="large"),
    },
)
st.download_button(  # the table toolbar's own CSV download is off: it keeps formulas live
    "Download as CSV",
    exports.table_csv(table.to_dict("records"), list(table.columns)),
    file_name="jobs.csv",
    mime="text/csv",
    key="jobs_csv",
    on_click="ignore",
)
if page.pages > 1:
    if st.session_state.get(PAGE_KEY, 1) > page.pages:
        st.session_state[PAGE_KEY] = page.pages
    st.pagination(page.pages, key=PAGE_KEY)


def _bulk(action: str) -> None:
    ui.flash_outcome(
        actions.bulk(who, action, f),
        {"retry": "Retry", "cancel": "Cancel", "reindex": "Reindex", "delete": "Delete"}[action],
    )


with st.expander(f"Act on all {page.total:,} matching job(s)"):
    st.caption(
        "Retry, cancel, reindex or delete every job the filters above match, not only this page. "
        "Each job gets its own entry in its history."
    )
    bulk_action = st.segmented_control(
        "Action", ["retry", "cancel", "reindex", "delete"], key="bulk_action"
    )
    if bulk_action:
        plan = reads.bulk_preview(
            bulk_action,
            f,
            ids=False,
            with_cost=st.toggle(
                "Count the embedding cost (parses a sample of the documents)",
                key="bulk_cost",
                disabled=not who.can_act or bulk_action not in ("retry", "reindex"),
            ),
            who=who,
        )
        st.info(plan.describe(), icon=":material/preview:")
        ui.confirm_button(
            f"{bulk_action.capitalize()} {plan.applicable:,} job(s)",
            key=f"bulk_{bulk_action}",
            disabled=not (who.can_act and plan.applicable),
            danger=bulk_action in ("cancel", "delete"),
            prompt=f"{plan.describe()} Go ahead?",
            on_confirm=partial(_bulk, bulk_action),
        )

with st.popover("Open a job by id"):
    wanted = st.number_input("Job id", min_value=1, step=1, value=None, key="open_job_id")
    if st.button("Open", key="open_job") and wanted:
        st.query_params["job"] = str(int(wanted))
        st.rerun()
