"""A chunk switched off stays in both stores, shows as disabled in the document view, is left out of
every search mode (the rankers still find k enabled ones), is counted by reconcile and never called
missing; switched on, it answers again."""

from __future__ import annotations

import pytest
from sqlalchemy import bindparam
from sqlalchemy import text as sql
from sqlmodel import Session

from sluice.ops import chunks as chunk_ops
from sluice.ops.document_view import chunks as view_chunks
from sluice.ops.search import search
from sluice.pipeline.reconcile.audit import reconcile
from sluice.storage.models import Document
from tests.support.helpers import collection, ids_of_job
from tests.test_metadata import MODES, upload


def _everything(ctx, query: str, k: int = 200):
    return {
        mode: [h.chunk_id for h in search(ctx, query=query, dataset="default", k=k, mode=mode)]
        for mode in MODES
    }


def test_a_disabled_chunk_is_never_returned_and_comes_back(database_url, make_ctx):
    ctx = make_ctx()
    done = upload(ctx, "glacier", None, 6)
    other = upload(ctx, "pier", None, 6)
    ids = sorted(ids_of_job(ctx, done.id))
    off = ids[:3]
    found = _everything(ctx, "harbour section")
    assert all(set(off) <= set(found[m]) for m in MODES)  # each mode answers them before
    for cid in off:
        state = chunk_ops.set_chunk_enabled(ctx, cid, False, actor="test")
        assert (state.enabled, state.document_id) == (False, done.document_id)
    chunk_ops.set_chunk_enabled(ctx, off[0], False, actor="test")  # twice is once
    # kept in both stores
    assert len(ctx.vectors.get(collection(ctx), off)["ids"]) == 3
    with ctx.engine.connect() as conn:
        rows = conn.execute(
            sql("SELECT COUNT(*) FROM lexical_chunk WHERE chunk_id IN :ids").bindparams(
                bindparam("ids", expanding=True)
            ),
            {"ids": off},
        ).scalar_one()
    assert rows == 3
    # shown as disabled in the document view
    view = {c.chunk_id: c.enabled for c in view_chunks(ctx, done.document_id, limit=100)}
    assert [cid for cid, on in view.items() if not on] == off
    # left out of every mode, which still answers k enabled chunks
    found = _everything(ctx, "harbour section")
    for mode in MODES:
        assert not set(off) & set(found[mode]), mode
    enabled = done.chunk_count - 3 + other.chunk_count
    for mode in MODES:
        hits = search(ctx, query="harbour section", dataset="default", k=enabled, mode=mode)
        assert len(hits) == enabled and not {h.chunk_id for h in hits} & set(off), mode
    # reconcile counts them and calls nothing missing
    report = reconcile(ctx, save=False)
    assert report.clean, report.describe()
    assert report.datasets[0].disabled == 3 and report.datasets[0].missing == 0
    assert "3 switched off" in report.describe()
    # switched on again: every mode answers them
    for cid in off:
        assert chunk_ops.set_chunk_enabled(ctx, cid, True, actor="test").enabled
    found = _everything(ctx, "harbour section")
    assert all(set(off) <= set(found[m]) for m in MODES)
    assert reconcile(ctx, save=False).datasets[0].disabled == 0
    with pytest.raises(chunk_ops.UnknownChunk):
        chunk_ops.set_chunk_enabled(ctx, "nobody-made-000001", False)
    with Session(ctx.engine) as session:
        assert session.get(Document, done.document_id).metadata_ is None
