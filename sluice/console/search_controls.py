"""The search controls the Search and Hit testing pages share (ranking mode, k, metadata filter,
minimum score, a cap per document, hybrid's dense weight): drawn by one function, read as search
takes them, so both pages and the API ask the same search for the same values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import streamlit as st

from sluice.ops import metadata
from sluice.ops.search import DENSE_WEIGHT, MODES

FILTER_HELP = (
    "Every condition must hold. " + metadata.CLI_RULE + "; or a JSON object in Chroma's "
    'style, {"year": {"$gte": 2020}} or {"$or": [{"lang": "de"}, {"year": 2024}]}. Numbers '
    "compare as numbers, ISO dates as dates."
)
MODE_HELP = "hybrid fuses word matches and meaning; lexical never loads the model"


@dataclass(frozen=True)
class SearchControls:
    """What the controls hold, as the operator set them."""

    mode: str
    k: int
    where_text: str
    min_score: float
    per_document: int
    dense_weight: float

    def request(self) -> dict[str, Any]:
        """The values as search takes them, by the API's names (metadata.FilterError for a bad
        filter)."""
        return {
            "mode": self.mode,
            "k": int(self.k),
            "where": metadata.parse_filter_text(self.where_text),
            "min_score": float(self.min_score) or None,
            "max_chunks_per_document": int(self.per_document) or None,
            "dense_weight": float(self.dense_weight),
        }


def draw(prefix: str, *, k: int = 5, mode_in_url: bool = False) -> SearchControls:
    """The controls (inside the page's form), their widget keys ``{prefix}_mode``, ``{prefix}_k``,
    ``{prefix}_where``, ``{prefix}_min_score``, ``{prefix}_max_per_document`` and
    ``{prefix}_dense_weight``; ``k``: its first value. ``mode_in_url``: the mode is kept in the
    page's URL as ``?mode=`` (its key then ``mode``), so a search can be bookmarked and shared."""
    r1, r2, r3 = st.columns([2, 1, 5])
    mode = r1.selectbox(
        "Ranking",
        MODES,
        key="mode" if mode_in_url else f"{prefix}_mode",
        bind="query-params" if mode_in_url else None,
        help=MODE_HELP,
    )
    k_value = r2.number_input("k", min_value=1, max_value=50, value=k, key=f"{prefix}_k")
    where_text = r3.text_input(
        "Metadata filter",
        key=f"{prefix}_where",
        placeholder="e.g. lang=de; year>=2020; team~a,b; reviewed?",
        help=FILTER_HELP,
    )
    g1, g2, g3 = st.columns(3)
    min_score = g1.number_input(
        "Minimum score",
        min_value=0.0,
        max_value=1.0,
        value=0.0,
        step=0.05,
        key=f"{prefix}_min_score",
        help="Only hits scoring at least this (0 to 1, one scale in every mode): fewer than k may "
        "come. 0 shows every hit.",
    )
    per_document = g2.number_input(
        "Max chunks per document",
        min_value=0,
        max_value=100,
        value=0,
        key=f"{prefix}_max_per_document",
        help="At most this many hits of one document; 0: no cap.",
    )
    dense_weight = g3.slider(
        "Dense weight (hybrid)",
        min_value=0.0,
        max_value=1.0,
        value=DENSE_WEIGHT,
        step=0.05,
        key=f"{prefix}_dense_weight",
        help="The meaning ranker's share of the fusion: 0 ranks by words alone, 1 by meaning.",
    )
    return SearchControls(
        str(mode),
        int(k_value),
        where_text,
        float(min_score),
        int(per_document),
        float(dense_weight),
    )
