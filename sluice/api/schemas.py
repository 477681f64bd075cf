"""The API's request and response models: the contract ``/openapi.json`` publishes."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Path
from pydantic import BaseModel, ConfigDict, Field, GetJsonSchemaHandler, RootModel
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from sluice.api import examples
from sluice.ops import metadata as meta
from sluice.ops.replacing import EXTERNAL_ID_PATTERN, MAX_EXTERNAL_ID
from sluice.ops.search import PAGES_PATTERN
from sluice.storage.models import MAX_ID

JobId = Annotated[int, Path(ge=1, le=MAX_ID, description="a job id")]
DocumentId = Annotated[int, Path(ge=1, le=MAX_ID, description="a document id")]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- the rules of sluice.ops.metadata and sluice.ops.replacing, as JSON Schema --------------------
# The validators decide (and answer their own codes: invalid_metadata, invalid_filter,
# bad_external_id); these say the same rules in /openapi.json, so that a client, and the fuzzing
# run, can read them.

# exclusiveMaximum 2**63: a bound a float holds exactly (OpenAPI writes bounds as floats)
INT64 = {"type": "integer", "minimum": meta.INT_MIN, "exclusiveMaximum": meta.INT_MAX + 1}
SCALAR = {
    "anyOf": [
        {"type": "string"},
        INT64,
        {"type": "number", "description": "a finite float"},
        {"type": "boolean"},
    ]
}
METADATA_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "the document's own fields: keys ^[a-z][a-z0-9_]{0,63}$ (none starting with _), "
    "values strings, numbers (integers of at most 64 bits, finite floats), booleans or lists of "
    f"strings, at most {meta.MAX_BYTES} bytes as JSON; no string may hold a lone surrogate "
    "(docs/api.md, Metadata and filters)",
    "propertyNames": {"pattern": meta.KEY.pattern},
    "additionalProperties": {
        "anyOf": [*SCALAR["anyOf"], {"type": "array", "items": {"type": "string"}}]
    },
    "examples": [{"lang": "de", "year": 2024, "team": ["a", "b"]}],
}
_COMPARED = {
    "anyOf": [
        INT64,
        {"type": "number"},
        {"type": "string", "description": "an ISO date: 2024-05-01 or 2024-05-01T12:00:00Z"},
    ]
}
_LIST = {"type": "array", "minItems": 1, "items": SCALAR}
OPERATORS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "operators on one key, all of which must hold",
    "minProperties": 1,
    "additionalProperties": False,
    "properties": {
        "$eq": SCALAR,
        "$ne": SCALAR,
        "$in": _LIST,
        "$nin": _LIST,
        **{op: _COMPARED for op in meta.COMPARE},
        "$exists": {"type": "boolean"},
    },
}
assert set(OPERATORS_SCHEMA["properties"]) == set(meta.OPERATORS)  # the validator's own list
WHERE_REF = "#/components/schemas/WhereFilter"
WHERE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "title": "WhereFilter",
    "description": "a metadata filter in Chroma's style, every key must hold (and): a key's value "
    "is the value it equals, or an object of operators ($eq $ne $in $nin $gt $gte $lt $lte "
    f"$exists); $and holds a list of filters that must all hold, $or a non-empty list of which "
    f"one must hold, the two nested at most {meta.MAX_DEPTH} levels deep (a deeper one is 422 "
    "invalid_filter). Other operators are refused (docs/api.md, Metadata and filters)",
    "propertyNames": {"pattern": f"^(\\$and|\\$or|{meta.KEY.pattern[1:-1]})$"},
    "properties": {
        "$and": {"type": "array", "items": {"$ref": WHERE_REF}},
        "$or": {"type": "array", "items": {"$ref": WHERE_REF}, "minItems": 1},
    },
    "additionalProperties": {"anyOf": [*SCALAR["anyOf"], OPERATORS_SCHEMA]},
    "examples": [{"lang": "de", "year": {"$gte": 2020}}],
}


class WhereFilter(RootModel[dict[str, Any]]):
    """A ``where`` filter: checked by sluice.ops.metadata.parse_where; this only publishes its
    grammar (``WHERE_SCHEMA``, recursive through ``$and`` and ``$or``)."""

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        # the self-reference as the generator writes it: #/components/schemas/WhereFilter in
        # /openapi.json, a #/$defs/ one in pydantic's own model_json_schema
        generator = getattr(handler, "generate_json_schema", None)
        ref = core_schema.get("ref") if isinstance(core_schema, dict) else None
        if generator is None or ref is None:
            return dict(WHERE_SCHEMA)
        _, self_ref = generator.get_cache_defs_ref_schema(ref)
        return _with_ref(WHERE_SCHEMA, self_ref["$ref"])


def _with_ref(schema: Any, ref: str) -> Any:
    """``schema`` with every ``$ref`` to WHERE_REF made ``ref``."""
    if isinstance(schema, dict):
        return {
            k: ref if k == "$ref" and v == WHERE_REF else _with_ref(v, ref)
            for k, v in schema.items()
        }
    if isinstance(schema, list):
        return [_with_ref(v, ref) for v in schema]
    return schema


def where_parameter(description: str) -> dict[str, Any]:
    """The ``where`` query parameter as /openapi.json declares it: JSON text of a WhereFilter
    (``content``, so that a client or the fuzzing run sends one serialised)."""
    return {
        "name": "where",
        "in": "query",
        "required": False,
        "description": f"{description}: a metadata filter as JSON text (at most 8192 characters)",
        "content": {"application/json": {"schema": {"$ref": WHERE_REF}}},
    }


EXTERNAL_ID_SCHEMA: dict[str, Any] = {
    "minLength": 1,
    "maxLength": MAX_EXTERNAL_ID,
    "pattern": EXTERNAL_ID_PATTERN,
}


class ProblemOut(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [examples.PROBLEM]})
    type: str
    title: str
    status: int
    detail: str
    code: str
    hint: str | None = Field(None, description="what to do about it (docs/api.md, Errors)")


class Health(BaseModel):
    status: Literal["ok"]
    version: str


class DatasetOut(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [examples.DATASET]})
    name: str
    documents: int
    chunks: int
    jobs: dict[str, int] = Field(description="job counts by status")
    created_at: str


class DatasetList(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [examples.DATASET_LIST]})
    datasets: list[DatasetOut]


class DatasetCreate(Strict):
    model_config = ConfigDict(json_schema_extra={"examples": [examples.DATASET_CREATE]})
    name: str = Field(min_length=1, max_length=64, examples=["contracts"])


class DatasetCreated(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [examples.DATASET_CREATED]})
    ok: bool
    message: str
    dataset: DatasetOut


class TextUpload(Strict):
    model_config = ConfigDict(json_schema_extra={"examples": [examples.TEXT_UPLOAD]})
    filename: str = Field(min_length=1, max_length=255, examples=["note.txt"])
    text: str = Field(min_length=1)
    external_id: str | None = Field(
        None,
        description="the application's own id: new bytes under it replace the live version; 1 to "
        "512 characters, none a control character (422 bad_external_id otherwise)",
        json_schema_extra=EXTERNAL_ID_SCHEMA,
    )
    metadata: dict[str, Any] | None = Field(
        None,  # the rules beside the "object or null" pydantic writes (so no "type" of its own)
        json_schema_extra={k: v for k, v in METADATA_SCHEMA.items() if k != "type"},
    )


class UploadedJob(BaseModel):
    job_id: int
    document_id: int
    filename: str
    status: str
    existing: bool
    external_id: str | None = None
    version: int | None = None
    replaces_document_id: int | None = None
    metadata_changed: bool = Field(
        False,
        description="the same bytes were there already and this upload's metadata replaced theirs "
        "(a document.metadata_changed event says so too)",
    )


class UploadAccepted(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [examples.UPLOADED]})
    jobs: list[UploadedJob]


class Waiting(BaseModel):
    reason: Literal["paused", "queue_unreachable", "no_worker", "outage", "backoff", "queue"]
    detail: str
    waiting_for: str | None = None
    starts_at: str | None = None
    ahead: int | None = None
    basis: str | None = Field(None, description="what the start estimate stands on, or why none")


class JobOut(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [examples.JOB]})
    id: int
    dataset: str
    document_id: int
    filename: str
    status: str
    stage: str
    done: int
    total: int
    progress: str = Field(description="the progress in words, e.g. 'embedding 320/500 chunks'")
    attempt: int
    max_attempts: int
    final: bool
    waiting: Waiting | None
    waiting_for: str | None
    waiting_since: str | None
    error_kind: str | None
    error_code: str | None
    error_message: str | None
    fix_hint: str | None
    cancel_requested: bool
    chunk_count: int | None
    page_count: int | None
    pipeline_version: str
    created_at: str | None
    updated_at: str | None
    finished_at: str | None
    next_attempt_at: str | None
    heartbeat_at: str | None
    version_message: str | None = Field(
        None,
        description="under an external id: how its document's version stands",
        examples=["replacement failed; version 1 still serving"],
    )


class JobList(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [examples.JOB_LIST]})
    jobs: list[JobOut]
    next_cursor: str | None


class ActionOut(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [examples.ACTION]})
    ok: bool
    message: str
    queue_note: str = ""
    warnings: list[str] = Field(default_factory=list)
    job: JobOut


class UnlockIn(Strict):
    model_config = ConfigDict(json_schema_extra={"examples": [examples.UNLOCK]})
    password: str = Field(min_length=1, max_length=1024)


class DocumentJob(BaseModel):
    id: int
    status: str
    pipeline_version: str
    chunk_count: int | None


class DocumentOut(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [examples.DOCUMENT]})
    id: int
    dataset: str
    filename: str
    sha256: str
    size: int
    media_type: str
    created_at: str
    deleted: bool
    active_job_id: int | None
    chunk_count: int
    page_count: int | None
    jobs: list[DocumentJob]
    metadata: dict[str, Any] = Field(default_factory=dict)
    external_id: str | None = None
    version: int | None = None
    version_state: str = Field(
        "",
        description="serving, failed, replacing, replacement_failed, replaced, superseded, deleted",
    )
    version_message: str = Field("", examples=["replacement failed; version 1 still serving"])
    replaces_document_id: int | None = None
    replaced_by: int | None = None
    serving_document_id: int | None = None
    serving_version: int | None = None
    enabled: bool = Field(True, description="false: switched off, kept, left out of every search")
    disabled_at: str | None = None
    disabled_by: str | None = None


class DocumentList(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [examples.DOCUMENT_LIST]})
    documents: list[DocumentOut]


class ChunkOut(BaseModel):
    chunk_id: str
    position: int
    page: int
    text: str
    enabled: bool = True  # false: switched off (kept, left out of every search)


class ChunkPage(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [examples.CHUNKS]})
    chunks: list[ChunkOut]
    offset: int
    limit: int
    next_offset: int | None


class DeleteOut(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [examples.DELETED]})
    ok: bool
    message: str
    vectors_removed: int
    blob_removed: bool
    jobs_deleted: list[int]


class SearchIn(Strict):
    model_config = ConfigDict(json_schema_extra={"examples": [examples.SEARCH]})
    query: str = Field(min_length=1, max_length=2000, examples=["invoice 2024-117"])
    k: int = Field(5, ge=1, le=100)
    mode: Literal["hybrid", "dense", "lexical"] = "hybrid"
    filename: str | None = Field(None, max_length=255, description="file name contains this")
    pages: str | None = Field(
        None,
        max_length=40,
        description="A-B, A-, -B or one page; page numbers 0 to 2**63-1 (422 bad_query otherwise)",
        json_schema_extra={"pattern": PAGES_PATTERN},
    )
    media_type: str | None = Field(None, max_length=100)
    where: WhereFilter | None = None
    min_score: float | None = Field(
        None,
        ge=0,
        le=1,
        description="only hits scoring at least this, on the mode's 0..1 scale (fewer than k may "
        "come); see Search scores",
    )
    max_chunks_per_document: int | None = Field(
        None, ge=1, le=100, description="at most this many hits of one document"
    )
    dense_weight: float = Field(
        0.5,
        ge=0,
        le=1,
        description="hybrid: the dense ranker's share of the fusion, 0 (the lexical order) to 1 "
        "(the dense order)",
    )
    rerank: bool | None = Field(
        None,
        description="the server's reranker (SLUICE_RERANK_MODEL) rescores the best candidates and "
        "its 0..1 score becomes the hits' (null: when one is set; true where none is: 422 "
        "rerank_unavailable; false: never)",
    )

    def where_filter(self) -> dict[str, Any] | None:
        """``where`` as the plain object sluice.ops.metadata reads."""
        return None if self.where is None else self.where.root


class HitOut(BaseModel):
    score: float = Field(
        description="0..1 on the mode's scale (see Search scores), larger is better"
    )
    text: str
    snippet: str
    heading: str = Field(
        "", description="the chunk's heading path, Title > Section > Subsection ('' for none)"
    )
    document_id: int
    chunk_id: str
    job_id: int
    filename: str
    page: int
    location: str = Field(description="the chunk's place in words: its page, or its section")
    where: str = Field(
        deprecated=True,
        description="the same as location, kept for clients written before it (a request's "
        "where is its filter)",
    )
    matched: list[str]
    ocr: bool
    similarity: float | None
    rerank_score: float | None = Field(
        None, description="the reranker's 0..1 score, when one reranked the hits (also score)"
    )
    context: str | None = Field(
        None,
        description="the hit's parent section: its section's text around it, up to the dataset's "
        "context_size characters (null when that is 0)",
    )


class SearchOut(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [examples.HITS]})
    hits: list[HitOut]


def problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses=`` of a route: these statuses answer problem+json."""
    return {s: {"model": ProblemOut} for s in statuses}
