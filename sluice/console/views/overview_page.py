"""Overview: job counts, the queue, workers, throughput, failures and when the queue will drain."""

import pandas as pd
import streamlit as st

from sluice.console import ui
from sluice.ops import health, pausing, reads

who = ui.operator()
sc = ui.scope()
st.title("Overview")
ui.scope_caption(sc)

ov = reads.overview(sc.dataset_id)
queue = health.queue_state()

if not any(ov.counts.values()):
    st.info(
        f"Nothing here yet. Start by uploading documents: {reads.supported_formats()[0]} go "
        "into a dataset (a knowledge base; `default` exists already), and each becomes a job that "
        "parses, chunks, embeds and indexes it. From a shell: `sluice ingest PATH --dataset NAME`.",
        icon=":material/waving_hand:",
    )
    st.page_link("views/upload_page.py", label="Upload documents", icon=":material/upload_file:")

if not queue.reachable:
    st.warning(
        "The queue Redis is unreachable, so queue depth and workers are unknown. Uploads and "
        f"retries still work: their jobs are published when the queue is back. ({queue.error})",
        icon=":material/warning:",
    )
elif not queue.workers and ov.active:
    st.warning(
        f"No worker is alive, and {ov.active} job(s) are waiting. Start one with `sluice serve "
        "worker`.",
        icon=":material/warning:",
    )


def _pause_flash(done: pausing.PauseResult) -> None:
    # show_flashes escapes what it shows: the words as they are, escaped once.
    ui.flash("success" if done.ok else "error", done.message)
    if done.queue_note:
        ui.flash("warning", done.queue_note)


held = pausing.active()
for p in held:
    line, button = st.columns([5, 1])
    line.warning(
        f"**{ui.plain(p['text'][:1].upper() + p['text'][1:])}**. Its jobs do not start; running "
        "jobs finish; uploads are accepted.",
        icon=":material/pause_circle:",
    )
    button.button(
        "Resume",
        key=f"resume_{p['scope']}",
        type="primary",
        disabled=not who.can_act,
        on_click=lambda d=p["dataset_id"]: _pause_flash(pausing.resume(who, dataset_id=d)),
    )
target = "the whole queue" if sc.dataset_id is None else f"dataset {ui.plain(sc.dataset)}"
if not any(p["dataset_id"] == sc.dataset_id for p in held):
    with st.expander(f"Pause {target}"):
        st.text_input("Reason (shown to other operators)", key="pause_reason")
        ui.confirm_button(
            f"Pause {target}",
            key="pause_scope",
            disabled=not who.can_act,
            danger=False,
            prompt=f"Stop starting jobs of {target}? Running jobs finish; uploads are still "
            "accepted.",
            on_confirm=lambda: _pause_flash(
                pausing.pause(
                    who, dataset_id=sc.dataset_id, reason=st.session_state.get("pause_reason", "")
                )
            ),
        )

cols = st.columns(8)
for col, status in zip(
    cols,
    ["pending", "running", "retrying", "succeeded", "failed", "cancelled", "superseded", "deleted"],
    strict=True,
):
    col.metric(status, f"{ov.counts.get(status, 0):,}")

c1, c2, c3, c4 = st.columns(4)
c1.metric(
    "Queue depth",
    f"{queue.depth:,}" if queue.reachable else "unknown",
    help="Messages in the queue Redis (queued + scheduled retries).",
)
if queue.reachable:
    c1.caption(f"{queue.queued:,} queued, {queue.scheduled:,} scheduled")
fleet = reads.workers(queue.workers, sc.dataset_id) if queue.reachable else []
threads = sum(w.threads or 0 for w in fleet)
c2.metric(
    "Workers alive",
    len(fleet) if queue.reachable else "unknown",
    help="Consumer processes whose presence key was refreshed in the last few seconds; each runs "
    "several worker threads, each thread one job at a time.",
)
if fleet:
    c2.caption(
        f"{len(fleet)} process(es), {threads} thread(s); {ov.counts.get('running', 0)} job(s) "
        "running"
    )
c3.metric("Oldest pending job", ui.ago(ov.oldest_pending) if ov.oldest_pending else "none")
eta = ov.drain.eta
c4.metric(
    "Queue drains in",
    "now empty" if ov.active == 0 else ui.eta(eta),
    help="Chunks left (exact for jobs already embedding, estimated from file sizes for the rest) "
    "divided by the chunks per second the workers reached while busy over the last hour.",
)
if ov.active:
    c4.caption(ov.drain.describe())

left, right = st.columns([3, 1])
with left:
    span = st.segmented_control(
        "Throughput over",
        ["last hour", "last 24 hours"],
        default="last hour",
        key="throughput_span",
    )
    day = span == "last 24 hours"
    unit = "hour" if day else "min"
    st.subheader(f"Throughput, {span or 'last hour'}")
    frame = pd.DataFrame(ov.throughput_day if day else ov.throughput)
    if frame.empty or not (frame["succeeded"].sum() or frame["failed"].sum()):
        st.caption(f"No job finished in the {span or 'last hour'}.")
    else:
        frame = frame.set_index("minute")
        st.caption(f"Jobs finished per {unit}: succeeded and failed")
        st.bar_chart(
            frame[["succeeded", "failed"]],
            y_label=f"jobs / {unit}",
            color=["#2e7d32", "#c62828"],
            height=220,
        )
        st.caption(f"Chunks embedded per {unit}")
        st.line_chart(frame[["chunks"]], y_label=f"chunks / {unit}", height=180)
with right:
    st.subheader("Failures by kind")
    if not ov.failures:
        st.caption("No failed jobs.")
    for kind, n in sorted(ov.failures.items(), key=lambda kv: -kv[1]):
        st.metric(ui.KIND_LABEL.get(kind, kind), f"{n:,}")
    if ov.failures:
        st.page_link(
            "views/dead_letters_page.py", label="Open dead letters", icon=":material/report:"
        )

if fleet:
    with st.expander(f"Workers: {len(fleet)} process(es), {threads} thread(s)"):
        st.dataframe(
            pd.DataFrame(
                [
                    {
                        "worker": w.id,
                        "host": w.host,
                        "threads": w.threads,
                        "running now": "; ".join(w.running) or "idle",
                        "up for": ui.duration(w.uptime_seconds),
                        "started": ui.local_time(w.started),
                        "last seen": f"{ui.duration(w.seen_seconds_ago)} ago",
                    }
                    for w in fleet
                ]
            ),
            hide_index=True,
        )
