"""Hit testing: one query against one dataset, with each ranker's view of every hit (dense rank and
similarity, lexical rank and score, the fused rank and score), and the operator's last queries,
kept in the job database, to run again with one click."""

from __future__ import annotations

import streamlit as st

from sluice.console import search_controls, ui
from sluice.ops import hit_testing, metadata, reads
from sluice.ops.search import BadQuery, UnknownDataset

who = ui.operator()
sc = ui.scope()
st.title("Hit testing")
st.caption(
    "What a query retrieves from one dataset, and why: each hit's place and score in the dense "
    "ranker (cosine similarity; distance is 1 - similarity), in the lexical one, and after fusion "
    "(hybrid). The ranking, its scores (0 to 1 in every mode) and its controls are the Search "
    "page's own."
)

REQUEST = "hit_test_request"
names = [d.name for d in reads.datasets()]
if not names:
    st.info("No dataset yet: upload documents first.")
    st.stop()
if st.session_state.get("hit_dataset") not in names:
    st.session_state["hit_dataset"] = sc.dataset if sc.dataset in names else names[0]


def _again(dataset: str, query: str, mode: str, k: int) -> None:
    """A history row's Run again: the form shows that query, its mode and k, and it runs now."""
    st.session_state.update(hit_dataset=dataset, hit_query=query, hit_mode=mode, hit_k=k)
    st.session_state[REQUEST] = True


with st.form("hit_test_form"):
    c1, c2 = st.columns([1, 3])
    dataset = c1.selectbox("Dataset", names, key="hit_dataset")
    query = c2.text_area("Query", key="hit_query", placeholder="A question your users would ask")
    controls = search_controls.draw("hit", k=10)
    if st.form_submit_button("Test", type="primary"):
        st.session_state[REQUEST] = True


# a test runs once per Test or Run again, with what the form holds (not on any other rerun)
asked = st.session_state.pop(REQUEST, False)
if asked and not query.strip():
    st.info("Type a query to test.")
elif asked:
    try:
        with st.spinner("Searching (the first search loads the embedding model)..."):
            test = hit_testing.run(who, dataset=dataset, query=query, **controls.request())
    except (UnknownDataset, BadQuery, metadata.FilterError) as exc:
        st.error(ui.plain(exc))
    except Exception as exc:  # Chroma unreachable, model failed to load
        st.error(f"Search failed: {ui.plain(f'{type(exc).__name__}: {exc}')}. See the System page.")
    else:
        st.subheader(f"{ui.count(len(test.hits), 'hit')} in {test.dataset} ({test.mode})")
        if test.hits:
            st.dataframe(ui.hit_table(test.rows()), hide_index=True, key="hit_test_hits")
            st.caption("— : that ranker did not find the hit (lexical mode has no dense rank).")
        else:
            st.info("No chunk answers this query. Only documents whose job succeeded are searched.")

st.subheader("Your last queries")
past = hit_testing.history(who)
if not past:
    st.caption("None yet: each test is kept here (the last 20).")
for row in past:
    line, button = st.columns([6, 1])
    line.markdown(
        f"`{row.mode}` in **{ui.plain(row.dataset)}**, k {row.k}: {ui.plain(row.query[:200])} "
        f"· {ui.count(row.hits, 'hit')} · {ui.ago(row.at)}"
    )
    button.button(
        "Run again",
        key=f"hit_again_{row.id}",
        on_click=_again,
        args=(row.dataset, row.query, row.mode, row.k),
    )
