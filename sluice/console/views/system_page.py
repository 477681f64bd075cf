"""System: the configuration in force (secrets only as set / not set), services, versions, datasets,
and the webhook delivery log."""

import pandas as pd
import streamlit as st

from sluice.console import ui
from sluice.ops import health, reads
from sluice.pipeline.queueing import recovery

context = reads.ctx()
settings = context.settings
st.title("System")

st.subheader("Services")
probes = health.probes(settings)
for p in probes:
    (st.success if p.reachable else st.error)(
        f"**{p.name}** at {ui.plain(p.address)}: {'reachable' if p.reachable else 'unreachable'} — "
        f"{ui.plain(p.detail)}"
    )
queue = health.queue_state()
if queue.reachable:
    st.caption(
        f"Queue `{settings.queue_name}`: {queue.queued:,} queued, {queue.scheduled:,} scheduled; "
        f"{len(queue.workers)} worker(s) alive."
    )

reaper = reads.reaper_state()
if reaper.last_tick_seconds_ago is None:
    st.caption(
        "Recovery: no worker's recovery round has run yet; stalled jobs are taken back once a "
        "worker runs."
    )
elif reaper.last_tick_seconds_ago > recovery.silence_seconds(settings):
    st.warning(
        f"No worker's recovery round has run for {ui.duration(reaper.last_tick_seconds_ago)}: jobs "
        "whose worker died are not taken back until a worker runs (or `sluice recover` is run)."
    )
else:
    st.caption(
        f"Recovery: the last round of any worker ran {ui.duration(reaper.last_tick_seconds_ago)} "
        "ago."
    )
if reaper.held_for_seconds > 0:
    st.info(
        f"Taking stalled jobs back is held for {ui.duration(reaper.held_for_seconds)} more: every "
        "worker's recovery was silent (job database down, or no worker), so no heartbeat could be "
        "written meanwhile. Live workers beat again within this grace; jobs that stay silent are "
        "then retried."
    )

st.caption(
    f"Instance `{context.instance_id}`: made with this job database; every queue message carries "
    "it, and workers of another instance on the same queue leave this instance's messages alone."
)

st.subheader("Pipeline")
c1, c2, c3, c4 = st.columns(4)
c1.metric(
    "Pipeline version",
    context.pipeline_version,
    help="Changes with the chunker, chunk size, overlap and model; part of every chunk id.",
)
c2.metric(
    "Embedder",
    (settings.embedder if settings.embedder == "hash" else settings.embed_model).split("/")[-1],
    help=f"{settings.embedder}: {settings.embed_model}. It embeds English text; other languages "
    "are found through the exact words they contain rather than their meaning.",
)
c3.metric(
    "Precision in force",
    context.precision,
    help=f"SLUICE_EMBED_PRECISION={settings.embed_precision}; auto picks bf16 where the CPU has "
    "it.",
)
c4.metric("Batch size", settings.embed_batch_size)
rates = pd.DataFrame(reads.rates_last_hour()).set_index("minute")
if not rates.to_numpy().any():
    st.caption("No job finished in the last hour: nothing to chart.")
else:
    st.caption(
        "Chunks and jobs per second over the last hour, every dataset: each minute's finished "
        "jobs (succeeded or failed) and the chunks they embedded, over its 60 seconds."
    )
    left, right = st.columns(2)
    left.line_chart(rates[["chunks per second"]], y_label="chunks / s", height=180)
    right.line_chart(rates[["jobs per second"]], y_label="jobs / s", height=180)

st.subheader("Datasets")
summaries = reads.dataset_summaries()
st.dataframe(
    pd.DataFrame(
        [
            {
                "dataset": s["name"],
                "documents": s["documents"],
                "chunks": s["chunks"],
                "jobs": sum(s["jobs"].values()),
                "collection": s["collection"],
                "created": s["created_at"][:19],
            }
            for s in summaries
        ]
    ),
    hide_index=True,
)

left, right = st.columns(2)
with left:
    st.subheader("Configuration in force")
    st.caption("From the environment and SLUICE_ENV_FILE; secrets appear only as set / not set.")
    config = sorted(settings.public_view(full=ui.operator().can_act).items())
    st.dataframe(
        pd.DataFrame(config, columns=["variable", "value"]),
        hide_index=True,
        height=35 * (len(config) + 1) + 3,
    )
with right:
    st.subheader("Secrets")
    st.dataframe(
        pd.DataFrame(
            [(k, "set" if v else "not set") for k, v in settings.secrets_status().items()],
            columns=["secret", "state"],
        ),
        hide_index=True,
    )
    st.subheader("Versions")
    st.caption(
        "Python packages installed in this console's environment (workers should match). The "
        "servers' own versions are under Services above."
    )
    st.dataframe(
        pd.DataFrame(
            sorted(health.versions().items()), columns=["package (installed here)", "version"]
        ),
        hide_index=True,
    )

st.subheader("Webhooks")
hooks = reads.webhook_log(limit=50, full=ui.operator().can_act)
if not hooks["endpoints"]:
    st.caption(
        "No endpoints: set SLUICE_WEBHOOK_URLS (and SLUICE_WEBHOOK_SECRET) to have a signed JSON "
        "event posted when a job succeeds, becomes a dead letter or is cancelled."
    )
for e in hooks["endpoints"]:
    note = "" if e["configured"] else " (no longer configured)"
    st.markdown(
        ui.plain(
            f"{e['endpoint']}{note}: {e['delivered']:,} delivered, {e['waiting']:,} waiting, "
            f"{e['gave_up']:,} given up; last delivered {ui.ago(e['last_delivered_at'])}"
        )
    )
    rows = [d for d in hooks["deliveries"] if d["key"] == e["key"]]
    if rows:
        st.dataframe(
            pd.DataFrame(
                [
                    {
                        "event": d["event"],
                        "job": d["job_id"],
                        "state": d["state"],
                        "attempts": d["attempts"],
                        "created": ui.local_time(d["created_at"]),
                        "delivered / next try": ui.local_time(
                            d["delivered_at"] or d["next_attempt_at"]
                        ),
                        "HTTP": d["last_status"],
                        "last error": d["last_error"] or "",
                    }
                    for d in rows
                ]
            ),
            hide_index=True,
        )
