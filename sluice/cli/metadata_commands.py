"""``sluice documents ID [--meta KEY=VALUE]...`` (a document's metadata, shown or replaced),
``sluice documents ID --disable|--enable`` (the whole document switched off and on),
``sluice documents --dataset NAME --where EXPR...`` (documents a filter allows), and
``sluice chunks disable|enable|edit CHUNK_ID`` (a chunk switched off and on, its text edited).
Bad metadata or a bad filter is a message naming the key, and exit code 2."""

from __future__ import annotations

import sys
from pathlib import Path

from sqlmodel import Session

from sluice.cli.output import print_json, table
from sluice.ops import actions, reads
from sluice.ops import metadata as meta
from sluice.ops.access import ReadOnlyOperator, cli_operator
from sluice.ops.chunks import AmbiguousChunk, BadChunkText, UnknownChunk
from sluice.ops.search import UnknownDataset, get_dataset

USAGE_ERROR = 2


def _fail(message: str, code: int = 1) -> int:
    print(f"sluice: {message}", file=sys.stderr)
    return code


def parse_meta(pairs: list[str] | None) -> dict | None:
    """``--meta`` options as metadata (None when there are none); MetadataError when bad."""
    return meta.parse_pairs(pairs) if pairs else None


def parse_where(items: list[str] | None) -> dict | None:
    """``--where`` options as a filter (None when there are none); FilterError when bad."""
    return meta.parse_cli_where(items) if items else None


def documents(args) -> int:
    """A document's metadata (``--meta`` replaces it), or a dataset's documents (``--where``), or
    the document an external id names (sluice.cli.document_commands)."""
    if args.disable or args.enable:
        return _switch(args)
    if args.document_id is None and not args.where and not args.meta:
        if args.external_id is None:
            return _fail("name a document ID, --where filters or --external-id", USAGE_ERROR)
        from sluice.cli import document_commands

        return document_commands.documents(args)
    try:
        value = parse_meta(args.meta)
        where = parse_where(args.where)
    except (meta.MetadataError, meta.FilterError) as err:
        hint = f" ({meta.CLI_RULE})" if isinstance(err, meta.FilterError) else ""
        return _fail(f"{err}{hint}", USAGE_ERROR)
    if args.document_id is None:
        if value is not None:
            return _fail("--meta changes one document: name its ID", USAGE_ERROR)
        return _list(args, where)
    if value is not None or args.clear:
        try:
            actions.set_document_metadata(cli_operator(), args.document_id, value or {})
        except meta.UnknownDocument as err:
            return _fail(str(err))
        except ReadOnlyOperator as err:
            return _fail(str(err))
    stored = _stored(args.document_id)
    if stored is None:
        return _fail(f"no document {args.document_id}")
    if args.json:
        print_json({"document_id": args.document_id, "metadata": stored})
    else:
        table(
            [{"key": k, "value": v} for k, v in stored.items()],
            [("key", "KEY"), ("value", "VALUE")],
            empty=f"document {args.document_id} has no metadata",
        )
    return 0


def _switch(args) -> int:
    """``sluice documents ID --disable|--enable``: the whole document off (kept, left out of every
    search) or on again."""
    if args.document_id is None:
        return _fail("--disable and --enable switch one document: name its ID", USAGE_ERROR)
    if args.meta or args.clear or args.where or args.delete:
        return _fail("--disable and --enable go alone", USAGE_ERROR)
    try:
        state = actions.set_document_enabled(cli_operator(), args.document_id, bool(args.enable))
    except (meta.UnknownDocument, ReadOnlyOperator) as err:
        return _fail(str(err))
    if args.json:
        print_json(state.to_dict())
    else:
        word = "enabled" if state.enabled else "disabled (kept in the index, left out of search)"
        print(f"document {state.document_id}: {word}")
    return 0


def _stored(document_id: int) -> dict | None:
    from sluice.storage.models import Document

    with Session(reads.ctx().engine) as session:
        doc = session.get(Document, document_id)
        return None if doc is None or doc.deleted_at is not None else dict(doc.metadata_ or {})


def _list(args, where: dict | None) -> int:
    ctx = reads.ctx()
    try:
        ds = get_dataset(ctx, args.dataset)
    except UnknownDataset as err:
        return _fail(str(err))
    with Session(ctx.engine) as session:
        docs = meta.filtered_documents(
            session, ds.id, meta.parse_where(where), offset=0, limit=args.limit
        )
    rows = [
        {
            "document_id": d.id,
            "filename": d.filename,
            "active_job_id": d.active_job_id,
            "metadata": dict(d.metadata_ or {}),
        }
        for d in docs
    ]
    if args.json:
        print_json(rows)
        return 0
    table(
        rows,
        [("document_id", "ID"), ("filename", "FILE"), ("metadata", "METADATA")],
        empty=f"no documents in {args.dataset!r} match",
    )
    return 0


def _edit_text(args) -> str | None:
    """The new text of ``sluice chunks edit``: --text, or --file (``-``: standard input)."""
    if args.text is not None:
        return str(args.text)
    if args.file == "-":
        return sys.stdin.read()
    if args.file:
        return Path(args.file).read_text(encoding="utf-8")
    return None


def chunks(args) -> int:
    """``sluice chunks disable|enable CHUNK_ID [--dataset NAME]``, ``sluice chunks edit CHUNK_ID
    --text TEXT | --file PATH``."""
    ctx = reads.ctx()
    reach = None
    if args.dataset:
        try:
            reach = [get_dataset(ctx, args.dataset).id]
        except UnknownDataset as err:
            return _fail(str(err))
    editing = args.action == "edit"
    if editing != (args.text is not None or args.file is not None):
        return _fail("--text or --file go with edit, and edit needs one of them", USAGE_ERROR)
    try:
        if editing:
            new_text = _edit_text(args)
            assert new_text is not None
            state = actions.edit_chunk(cli_operator(), args.chunk_id, new_text, dataset_ids=reach)
        else:
            state = actions.set_chunk_enabled(
                cli_operator(), args.chunk_id, args.action == "enable", dataset_ids=reach
            )
    except (OSError, UnicodeDecodeError) as err:
        return _fail(f"cannot read the new text: {err}", USAGE_ERROR)
    except BadChunkText as err:
        return _fail(f"{err} ({err.hint})", USAGE_ERROR)
    except (UnknownChunk, AmbiguousChunk, ReadOnlyOperator) as err:
        return _fail(str(err), USAGE_ERROR if isinstance(err, AmbiguousChunk) else 1)
    if args.json:
        print_json(state.to_dict())
    elif editing:
        word = "edited" if state.edited else "back to the text the pipeline made"
        print(f"chunk {state.chunk_id} of document {state.document_id}: {word}, indexed again")
    else:
        word = "enabled" if state.enabled else "disabled (kept in the index, left out of search)"
        print(f"chunk {state.chunk_id} of document {state.document_id}: {word}")
    return 0
