"""The Sluice operator console: the entry point Streamlit runs (``sluice serve console``).

It checks the settings, signs the operator in, draws the dataset picker, and routes to the pages.
Pages (views/*.py) are thin: they read through sluice.ops.reads and act through sluice.ops.actions.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
if (
    str(ROOT) not in sys.path
):  # `streamlit run sluice/console/app.py` from a checkout puts only console/ on the path
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402

from sluice.console import login, ui  # noqa: E402
from sluice.errors import SettingsError  # noqa: E402
from sluice.files import use_private_umask  # noqa: E402
from sluice.ops import actions, reads  # noqa: E402
from sluice.ops.access import Operator  # noqa: E402

st.set_page_config(page_title="Sluice", page_icon=ui.page_icon(), layout="wide")
# Streamlit's table toolbar exports CSV with formulas left live; exports go through ops.exports.
st.set_option("client.disableDataExport", True)
use_private_umask()  # whatever launched the console: what it writes into the data dir is private

try:
    settings = reads.ctx().settings
except SettingsError as exc:
    st.error(f"The configuration is invalid, so the console cannot start:\n\n{exc}")
    st.stop()


def _pages(operator: bool = True) -> list:
    """Every page; the API keys page is out of a read-only operator's navigation (and shows them
    nothing if reached by its address)."""
    # Page scripts live in views/, not pages/: a folder named pages/ next to this file makes
    # Streamlit fall back to its old file-based navigation when the first request after a start is a
    # deep link (/jobs?job=7).
    return [
        st.Page(
            "views/overview_page.py",
            url_path="overview",
            title="Overview",
            icon=":material/dashboard:",
            default=True,
        ),
        st.Page(
            "views/upload_page.py", url_path="upload", title="Upload", icon=":material/upload_file:"
        ),
        st.Page("views/jobs_page.py", url_path="jobs", title="Jobs", icon=":material/list_alt:"),
        st.Page(
            "views/dead_letters_page.py",
            url_path="dead_letters",
            title="Dead letters",
            icon=":material/report:",
        ),
        st.Page(
            "views/search_page.py", url_path="search", title="Search", icon=":material/search:"
        ),
        st.Page(
            "views/hit_testing_page.py",
            url_path="hit_testing",
            title="Hit testing",
            icon=":material/target:",
        ),
        st.Page(
            "views/document_page.py",
            url_path="document",
            title="Document",
            icon=":material/description:",
        ),
        st.Page(
            "views/system_page.py",
            url_path="system",
            title="System",
            icon=":material/monitor_heart:",
        ),
        st.Page(
            "views/integrity_page.py",
            url_path="integrity",
            title="Integrity",
            icon=":material/fact_check:",
        ),
        st.Page(
            "views/datasets_page.py",
            url_path="datasets",
            title="Datasets",
            icon=":material/folder_data:",
        ),
        st.Page(
            "views/sources_page.py", url_path="sources", title="Sources", icon=":material/sync:"
        ),
        st.Page("views/audit_page.py", url_path="audit", title="Audit", icon=":material/history:"),
        st.Page(
            "views/keys_page.py",
            url_path="keys",
            title="API keys",
            icon=":material/key:",
            visibility="visible" if operator else "hidden",
        ),
    ]


NEW_DATASET = "new_dataset_popover"  # its open state: tracked, so a Create can close it


def _create_dataset(who: Operator) -> None:
    ok, message = actions.create_dataset(who, st.session_state.get("new_dataset_name", ""))
    ui.flash("success" if ok else "error", message)
    if ok:
        st.session_state[ui.DATASET_KEY] = st.session_state["new_dataset_name"].strip()
        st.session_state["new_dataset_name"] = ""
        st.session_state[NEW_DATASET] = False  # the popover closes on the rerun that follows


connection = login.admit(settings)  # a Host or Origin the console is not served at stops here
who = login.signed_in(settings, connection)
if who is None:
    # Register the pages (hidden) before the sign-in form, so a deep link like /jobs?job=7 still
    # opens that page once the operator has signed in.
    st.navigation(_pages(), position="hidden")
    login.sign_in_page(settings, connection)

with st.sidebar:
    names = [d.name for d in reads.datasets()]
    asked = st.query_params.get(ui.DATASET_KEY)
    if asked and asked not in (
        ui.ALL_DATASETS,
        *names,
    ):  # a stale or mistyped link: say so, do not guess
        ui.flash("warning", f"There is no dataset named {asked!r}; showing all datasets.")
    st.selectbox(
        "Dataset",
        [ui.ALL_DATASETS, *names],
        key=ui.DATASET_KEY,
        bind="query-params",
        help="Every page shows only this dataset; uploads go into it.",
    )
    with st.popover("New dataset", disabled=not who.can_act, key=NEW_DATASET, on_change="rerun"):
        st.text_input("Name", key="new_dataset_name", placeholder="e.g. contracts-2024")
        st.button("Create", key="create_dataset", on_click=_create_dataset, args=(who,))

navigation = st.navigation(_pages(who.can_act))
login.sidebar_identity(who, settings)
ui.show_flashes()
navigation.run()
