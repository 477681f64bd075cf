"""``sluice search``: the best chunks of every dataset (or the one named), as the console searches.

A cold ``sluice search`` is the command most often typed and waited for, so this module imports
only what searching uses: the search itself, the job database and the query encoder (the model's
ONNX export when the worker has made it, sluice.pipeline.running.query_encoder). The operations the
other commands run (queues, parsing, the console's reads) are never imported on this path.
"""

from __future__ import annotations

import sys

from sqlmodel import Session, col, select

from sluice.cli.output import print_json, table
from sluice.ops.metadata import CLI_RULE, FilterError, parse_cli_where
from sluice.ops.search import BadQuery, SearchHit, UnknownDataset, query_vector
from sluice.ops.search import search as run_search
from sluice.pipeline.running.context import Context, get_context
from sluice.storage.lexical import parse_query
from sluice.storage.models import Dataset


def dataset_names(ctx: Context) -> list[str]:
    """Every dataset's name, as the console lists them (not those being deleted)."""
    with Session(ctx.engine) as session:
        return list(
            session.exec(
                select(col(Dataset.name))
                .where(col(Dataset.deleting_at).is_(None))
                .order_by(col(Dataset.name))
            ).all()
        )


def search_datasets(ctx: Context, names: list[str], args) -> list[SearchHit]:
    """The best ``args.k`` chunks over ``names``, merged by score; the query is encoded once."""
    where = parse_cli_where(args.where) if getattr(args, "where", None) else None
    several = len(names) > 1 and args.mode in ("hybrid", "dense")
    vector = (
        query_vector(ctx, args.query) if several and not parse_query(args.query).empty else None
    )
    hits = [
        h
        for name in names
        for h in run_search(
            ctx,
            query=args.query,
            dataset=name,
            k=args.k,
            mode=args.mode,
            filename=args.file,
            pages=args.pages,
            media_type=args.media_type,
            where=where,
            vector=vector,
        )
    ]
    return sorted(hits, key=lambda h: -h.score)[: args.k]


def search(args) -> int:
    ctx = get_context()
    names = [args.dataset] if args.dataset else dataset_names(ctx)
    try:
        hits = search_datasets(ctx, names, args)
    except (UnknownDataset, BadQuery) as exc:
        print(f"sluice: {exc}", file=sys.stderr)
        return 1
    except FilterError as exc:
        print(f"sluice: {exc} ({CLI_RULE})", file=sys.stderr)
        return 2
    if args.json:
        print_json([h.to_dict() for h in hits])
        return 0
    print(f"searched {len(names)} dataset(s): {', '.join(names)}")
    rows = [
        {
            "score": f"{h.score:.3f}",
            "filename": h.filename,
            "page": h.page,
            "matched": "+".join(h.matched),
            "text": h.snippet[:160],
        }
        for h in hits
    ]
    table(
        rows,
        [
            ("score", "SCORE"),
            ("filename", "FILE"),
            ("page", "PAGE"),
            ("matched", "BY"),
            ("text", "TEXT"),
        ],
        empty="no matches" + (f" in dataset {args.dataset!r}" if args.dataset else ""),
    )
    return 0
