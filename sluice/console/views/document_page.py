"""One document: metadata, jobs and versions, the chunks search serves (in order, with pages), the
source page rendered with the chosen chunk located on it, and the original file for operators."""

import json

import streamlit as st

from sluice.console import ui
from sluice.errors import OperationError
from sluice.ops import actions, document_view, reads, replacing
from sluice.ops import metadata as meta
from sluice.ops.access import ReadOnlyOperator
from sluice.ops.chunks import MAX_CHUNK_TEXT
from sluice.ops.documents import UnknownReference
from sluice.storage.blobs import BlobMissing

who = ui.operator()
st.title("Document")

ref = st.query_params.get("doc") or ""
typed = st.text_input(
    "Job id or doc:ID",
    value=ref,
    key="document_ref",
    help="A job id names its document; doc:42 names document 42.",
)
if typed.strip() and typed.strip() != ref:
    st.query_params["doc"] = typed.strip()
    st.query_params.pop("chunk", None)
    ref = typed.strip()
if not ref:
    st.caption("Open a document from a search hit or a job, or type a job id or doc:ID.")
    st.stop()
try:
    doc = document_view.view(reads.ctx(), ref)
except UnknownReference as exc:
    st.error(str(exc))
    st.stop()

info = doc.info
st.subheader(ui.plain(info.filename))
facts = [
    ("Dataset", info.dataset),
    ("Type", doc.media_type),
    ("Size", f"{info.size:,} bytes"),
    ("Pages", doc.page_count),
    (
        "Chunks served",
        f"{doc.served_count:,} ({doc.disabled_count:,} switched off)"
        if doc.disabled_count
        else doc.served_count,
    ),
    ("Uploaded", doc.created_at[:19]),
]
for col, (label, value) in zip(st.columns(len(facts)), facts, strict=True):
    col.markdown(f"**{label}**  \n{ui.plain(value) if value not in (None, '') else '—'}")
st.caption(f"sha256 {info.sha256}")
version = replacing.version_state(reads.ctx(), info.document_id)
if version.external_id is not None:  # "replacement failed; version 1 still serving"
    shown = st.warning if version.state in ("failed", "replacement_failed") else st.info
    shown(ui.plain(f"External id {version.external_id}: {version.message}"))
if info.deleted:
    st.warning(
        "This document was deleted: its jobs and their history stay, nothing of it is searchable."
    )


def _metadata_section() -> None:
    """The document's metadata; operators replace it (search sees the change at once)."""
    st.markdown("**Metadata**")
    if doc.metadata:
        st.json(doc.metadata, expanded=True)
    else:
        st.caption("No metadata.")
    if not who.can_act or info.deleted:
        return
    with st.form("document_metadata_form"):
        typed = st.text_area(
            "Replace the metadata (a JSON object; {} removes it all)",
            value=json.dumps(doc.metadata, ensure_ascii=False),
            key="document_metadata",
            height=68,
        )
        if st.form_submit_button("Save metadata"):
            try:
                actions.set_document_metadata(who, info.document_id, meta.parse_json(typed))
            except (meta.MetadataError, ReadOnlyOperator, meta.UnknownDocument) as exc:
                st.error(f"Not saved: {ui.plain(exc)}.")
            else:
                st.rerun()


_metadata_section()


def _document_switch() -> None:
    """The whole document off (its chunks kept, no search answers them) or on again."""
    if not doc.enabled:
        by = f" by {doc.disabled_by}" if doc.disabled_by else ""
        when = f" at {doc.disabled_at}" if doc.disabled_at else ""
        st.warning(
            ui.plain(f"Disabled{by}{when}: its chunks stay in the index, no search answers them.")
        )
    if not who.can_act or info.deleted:
        return
    label = "Enable this document" if not doc.enabled else "Disable this document"
    if st.button(
        label,
        key="document_switch",
        help="Disabled: every chunk stays in the index, and no search mode answers any of them.",
    ):
        try:
            actions.set_document_enabled(who, info.document_id, not doc.enabled)
        except (ReadOnlyOperator, meta.UnknownDocument) as exc:
            st.error(f"Not switched: {ui.plain(exc)}.")
        else:
            st.rerun()


_document_switch()

if who.can_act:
    try:
        data, name, media_type = document_view.original(reads.ctx(), who, info.document_id)
        st.download_button(
            "Download the original", data, file_name=name, mime=media_type, key="document_download"
        )
    except BlobMissing:  # a replaced version's bytes go once the version after it serves
        st.caption(
            "The original cannot be downloaded: its file is no longer kept"
            + (" (a newer version replaced it)." if version.replaced_by is not None else ".")
        )
    except (FileNotFoundError, ReadOnlyOperator) as exc:
        st.caption(f"The original cannot be downloaded: {exc}")
else:
    st.caption(
        "Signed in read-only: you see the document and its chunks; downloading the original is "
        "for operators."
    )

st.markdown("**Jobs and versions**")
st.dataframe(
    [
        {
            "job": j["id"],
            "status": j["status"],
            "pipeline version": j["pipeline_version"],
            "chunks": j["chunk_count"],
            "serves search": j["id"] == info.active_job_id,
        }
        for j in info.jobs
    ],
    hide_index=True,
    key="document_jobs",
)
for j in info.jobs[-3:]:
    st.page_link(
        ui.JOBS_PAGE, label=f"job {j['id']} ({j['status']})", query_params={"job": str(j["id"])}
    )
versions = replacing.version_rows(reads.ctx(), info.document_id)
if len(versions) > 1:  # the versions of its external id: the one it replaced, the one after it
    st.markdown(f"**Versions of external id {ui.plain(version.external_id or '')}**")
    st.dataframe(versions, hide_index=True, key="document_versions")
    for v in versions:
        if not v["this page"]:
            st.page_link(
                ui.DOCUMENT_PAGE,
                label=f"version {v['version']}: document {v['document']} ({v['state']})",
                query_params={"doc": f"doc:{v['document']}"},
            )

st.markdown("**Chunks, in order**")
if not doc.chunk_count:
    st.info("No job of this document serves search, so it has no chunks to show.")
    st.stop()
per = document_view.CHUNKS_PER_PAGE
wanted = st.query_params.get("chunk")
start_page = int(wanted) // per + 1 if wanted and wanted.isdigit() else 1
pages = max(1, -(-doc.chunk_count // per))
page_no = st.number_input(
    f"Page of chunks (of {pages})",
    min_value=1,
    max_value=pages,
    value=min(start_page, pages),
    key="document_chunk_page",
)
rows = document_view.chunks(reads.ctx(), info.document_id, offset=(page_no - 1) * per, limit=per)
# Where each chunk sits as search says it ("section 2: Findings", "slide 3"), else its page.
places = document_view.positions(reads.ctx(), info.document_id, [c.chunk_id for c in rows])
where = {c.chunk_id: places.get(c.chunk_id, ("", False))[0] or f"page {c.page}" for c in rows}
labels = [f"#{c.position} · {where[c.chunk_id]}" for c in rows]
default = next(
    (i for i, c in enumerate(rows) if wanted and wanted.isdigit() and c.position == int(wanted)), 0
)
picked = st.radio(
    "Chunk to locate on its page",
    range(len(rows)),
    index=default,
    format_func=labels.__getitem__,
    horizontal=True,
    key="document_chunk",
)


def _switch(chunk_id: str) -> None:
    on = bool(st.session_state.get(f"document_chunk_on_{chunk_id}"))
    ds = reads.dataset_id(info.dataset)
    try:
        actions.set_chunk_enabled(who, chunk_id, on, dataset_ids=[ds] if ds is not None else None)
    except Exception as exc:  # read-only, or the chunk went with a new version meanwhile
        st.session_state["document_chunk_error"] = f"Chunk {chunk_id}: {exc}"


def _edit(chunk_id: str) -> None:
    text = str(st.session_state.get(f"document_chunk_text_{chunk_id}") or "")
    ds = reads.dataset_id(info.dataset)
    try:
        state = actions.edit_chunk(
            who, chunk_id, text, dataset_ids=[ds] if ds is not None else None
        )
    except OperationError as exc:  # empty text, read-only, or the chunk went with a new version
        st.session_state["document_chunk_error"] = f"Chunk {chunk_id}: {exc.message} {exc.hint}"
    else:
        done = "edited" if state.edited else "back to the text the pipeline made"
        ui.flash("success", f"Chunk {state.chunk_id}: {done}, embedded and indexed again.")


if error := st.session_state.pop("document_chunk_error", None):
    st.error(ui.plain(error))
ui.show_flashes()
left, right = st.columns([1, 1])
with left:
    for c in rows:
        with st.container(border=True):
            head, switch = st.columns([2, 1])
            if c is rows[picked]:  # the chosen chunk is scrolled into view (below)
                st.html(f'<div id="chunk-{c.position}"></div>')
            head.caption(
                f"chunk {c.position} · {ui.plain(where[c.chunk_id])}"
                + (" · text read by OCR" if places.get(c.chunk_id, ("", False))[1] else "")
                + ("" if c.enabled else " · **disabled**: left out of search")
            )
            switch.toggle(  # a label that fits the narrow column whole; the help says the rest
                "On",
                value=c.enabled,
                key=f"document_chunk_on_{c.chunk_id}",
                disabled=not who.can_act,
                on_change=_switch,
                args=(c.chunk_id,),
                help="On: search answers this chunk. Off: the chunk stays in the index but no "
                "search answers it.",
            )
            st.markdown(ui.chunk_markdown(c.text))  # a table's rows drawn as a table
            with st.popover("Edit text", disabled=not who.can_act):
                with st.form(f"document_chunk_edit_{c.chunk_id}", border=False):
                    st.text_area(
                        "Text",
                        value=c.text,
                        height=220,
                        max_chars=MAX_CHUNK_TEXT,
                        key=f"document_chunk_text_{c.chunk_id}",
                        help="Embedded and indexed again at once; kept across reindexes. The "
                        "pipeline's own text again undoes the edit.",
                    )
                    st.form_submit_button("Save", on_click=_edit, args=(c.chunk_id,))
st.html(  # to the chosen chunk, once the list is drawn (an anchor the page itself wrote)
    "<script>(() => { let n = 0; const go = () => { const el = document.getElementById("
    f"'chunk-{rows[picked].position}'); if (el) el.scrollIntoView({{block: 'center'}}); "
    "else if (n++ < 50) setTimeout(go, 100); }; go(); })();</script>",
    unsafe_allow_javascript=True,
)
with right:
    chosen = rows[picked]
    try:
        image = document_view.page_image(
            reads.ctx(), info.document_id, chosen.page, locate=chosen.text
        )
    except document_view.PageNotDrawn as exc:
        image = None
        st.warning(ui.plain(f"The page cannot be drawn: {exc.message}. {exc.hint}"))
    else:
        if image is None:
            st.caption("No page image: only PDF pages are rendered.")
    if image is not None:
        reduced = (
            f", drawn at {image.zoom / 1.5:.0%} of the usual size (the page is "
            f"{image.width / 72:.0f} x {image.height / 72:.0f} inches)"
            if image.zoom < 1.5
            else ""
        )
        st.image(
            image.png,
            caption=f"page {chosen.page}"
            + (
                ", the chunk highlighted"
                if image.found
                else ", the chunk was recognised by OCR; the page image has no text layer to "
                "compare with"
                if places.get(chosen.chunk_id, ("", False))[1]
                else ", the chunk's words were not found on it as written"
            )
            + reduced,
        )
