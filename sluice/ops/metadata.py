"""Document metadata: the one validator every front end uses, and the ``where`` filters over it.

Metadata is a JSON object of the application's own fields: keys ``^[a-z][a-z0-9_]{0,63}$``
(keys starting with ``_`` are reserved and refused), values strings, numbers, booleans or lists of
strings, at most ``MAX_BYTES`` as compact JSON. It is stored on the document row; the chunks carry
a copy (``vectors.metadata_fields``) that reconcile audits, but search decides on the document row
alone, read in the same statement (lexical) or the same read (dense) that checks the active job.

A filter (``where``) follows Chroma's style: ``{"lang": "de", "year": {"$gte": 2020}}`` with
``$eq $ne $in $nin $gt $gte $lt $lte $exists``, keys combined with and (implicitly, or by
``$and``), alternatives by ``$or`` (``{"$or": [{"lang": "de"}, {"year": {"$gte": 2020}}]}``), the
two nested at most ``MAX_DEPTH`` levels deep. On a list value ``$eq`` means "holds", ``$in``
"holds one of"; ``$ne`` and ``$nin`` are their negations and match a document without the key.
``$gt``-``$lte`` compare numbers as numbers and ISO dates (``2024-05-01``,
``2024-05-01T12:00:00Z``) as dates; a value of another kind does not match.

Everything a client can send is judged here, before anything is stored or compared: an integer is
at most 64 bits (what the job database and the vector store can hold), a float is finite, a string
is Unicode that can be stored (no lone surrogate), a filter nests ``$and`` and ``$or`` at most
``MAX_DEPTH`` levels deep. A refusal names the key (shortened, and with a lone surrogate shown as
U+FFFD).
"""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass
from datetime import date, datetime
from typing import TYPE_CHECKING, Any

from sluice import faults
from sluice.errors import OperationError

if TYPE_CHECKING:  # the ORM, imported where used: a cold `sluice search` parses filters without it
    from sqlmodel import Session

    from sluice.pipeline.running.context import Context
    from sluice.storage.models import Document

log = logging.getLogger(__name__)

KEY = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
MAX_BYTES = 8192
MAX_DEPTH = 8  # levels of $and and $or a filter may nest
INT_MIN, INT_MAX = -(2**63), 2**63 - 1  # what the job database and the vector store hold
SHOWN_KEY = 100  # characters of a refused key echoed in the answer
OPERATORS = ("$eq", "$ne", "$in", "$nin", "$gt", "$gte", "$lt", "$lte", "$exists")
COMPARE = ("$gt", "$gte", "$lt", "$lte")
CLI_RULE = (
    "write KEY=VALUE, KEY!=VALUE, KEY>=VALUE (also >, <, <=), KEY~A,B (one of), KEY!~A,B "
    "(none of), KEY? (has the key), KEY!? (lacks it), or a JSON object such as "
    '{"$or": [{"lang": "de"}, {"year": {"$gte": 2020}}]}'
)


class MetadataError(OperationError):
    """Metadata refused; ``key`` names the field at fault ("" for the object as a whole), also as
    the ``key`` member of the API's answer (``members``)."""

    code, status = "invalid_metadata", 422
    hint = "Fix the metadata: see the API reference, Metadata and filters."

    def __init__(self, key: str, message: str) -> None:
        key = shown(key)
        super().__init__(f"metadata {key!r}: {message}" if key else f"metadata: {message}")
        self.key = key
        self.members = {"key": key}


class FilterError(OperationError):
    """A ``where`` filter refused; ``key`` names the field or operator at fault, also as the
    ``key`` member of the API's answer (``members``)."""

    code, status = "invalid_filter", 422
    hint = "Fix the filter: see the API reference, Metadata and filters."

    def __init__(self, key: str, message: str) -> None:
        key = shown(key)
        super().__init__(f"filter {key!r}: {message}" if key else f"filter: {message}")
        self.key = key
        self.members = {"key": key}


def shown(key: Any) -> str:
    """A key as a refusal names it: text that can be stored and sent (a lone surrogate is U+FFFD),
    at most ``SHOWN_KEY`` characters (then "…")."""
    text = str(key)
    if not storable(text):
        text = "".join("\ufffd" if 0xD800 <= ord(ch) <= 0xDFFF else ch for ch in text)
    return text if len(text) <= SHOWN_KEY else text[:SHOWN_KEY] + "…"


def storable(text: str) -> bool:
    """Whether a string is Unicode a database can store: no lone surrogate (JSON's "\\ud800")."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _number_fault(v: int | float) -> str | None:
    """Why a number cannot be stored or compared (None: it can)."""
    if isinstance(v, float):
        return None if math.isfinite(v) else "a number must be finite"
    if not INT_MIN <= v <= INT_MAX:
        return "an integer is at most 64 bits (-2**63 to 2**63-1)"
    return None


UNSTORABLE = "a string may not hold a lone surrogate (\\ud800-\\udfff): send valid Unicode"


def validate(metadata: Any) -> dict[str, Any]:
    """The metadata as stored (a new dict), or MetadataError naming the first bad key."""
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise MetadataError("", "must be a JSON object of key: value")
    out: dict[str, Any] = {}
    for key, value in metadata.items():
        if not isinstance(key, str) or not key:
            raise MetadataError(str(key), "a key is a non-empty string")
        if key.startswith("_"):
            raise MetadataError(key, "keys starting with '_' are reserved")
        if not KEY.match(key):
            raise MetadataError(
                key, "a key is a lower-case letter, then up to 63 lower-case letters, digits or _"
            )
        if isinstance(value, list):
            if not all(isinstance(v, str) for v in value):
                raise MetadataError(key, "a list holds strings only")
            if not all(storable(v) for v in value):
                raise MetadataError(key, UNSTORABLE)
            out[key] = list(value)
        elif isinstance(value, str | bool) or _is_number(value):
            fault = _number_fault(value) if _is_number(value) else None
            if isinstance(value, str) and not storable(value):
                fault = UNSTORABLE
            if fault:
                raise MetadataError(key, fault)
            out[key] = value
        else:
            raise MetadataError(
                key, "a value is a string, a number, a boolean or a list of strings"
            )
    size = len(json.dumps(out, separators=(",", ":"), ensure_ascii=False).encode())
    if size > MAX_BYTES:
        raise MetadataError("", f"{size} bytes as JSON; at most {MAX_BYTES}")
    return out


def parse_json(value: str | None) -> dict[str, Any]:
    """Metadata sent as JSON text (a multipart form field), validated."""
    if value is None or not value.strip():
        return {}
    return validate(loads(value, MetadataError))


def loads(text: str, error: type[MetadataError] | type[FilterError]) -> Any:
    """JSON text sent by a client, or ``error`` (naming no key): not JSON, or nested deeper than
    Python's json reader goes (a RecursionError)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error("", f"not JSON ({exc.msg})") from None
    except RecursionError:
        raise error("", "JSON nested too deeply") from None


def _cli_value(raw: str) -> Any:
    """A value typed on the command line: JSON where it parses (numbers, booleans, lists), else the
    text itself."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def parse_pairs(pairs: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``--meta key=value`` options as metadata, validated (a key given twice: the last wins)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise MetadataError(key.strip(), "write KEY=VALUE")
        out[key.strip()] = _cli_value(raw)
    return validate(out)


# --- filters --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Condition:
    key: str
    op: str
    operand: Any


@dataclass(frozen=True)
class AnyOf:
    """``$or``: at least one of these filters holds."""

    parts: tuple[tuple[Condition | AnyOf, ...], ...]


Where = tuple[Condition | AnyOf, ...]  # every condition must hold


def _as_date(v: Any) -> datetime | None:
    if not isinstance(v, str) or len(v) < 10 or not v[:4].isdigit():
        return None
    try:
        got = datetime.fromisoformat(v.replace("Z", "+00:00"))
    except ValueError:
        try:
            got = datetime.combine(date.fromisoformat(v), datetime.min.time())
        except ValueError:
            return None
    return got.replace(tzinfo=None) if got.tzinfo is None else got


def _scalar(key: str, op: str, v: Any) -> Any:
    if isinstance(v, str) and not storable(v):
        raise FilterError(key, UNSTORABLE)
    if _is_number(v) and (fault := _number_fault(v)):
        raise FilterError(key, fault)
    if isinstance(v, str | bool) or _is_number(v):
        return v
    raise FilterError(key, f"{op} takes a string, a number or a boolean")


def _condition(key: str, op: str, operand: Any) -> Condition:
    if op not in OPERATORS:
        raise FilterError(op, f"unknown operator; one of {', '.join(OPERATORS)}")
    if op in ("$in", "$nin"):
        if not isinstance(operand, list) or not operand:
            raise FilterError(key, f"{op} takes a non-empty list")
        return Condition(key, op, tuple(_scalar(key, op, v) for v in operand))
    if op == "$exists":
        if not isinstance(operand, bool):
            raise FilterError(key, "$exists takes true or false")
        return Condition(key, op, operand)
    if op in COMPARE:
        if _is_number(operand):
            return Condition(key, op, _scalar(key, op, operand))
        when = _as_date(operand)
        if when is None:
            raise FilterError(key, f"{op} takes a number or an ISO date")
        return Condition(key, op, when)
    return Condition(key, op, _scalar(key, op, operand))


def parse_where(where: Any, *, depth: int = 0) -> Where:
    """A ``where`` object as conditions, or FilterError naming the key or operator at fault
    (``$and`` and ``$or`` nested deeper than ``MAX_DEPTH`` included: refused before it is walked
    further)."""
    if where is None:
        return ()
    if not isinstance(where, dict):
        raise FilterError("", "must be a JSON object")
    out: list[Condition | AnyOf] = []
    for key, value in where.items():
        if key in ("$and", "$or"):
            if depth >= MAX_DEPTH:
                raise FilterError(
                    key, f"nested too deeply: at most {MAX_DEPTH} levels of $and and $or"
                )
            if not isinstance(value, list) or (key == "$or" and not value):
                raise FilterError(
                    key, "takes a list of filters" + (" (at least one)" * (key == "$or"))
                )
            parts = [parse_where(part, depth=depth + 1) for part in value]
            if key == "$and":
                out.extend(c for part in parts for c in part)
            else:
                out.append(AnyOf(tuple(parts)))
            continue
        if not isinstance(key, str) or not KEY.match(key):
            raise FilterError(str(key), "not a metadata key (nor $and, $or)")
        if isinstance(value, dict):
            if not value:
                raise FilterError(key, "an empty operator object")
            out.extend(_condition(key, op, operand) for op, operand in value.items())
        else:
            out.append(_condition(key, "$eq", value))
    return tuple(out)


_CLI = re.compile(r"^\s*([a-z][a-z0-9_]{0,63})\s*(>=|<=|!=|!~|!\?|[=<>~?])(.*)$", re.S)
_CLI_OPS = {"=": "$eq", "!=": "$ne", ">": "$gt", ">=": "$gte", "<": "$lt", "<=": "$lte"}


def parse_cli_where(items: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``--where`` options (see CLI_RULE) as a ``where`` object, checked."""
    parts: list[dict[str, Any]] = []
    for item in items:
        if item.strip().startswith("{"):  # a JSON object: $or, or anything the API takes
            parts.append(loads(item.strip(), FilterError))
            continue
        m = _CLI.match(item)
        if m is None:
            raise FilterError(item.strip(), CLI_RULE)
        key, sign, raw = m.group(1), m.group(2), m.group(3).strip()
        if sign in ("?", "!?"):
            if raw:
                raise FilterError(key, f"nothing follows {sign}")
            parts.append({key: {"$exists": sign == "?"}})
        elif sign in ("~", "!~"):
            members = [_cli_value(v.strip()) for v in raw.split(",") if v.strip()]
            parts.append({key: {"$in" if sign == "~" else "$nin": members}})
        else:
            value = _cli_value(raw)
            if sign in ("=", "!=") and isinstance(value, list | dict):
                value = raw
            parts.append({key: {_CLI_OPS[sign]: value}})
    where = parts[0] if len(parts) == 1 else {"$and": parts} if parts else {}
    parse_where(where)
    return where


def _compare(op: str, value: Any, operand: Any) -> bool:
    if isinstance(operand, datetime):
        value = _as_date(value)
        if value is None:
            return False
        if (value.tzinfo is None) != (operand.tzinfo is None):
            value, operand = value.replace(tzinfo=None), operand.replace(tzinfo=None)
    elif not _is_number(value):
        return False
    if op == "$gt":
        return value > operand
    if op == "$gte":
        return value >= operand
    if op == "$lt":
        return value < operand
    return value <= operand


def _same(value: Any, operand: Any) -> bool:
    """Equal as JSON values (True is not 1)."""
    if _is_number(value) and _is_number(operand):
        return value == operand
    return type(value) is type(operand) and value == operand


def _holds(value: Any, operand: Any) -> bool:
    if isinstance(value, list):
        return any(_same(v, operand) for v in value)
    return _same(value, operand)


def _one(c: Condition | AnyOf, metadata: dict[str, Any]) -> bool:
    if isinstance(c, AnyOf):
        return any(all(_one(p, metadata) for p in part) for part in c.parts)
    present = c.key in metadata
    value = metadata.get(c.key)
    if c.op == "$exists":
        return present == c.operand
    if c.op == "$eq":
        return present and _holds(value, c.operand)
    if c.op == "$ne":
        return not (present and _holds(value, c.operand))
    if c.op == "$in":
        return present and any(_holds(value, v) for v in c.operand)
    if c.op == "$nin":
        return not (present and any(_holds(value, v) for v in c.operand))
    return present and not isinstance(value, list) and _compare(c.op, value, c.operand)


def matches(where: Where, metadata: dict[str, Any] | None) -> bool:
    """Whether a document's metadata passes every condition."""
    meta = metadata or {}
    return all(_one(c, meta) for c in where)


def matching_documents(session: Session, dataset_id: int | None, where: Where) -> list[int]:
    """The live documents (of one dataset, or of all) whose metadata pass ``where``, read at one
    moment."""
    from sqlmodel import col, select

    from sluice.storage.models import Document

    stmt = select(col(Document.id), col(Document.metadata_)).where(
        col(Document.deleted_at).is_(None),
        *_narrowed(where, session.get_bind().dialect.name == "postgresql"),
    )
    if dataset_id is not None:
        stmt = stmt.where(Document.dataset_id == dataset_id)
    return [did for did, meta in session.exec(stmt).all() if matches(where, meta)]


def _narrowed(where: Where, pg: bool) -> list[Any]:
    """SQL conditions every document ``where`` allows passes, so that only those (and a few more,
    which ``matches`` then leaves out) are read and decoded: a top-level equality to strings, or
    membership among them, by the key's value, or any list (whose members ``matches`` checks).
    Decoding every document in Python cost 15 ms a search at 1,000 documents."""
    from sqlalchemy import String, func, or_
    from sqlmodel import col

    from sluice.storage.models import Document

    column = col(Document.metadata_)
    out: list[Any] = []
    for c in where:
        if not isinstance(c, Condition) or c.op not in ("$eq", "$in"):
            continue
        values = list(c.operand) if c.op == "$in" else [c.operand]
        if not values or not all(isinstance(v, str) for v in values):
            continue  # numbers, booleans, dates: left to ``matches`` (1 is not True, 2.0 is 2)
        value: Any
        kind: Any
        if pg:
            value = column.op("->>", return_type=String)(c.key)
            kind = func.json_typeof(column.op("->")(c.key))
        else:
            path = f'$."{c.key}"'  # a key is [a-z][a-z0-9_]*
            value, kind = func.json_extract(column, path), func.json_type(column, path)
        out.append(or_(value.in_(values), kind == "array"))
    return out


# --- changing a document's metadata ---------------------------------------------------------------


class UnknownDocument(OperationError):
    """No live document has this id (never made, or deleted)."""

    code, status = "not_found", 404
    hint = "The document may have been deleted: list the dataset's documents."


def set_document_metadata(
    ctx: Context, document_id: int, metadata: Any, *, actor: str = "system", event: bool = True
) -> dict[str, Any]:
    """Replace a live document's metadata with ``metadata`` (validated; keys left out go). Returns
    what is stored; ``event``: a change leaves a ``metadata_changed`` event (not at a new
    document's upload, whose metadata is its first).

    The document row is the authority search filters on: one UPDATE switches every chunk of the
    document at once. The chunks' copies in the vector store are rewritten after it (their
    metadata only, never their vectors), batch by batch; reconcile repairs a copy left behind."""
    from sqlmodel import Session

    from sluice.storage.db import stored
    from sluice.storage.models import Dataset, Document

    clean = validate(metadata)
    with Session(ctx.engine) as session:
        doc = session.get(Document, document_id)
        if doc is None or doc.deleted_at is not None:
            raise UnknownDocument(f"no document {document_id}")
        coll = stored(session, Dataset, doc.dataset_id).collection
        changed = (doc.metadata_ or {}) != clean
        doc.metadata_ = dict(clean) or None  # a new value: SQLModel saves no in-place change
        session.add(doc)
        if changed and event:
            _metadata_event(session, doc, clean, actor)
        session.commit()
    log.info("document %d: metadata set by %s (%d key(s))", document_id, actor, len(clean))
    faults.hit("metadata_switched", document_id=document_id)
    rewrite_chunk_copies(ctx, coll, document_id, clean)
    return clean


def _metadata_event(session, doc, clean: dict[str, Any], actor: str) -> None:
    """A ``metadata_changed`` event (document.metadata_changed in the event stream) on
    the document's serving job, else its newest, in the change's own transaction: its keys, never
    its values."""
    from sqlmodel import col, select

    from sluice.storage.jobs.event_log import add_event
    from sluice.storage.models import Job

    job = session.get(Job, doc.active_job_id) if doc.active_job_id else None
    if job is None:
        job = session.exec(
            select(Job).where(Job.document_id == doc.id).order_by(col(Job.id).desc()).limit(1)
        ).first()
    if job is not None:
        add_event(
            session,
            job,
            "metadata_changed",
            actor=actor,
            message=f"metadata replaced: {len(clean)} key(s)",
            data={"keys": sorted(clean)},
        )


def rewrite_chunk_copies(
    ctx: Context, collection: str, document_id: int, metadata: dict[str, Any]
) -> int:
    """Make every chunk of the document in the vector store carry ``metadata`` (all its jobs)."""
    from sluice.pipeline.running import chunk_copies

    return chunk_copies.rewrite(ctx, collection, {"document_id": document_id}, metadata)


def filtered_documents(
    session: Session, dataset_id: int, where: Where, *, offset: int = 0, limit: int = 100
) -> list[Document]:
    """A page of a dataset's live documents, oldest first, those ``where`` allows."""
    from sqlmodel import col, select

    from sluice.storage.models import Document

    stmt = (
        select(Document)
        .where(Document.dataset_id == dataset_id, col(Document.deleted_at).is_(None))
        .order_by(col(Document.id))
    )
    if not where:
        return list(session.exec(stmt.offset(offset).limit(limit)).all())
    allowed = [d for d in session.exec(stmt).all() if matches(where, d.metadata_)]
    return allowed[offset : offset + limit]


def matching_job_documents(session: Session, dataset_ids: list[int] | None, where: Where):
    """The live documents of these datasets (None: all) that ``where`` allows, as a list of ids."""
    if dataset_ids is None:
        return matching_documents(session, None, where)
    return [d for ds in dataset_ids for d in matching_documents(session, ds, where)]


def parse_filter_text(value: str | None) -> dict | None:
    """A filter typed into one field (the console's): a JSON object, or the command line's forms
    separated by ``;`` (``lang=de; year>=2020``). None when empty; FilterError when bad."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    if value.startswith("{"):
        where = loads(value, FilterError)
        parse_where(where)
        return where
    return parse_cli_where([p for p in value.split(";") if p.strip()]) or None
