"""Integrity: does the index hold what the job database promises? The reconcile report and its
repair (with a preview of what repair does), deleting a document, and moving documents to the
pipeline version the settings make now (with a preview of the work)."""

import pandas as pd
import streamlit as st

from sluice.console import ui
from sluice.console.background import Background
from sluice.ops import actions, reads
from sluice.ops.documents import UnknownReference

PREVIEW_SAMPLE = 10  # documents parsed for the reindex preview
COMPARED_CHUNKS = 12  # chunks of one document shown before and after a reindex
ROWS = 500  # findings and candidates shown

who = ui.operator()
sc = ui.scope()
st.title("Integrity")
ui.scope_caption(sc)
ui.read_only_note(who)


@st.cache_resource
def _runs() -> Background:
    """One reconcile at a time per console process, in a thread (the script thread stays quick)."""
    return Background()


runs = _runs()


def _run_reconcile(repair: bool, changed_only: bool = False) -> None:
    if repair and not who.can_act:
        ui.flash("error", actions.reconcile(who, repair=True).errors[0])
        return

    def job():
        return actions.reconcile(who, repair=repair, dataset=sc.dataset, changed_only=changed_only)

    label = ("repair" if repair else "check") + (" of what changed" if changed_only else "")
    if not runs.start(job, label=label):
        ui.flash("warning", "A reconcile is already running; its report appears here when it ends.")


def _latest() -> dict | None:
    """The newest report that speaks for this page's dataset (or for all of them)."""
    reports = [
        r
        for r in (runs.report, reads.last_reconcile())
        if r and reads.reconcile_covers(r, sc.dataset)
    ]
    return max(reports, key=lambda r: r["finished_at"]) if reports else None


# --- reconcile ------------------------------------------------------------------------------------

st.subheader("Reconcile")
st.caption(
    "For every finished job, the chunk ids it must have in Chroma follow from the document's "
    "hash, the pipeline version and the chunk count. Reconcile walks each collection page by page "
    "and reports missing chunks, orphans (chunks no serving job owns: leftovers of cancelled, "
    "failed, superseded or deleted work, or foreign) and chunks whose metadata names the wrong "
    "job, document or version. Chunks of jobs that are queued or running are left alone. "
    "**Check what changed** reads only the chunks of the jobs that changed since the last repair "
    "(what Sluice itself changed); a full check also finds what was done to the index behind its "
    "back."
)
left, changes, mid, right = st.columns([1, 1, 1, 2])
CHECKS = (  # both dry runs: they report and change nothing
    (left, "Check now", "reconcile_check", "fact_check", False, "Every chunk of the index."),
    (
        changes,
        "Check what changed",
        "reconcile_changed",
        "difference",
        True,
        "The jobs that changed since the last repair (all of them where there has been none): "
        "seconds on a large index.",
    ),
)
for column, label, key, icon, changed_only, scope_help in CHECKS:
    column.button(
        label,
        key=key,
        icon=f":material/{icon}:",
        disabled=runs.running,
        on_click=_run_reconcile,
        args=(False, changed_only),
        help=f"A dry run: reports, changes nothing. {scope_help}",
    )
if runs.running:
    mid.button("Refresh", key="reconcile_refresh", icon=":material/refresh:")


@st.fragment(run_every=2 if runs.running else None)
def _progress() -> None:
    """While a run is under way, look every 2 s; when it has ended, redraw the page with its
    report."""
    if runs.running:
        st.info(
            f"A {runs.label} is running (started {ui.duration(runs.seconds_running)} ago); its "
            "report appears here when it ends.",
            icon=":material/progress_activity:",
        )
    elif st.session_state.pop("reconcile_watching", False):
        st.rerun()
    if runs.running:
        st.session_state["reconcile_watching"] = True


with right:
    _progress()
if runs.error:
    st.error(f"The last reconcile failed: {ui.plain(runs.error)}")


def _index_returns(report: dict) -> None:
    """What each dataset's vector index returns: its own vector finds each sampled chunk, and
    sample queries find what exact search over the stored vectors finds."""
    for d in report["datasets"]:
        index = d.get("index") or {}
        if not index:
            continue
        text = f"{ui.plain(d['name'])}: {ui.plain(d.get('index_text', ''))}"
        if index.get("healthy", True):
            st.caption(text)
        else:
            st.warning(
                text + ". Search can miss chunks that are there; **Repair** rebuilds the index.",
                icon=":material/travel_explore:",
            )


report = _latest()
if report is None:
    st.info(
        (
            "No reconcile has run on this machine yet. "
            if sc.dataset is None
            else f"No reconcile of dataset {ui.plain(sc.dataset)} has run on this machine yet. "
        )
        + "**Check now** runs one; `sluice reconcile` and the "
        "periodic task (SLUICE_RECONCILE_INTERVAL_MINUTES) leave their reports here too."
    )
else:
    scope = f"dataset {ui.plain(report['scope'])}" if report.get("scope") else "all datasets"
    kind = "repair" if report["repair"] else "check"
    passes = report.get("kind", "full")
    checked = sum(d.get("jobs_checked", 0) for d in report["datasets"])
    how = (
        "every chunk read"
        if passes == "full"
        else f"the chunks of {ui.count(checked, 'job')} that changed since the last repair"
    )
    st.caption(
        f"Last {kind} of {scope} ({how}): {ui.ago(report['finished_at'])}, by "
        f"{ui.plain(report['actor'])}, {ui.duration(report['seconds'])}."
    )
    c = st.columns(5)
    c[0].metric("Chunks checked", f"{report['chunks']:,}")
    c[1].metric("Missing", f"{report['missing']:,}")
    c[2].metric("Orphans", f"{report['orphans']:,}")
    c[3].metric("Metadata mismatches", f"{report['mismatched']:,}")
    c[4].metric(
        "Of jobs in flight",
        f"{sum(d['in_flight'] for d in report['datasets']):,}",
        help="Chunks of queued or running jobs: not judged, never touched.",
    )
    for error in report["errors"]:
        st.error(ui.plain(error))
    for note in report.get("notes", []):
        st.caption(f"Note: {ui.plain(note)}")
    _index_returns(report)
    in_flight = sum(d["in_flight"] for d in report["datasets"])
    if report["clean"] and in_flight:
        st.success(
            f"Nothing to repair: every finished job's chunks are in place. {in_flight:,} chunk(s) "
            "of jobs still queued or running are judged once those jobs finish."
        )
    elif report["clean"] and passes != "full":
        st.success("Clean: what changed since the last repair is as the job database promises.")
    elif report["clean"]:
        st.success("Clean: the index holds exactly what the job database promises.")
    elif report["findings"]:
        st.dataframe(
            pd.DataFrame(
                [
                    {
                        "dataset": f["dataset"],
                        "document": f["document_id"] if f["document_id"] is not None else "—",
                        "file": f["filename"] or "(no document: foreign chunks)",
                        "missing": f["missing"],
                        "orphans": f["orphans"],
                        "mismatched": f["mismatched"],
                        "why": "; ".join(f"{n} {why}" for why, n in f["orphan_sources"].items())
                        or "; ".join(
                            ", ".join(
                                f"{k}: {v[0]!r} should be {v[1]!r}" for k, v in m["fields"].items()
                            )
                            for m in f["mismatches"][:1]
                        ),
                        ("repair did" if report["repair"] else "repair would"): "; ".join(
                            f["repair"]
                        ),
                    }
                    for f in report["findings"][:ROWS]
                ]
            ),
            hide_index=True,
            column_config={
                "dataset": st.column_config.TextColumn(width="small"),
                "document": st.column_config.TextColumn(width="small"),
                "missing": st.column_config.NumberColumn(width="small"),
                "orphans": st.column_config.NumberColumn(width="small"),
                "mismatched": st.column_config.NumberColumn(width="small"),
                "why": st.column_config.TextColumn(width="medium"),
                ("repair did" if report["repair"] else "repair would"): st.column_config.TextColumn(
                    width="large"
                ),
            },
        )
    if report["repair"] and report["actions"]:
        with st.expander(f"What repair did ({len(report['actions'])})", expanded=True):
            st.markdown("\n".join(f"- {ui.plain(a)}" for a in report["actions"]))
    plan = report["repair_plan"]
    changed_only = bool(report.get("changed_only"))  # a repair checks again as this check did
    if not report["repair"] and not report["clean"]:
        preview = (
            f"Repair checks again, then deletes **{plan['delete_orphans']:,}** orphan chunk(s), "
            f"rewrites the metadata of **{plan['fix_metadata']:,}** chunk(s), and queues a rebuild "
            f"of **{plan['rebuild_documents']:,}** document(s) with missing chunks "
            f"({ui.count(plan['missing_chunks'], 'chunk')}, taken from the embedding cache where "
            "it has them)"
            + (
                f"; in the lexical index it deletes **{plan['delete_lexical_orphans']:,}** orphan "
                f"row(s) and fixes **{plan['fix_lexical_fields']:,}**"
                if plan.get("delete_lexical_orphans") or plan.get("fix_lexical_fields")
                else ""
            )
            + (
                f"; it rebuilds the vector index of **{plan['rebuild_collections']:,}** dataset(s) "
                "that does not return what it holds (built beside the old one, switched, the old "
                "one dropped: search never goes without)"
                if plan.get("rebuild_collections")
                else ""
            )
            + ". Every change is recorded on the job it concerns."
        )
        st.info(preview, icon=":material/build:")
        ui.confirm_button(
            "Repair",
            key="reconcile_repair",
            disabled=not who.can_act or runs.running,
            prompt=preview,
            on_confirm=lambda: _run_reconcile(True, changed_only),
        )
    with st.expander("Per dataset"):
        st.dataframe(
            pd.DataFrame(
                [{k: v for k, v in d.items() if k != "index"} for d in report["datasets"]]
            ),
            hide_index=True,
        )


# --- delete a document ----------------------------------------------------------------------------

st.subheader("Delete a document")
st.caption(
    "Removes the document's chunks from the index and its file from the blob store (unless another "
    "document, in any dataset, has the same bytes), and marks its jobs deleted. The jobs and their "
    "history stay. A job id names its document; write doc:42 for document 42."
)
ref = st.text_input("Job id or doc:ID", key="delete_ref", placeholder="e.g. 17 or doc:42").strip()


def _delete(target: str) -> None:
    result = actions.delete_document(who, target)
    ui.flash("success" if result.ok else "error", result.message)
    st.session_state["delete_ref"] = ""


if ref:
    try:
        info = reads.document_info(ref)
    except UnknownReference as exc:
        st.error(ui.plain(exc))
    else:
        box = st.container(border=True)
        box.markdown(
            f"**{ui.plain(info.filename)}** · document {info.document_id} · dataset "
            f"{ui.plain(info.dataset)} · {info.size:,} bytes"
        )
        box.dataframe(pd.DataFrame(info.jobs), hide_index=True)
        blob = (
            f"keeps the file: {info.blob_shared_with} other document(s) have the same bytes"
            if info.blob_shared_with
            else "removes the file too"
        )
        box.caption(
            f"{info.vectors:,} chunk(s) in the index. Deleting removes them and {blob}."
            + (
                f" Job(s) {', '.join(map(str, info.running))} are running and stop at their next "
                "batch."
                if info.running
                else ""
            )
        )
        if info.deleted:
            box.info(
                "This document is already deleted; deleting again removes anything left behind."
            )
        with box:
            ui.confirm_button(
                "Delete document",
                key=f"delete_doc:{info.document_id}",
                disabled=not who.can_act,
                prompt=f"Delete {ui.plain(info.filename)} (document {info.document_id}) from "
                f"dataset {ui.plain(info.dataset)}? Search stops answering it at once.",
                on_confirm=lambda: _delete(f"doc:{info.document_id}"),
            )


# --- pipeline version -----------------------------------------------------------------------------

st.subheader("Pipeline version")
pipe = reads.pipeline_of(sc.dataset_id)
whose = f"Dataset {ui.plain(sc.dataset)}'s own settings make" if pipe.own else "The settings make"
st.caption(
    f"{whose} pipeline **{pipe.version}** (chunks of {pipe.chunk_size} characters, overlap "
    f"{pipe.chunk_overlap}, model {ui.plain(pipe.model)}). Reindexing builds each older document "
    "again beside its old chunks; search switches a document only when its new job has succeeded, "
    "then the old chunks are removed. Run the workers with the same settings first."
)


@st.cache_data(ttl=120, show_spinner="Counting the chunks of a sample of documents...")
def _plan(dataset: str | None, version: str) -> dict:
    return reads.reindex_plan(dataset, sample=PREVIEW_SAMPLE).to_dict()


@st.cache_data(ttl=120, show_spinner="Parsing a sample of documents with the pipeline in force...")
def _changed(dataset: str | None, version: str) -> dict:
    return reads.reindex_changes(dataset).to_dict()


def _changes(dataset: str | None, version: str) -> None:
    """A sample of documents: the chunks served today beside the chunks a reindex makes."""
    found = _changed(dataset, version)
    sampled = found["sampled"]
    if not sampled:
        st.caption("Nothing to compare.")
        return
    st.caption(
        f"{sum(d['changed'] for d in sampled)} of {len(sampled)} sampled document(s) change. "
        "Table rows count the lines that keep a table's cells in order on one line; a heading "
        "path is the section a chunk belongs to, embedded and indexed with it."
    )
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "document": d["filename"],
                    "chunks": f"{len(d['before'])} → {len(d['after'])}",
                    "table rows": "{} → {}".format(*d["table_rows"]),
                    "with a heading path": "{} → {}".format(*d["headed"]),
                    "note": d["error"] or ("" if d["changed"] else "the same text"),
                }
                for d in sampled
            ]
        ),
        hide_index=True,
    )
    names = {f"{d['filename']} (document {d['document_id']})": d for d in sampled}
    shown = names[st.selectbox("Compare", list(names), key="reindex_compare")]
    before, after = st.columns(2)
    before.markdown(f"**Today** (pipeline {ui.plain(shown['from_version'])})")
    after.markdown(f"**After the reindex** (pipeline {ui.plain(shown['to_version'])})")
    for column, texts in ((before, shown["before"]), (after, shown["after"])):
        for text in texts[:COMPARED_CHUNKS]:
            column.container(border=True).markdown(ui.chunk_markdown(text))
        if len(texts) > COMPARED_CHUNKS:
            column.caption(f"and {len(texts) - COMPARED_CHUNKS:,} more chunks")


def _target(version: str, versions: dict | None = None) -> str:
    """The version a reindex builds, in words: one, or each dataset's own (they differ)."""
    if version != reads.EACH_DATASET:
        return f"pipeline {version}"
    named = ", ".join(f"{n} {v}" for n, v in sorted((versions or {}).items()))
    return "its dataset's pipeline version" + (f" ({named})" if named else "")


def _reindex_all() -> None:
    result = actions.reindex_all(who, dataset=sc.dataset)
    if result.queued:
        ui.flash(
            "success",
            f"{result.queued} job(s) queued for {_target(result.pipeline_version)}"
            + (f"; {result.underway} already under way" if result.underway else ""),
        )
    for r in [r for r in result.results if not r.ok][:10]:
        ui.flash("error", r.message)
    if result.queue_error:
        ui.flash("warning", result.queue_note)
    _plan.clear()
    _changed.clear()


if st.toggle("Preview a reindex to this version", key="reindex_preview"):
    plan = _plan(sc.dataset, pipe.version)
    p = plan["preview"]
    about = "≈ " if p["estimated"] else ""
    if not plan["documents"]:
        st.success(
            f"Every document is on {_target(plan['pipeline_version'], plan.get('versions'))}"
            + (
                f" or has a job of it under way ({plan['underway']:,})."
                if plan["underway"]
                else "."
            )
        )
    else:
        cols = st.columns(4)
        cols[0].metric(
            "Documents to rebuild",
            f"{plan['documents']:,}",
            help=f"{plan['underway']:,} more already have a job of this version under way.",
        )
        cols[1].metric(
            "New chunks",
            f"{about}{p['chunks']:,}",
            help=f"{ui.count(plan['old_chunks'], 'chunk')} serve them today.",
        )
        cols[2].metric(
            "From the embedding cache",
            f"{about}{p['cached']:,}",
            help=f"{p['cache_hit_rate']:.0%} of the chunks to write are in the cache.",
        )
        cols[3].metric("To embed", f"{about}{p['to_embed']:,}")
        if p["estimated"]:
            st.caption(f"Estimated from {p['sampled']} parsed document(s).")
        st.dataframe(pd.DataFrame(plan["candidates"][:ROWS]), hide_index=True)
        with st.expander("What changes in what search serves"):
            _changes(sc.dataset, pipe.version)
        ui.confirm_button(
            f"Reindex {plan['documents']:,} document(s)",
            key="reindex_all",
            danger=False,
            disabled=not who.can_act,
            prompt=f"Queue a job of {_target(plan['pipeline_version'])} for {plan['documents']:,} "
            f"document(s) ({about}{ui.count(p['to_embed'], 'chunk')} to embed)? Search keeps "
            "serving the old version of each until its new job succeeds.",
            on_confirm=_reindex_all,
        )
