"""Search: the best chunks of one dataset; only chunks of each document's succeeded job are
answered. Hybrid (words and meaning), dense or lexical; "an exact phrase" in quotes; filters by
file, pages, type and the documents' metadata."""

import streamlit as st

from sluice.console import search_controls, ui
from sluice.errors import VectorStoreUnavailable
from sluice.ops import metadata, reads
from sluice.ops.search import BadQuery, UnknownDataset

sc = ui.scope()
st.title("Search")

names = [ui.ALL_DATASETS, *[d.name for d in reads.datasets()]]
default = sc.dataset if sc.dataset in names else ui.ALL_DATASETS
with st.form("search_form"):
    c1, c2 = st.columns([7, 2])
    # the query, its dataset and ranking live in the URL: a search can be bookmarked and shared
    query = c1.text_input(
        "Query", key="q", placeholder="What are you looking for?", bind="query-params"
    )
    chosen = c2.selectbox(
        "Dataset", names, index=names.index(default), key="in", bind="query-params"
    )
    dataset = None if chosen == ui.ALL_DATASETS else chosen
    f1, f2, f3 = st.columns([3, 2, 2])
    file_filter = f1.text_input("File name contains", key="search_file")
    pages = f2.text_input("Pages", key="search_pages", placeholder="e.g. 3-7")
    type_names = {"any": "any", **reads.supported_formats()[1]}
    media_type = f3.selectbox(
        "Type", list(type_names), key="search_media_type", format_func=lambda t: type_names[t]
    )
    controls = search_controls.draw("search", mode_in_url=True)
    submitted = st.form_submit_button("Search", type="primary")

if submitted and not query.strip():
    st.info(
        'Type something to search for: words, a code or a name, or "an exact phrase" in quotes.'
    )
if query.strip():
    hits: list | None
    try:
        request = controls.request()
        with st.spinner("Searching (the first search loads the embedding model)..."):
            hits = reads.search(
                query,
                dataset,
                filename=file_filter or None,
                pages=pages or None,
                media_type=None if media_type == "any" else media_type,
                **request,
            )
    except (UnknownDataset, BadQuery, metadata.FilterError) as exc:
        st.error(ui.plain(exc))
        hits = None
    except VectorStoreUnavailable as exc:  # the words the API and the CLI give it
        st.error(f"{ui.plain(exc.message[0].upper() + exc.message[1:])}. {ui.plain(exc.hint)}")
        hits = None
    except Exception as exc:  # Chroma unreachable, model failed to load
        st.error(
            f"Search failed: {ui.plain(f'{type(exc).__name__}: {exc}')}. Check the System page."
        )
        hits = None
    if hits is not None:
        where = f"dataset {ui.plain(repr(dataset))}" if dataset else "all datasets"
        if not hits:
            st.info(
                f"No indexed chunks in {where} match. Only documents whose job succeeded are "
                "searchable."
            )
        st.caption(
            f"{len(hits)} chunk(s) from {where}, best first."
            + (f" Only hits scoring at least {controls.min_score:g}." if controls.min_score else "")
        )
        for i, h in enumerate(hits, start=1):
            with st.container(border=True):
                top, score = st.columns([5, 1])
                top.markdown(
                    f"**{i}. {ui.plain(h.filename)}** · "
                    f"{ui.plain(h.where) if h.where else f'page {h.page}'}"
                    + (" · text read by OCR" if h.ocr else "")
                    + f" · found by {' and '.join(h.matched)}"
                )
                links = top.container(horizontal=True)
                links.page_link(
                    ui.DOCUMENT_PAGE,
                    label="Open document",
                    query_params={
                        "doc": f"doc:{h.document_id}",
                        "chunk": h.chunk_id.rsplit("-", 1)[-1],
                    },
                )
                links.page_link(
                    ui.JOBS_PAGE, label=f"job {h.job_id}", query_params={"job": str(h.job_id)}
                )
                score.metric("score", f"{h.score:.3f}")
                if h.heading:
                    st.text(h.heading)  # its heading path: text as written, never Markdown
                st.markdown(ui.highlighted(h.snippet))
                with st.expander("Whole chunk"):
                    st.text(h.text)
                if h.context:  # the dataset's context_size: the section around the match
                    with st.expander("Its section (the context an application gets)"):
                        st.markdown(ui.chunk_markdown(h.context))
else:
    st.caption(
        'Put "an exact phrase" in quotes. Scores run from 0 to 1 in every mode: dense, the cosine '
        "similarity; lexical, the word score as score / (score + a constant); hybrid, the fused "
        "rank score as a share of the best possible."
    )
