"""Search: the best chunks of one dataset; only chunks of each document's succeeded job are answered."""

import streamlit as st

from sluice.console import ui
from sluice.ops import reads
from sluice.ops.search import UnknownDataset

sc = ui.scope()
st.title("Search")

names = [d.name for d in reads.datasets()]
default = sc.dataset if sc.dataset in names else "default"
with st.form("search_form"):
    c1, c2, c3 = st.columns([6, 2, 1])
    query = c1.text_input("Query", key="search_query", placeholder="What are you looking for?")
    dataset = c2.selectbox("Dataset", names, index=names.index(default) if default in names else 0,
                           key="search_dataset")
    k = c3.number_input("k", min_value=1, max_value=50, value=5, key="search_k")
    submitted = st.form_submit_button("Search", type="primary")

if query.strip():
    try:
        with st.spinner("Searching (the first search loads the embedding model)..."):
            hits = reads.search(query, dataset, int(k))
    except UnknownDataset as exc:
        st.error(str(exc))
        hits = None
    except Exception as exc:  # Chroma unreachable, model failed to load
        st.error(f"Search failed: {type(exc).__name__}: {exc}. Check the System page.")
        hits = None
    if hits is not None:
        if not hits:
            st.info(f"No indexed chunks in dataset {dataset!r} match. Only documents whose job succeeded are "
                    "searchable.")
        st.caption(f"{len(hits)} chunk(s) from dataset {dataset!r}, best first.")
        for i, h in enumerate(hits, start=1):
            with st.container(border=True):
                top, score = st.columns([5, 1])
                top.markdown(f"**{i}. {h.filename}** · {h.where or f'page {h.page}'}"
                             + (" · text read by OCR" if h.ocr else ""))
                top.page_link(ui.JOBS_PAGE, label=f"job {h.job_id}", query_params={"job": str(h.job_id)})
                score.metric("score", f"{h.score:.3f}")
                st.text(h.text)
else:
    st.caption("Searches one dataset. Scores are cosine similarity (1 is identical).")
