"""The search controls the Search and Hit testing pages share (metadata filter, minimum score, a
cap per document, hybrid's dense weight): drawn by one function, read as search takes them, so
both pages and the API ask the same search for the same values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import streamlit as st

from sluice.ops import metadata
from sluice.ops.search import DENSE_WEIGHT

FILTER_HELP = (
    "Every condition must hold. " + metadata.CLI_RULE + "; or a JSON object in Chroma's "
    'style, {"year": {"$gte": 2020}} or {"$or": [{"lang": "de"}, {"year": 2024}]}. Numbers '
    "compare as numbers, ISO dates as dates."
)


@dataclass(frozen=True)
class SearchControls:
    """What the controls hold, as the operator set them."""

    where_text: str
    min_score: float
    per_document: int
    dense_weight: float

    def request(self) -> dict[str, Any]:
        """The values as search takes them (metadata.FilterError for a bad filter)."""
        return {
            "where": metadata.parse_filter_text(self.where_text),
            "min_score": float(self.min_score) or None,
            "max_chunks_per_document": int(self.per_document) or None,
            "dense_weight": float(self.dense_weight),
        }


def draw(prefix: str) -> SearchControls:
    """The controls, their widget keys ``{prefix}_where``, ``{prefix}_min_score``,
    ``{prefix}_max_per_document`` and ``{prefix}_dense_weight`` (inside the page's form)."""
    where_text = st.text_input(
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
    return SearchControls(where_text, float(min_score), int(per_document), float(dense_weight))
