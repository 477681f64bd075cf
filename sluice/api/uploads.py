"""Reading an upload's body: counted while it streams in and refused (413) the moment it passes the
limit, before any of it reaches the blob store; then the ``file`` parts of a multipart body, or a
JSON ``{"filename", "text"}``."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from tempfile import SpooledTemporaryFile
from typing import IO

from fastapi import Request
from pydantic import ValidationError
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Message

from sluice.api.problems import Problem
from sluice.api.schemas import TextUpload
from sluice.ops import metadata as meta

FRAMING_BYTES = 64 * 1024  # what multipart boundaries and part headers may add to the files
MAX_FILES = 100
SPOOL_BYTES = 1024 * 1024


@dataclass
class Part:
    filename: str
    file: IO[bytes]
    sha256: str
    external_id: str | None = None  # the request's external_id (form field or JSON member)
    metadata: dict | None = None  # the request's metadata, validated (sluice.ops.metadata)
    declared_type: str = ""  # the media type the client gave the part (a JSON upload: text/plain)


class _TooLarge(Exception):
    pass


def _too_large(limit: int) -> Problem:
    return Problem(
        413,
        "too_large",
        f"the upload is larger than the limit of {limit:,} bytes (SLUICE_MAX_UPLOAD_BYTES); "
        "nothing was stored. Send large files one per request, or raise the limit.",
    )


def _counted(request: Request, limit: int) -> Request:
    """The same request, whose body raises once more than ``limit`` bytes came in."""
    seen = 0
    receive = request.receive

    async def counting() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise _TooLarge()
        return message

    return Request(request.scope, counting)


def _hashed(name: str, fh: IO[bytes]) -> Part:
    digest = hashlib.sha256()
    fh.seek(0)
    for block in iter(lambda: fh.read(1 << 16), b""):
        digest.update(block)
    fh.seek(0)
    return Part(name, fh, digest.hexdigest())


async def _multipart(request: Request) -> list[Part]:
    try:
        form = await request.form(max_files=MAX_FILES, max_fields=MAX_FILES)
    except StarletteHTTPException as exc:
        detail = f"the multipart body is malformed: {exc.detail}"
        raise Problem(422, "malformed_multipart", detail) from None
    files = [v for k, v in form.multi_items() if k == "file" and isinstance(v, UploadFile)]
    if not files:
        raise Problem(422, "no_file", "a multipart upload needs one or more parts named 'file'")
    parts = [_hashed(f.filename or "unnamed", f.file) for f in files]
    for part, f in zip(parts, files, strict=True):
        part.declared_type = f.content_type or ""
    external = form.get("external_id")
    if external is not None and not isinstance(external, str):
        raise Problem(422, "bad_external_id", "external_id is a form field, not a file")
    raw = form.get("metadata")
    if raw is not None and not isinstance(raw, str):
        raise Problem(422, "invalid_metadata", "metadata is a form field of JSON, not a file")
    metadata = meta.parse_json(raw) if raw is not None else None  # MetadataError: 422 with key
    for part in parts:
        part.external_id = external
        part.metadata = metadata
    return parts


async def _text(request: Request) -> list[Part]:
    raw = await request.body()
    try:
        body = TextUpload.model_validate(json.loads(raw))
    except (ValueError, ValidationError, RecursionError) as exc:
        detail = (
            exc.errors()[0]["msg"]
            if isinstance(exc, ValidationError)
            else "JSON nested too deeply"
            if isinstance(exc, RecursionError)
            else "not JSON"
        )
        detail = f"a JSON upload is {{filename, text}}: {detail}"
        raise Problem(422, "invalid_request", detail) from None
    spool: IO[bytes] = SpooledTemporaryFile(max_size=SPOOL_BYTES)
    spool.write(body.text.encode())
    part = _hashed(body.filename, spool)
    part.external_id = body.external_id
    part.declared_type = "text/plain"  # the client sent text, whatever its first bytes look like
    if body.metadata is not None:
        part.metadata = meta.validate(body.metadata)
    return [part]


async def read_upload(request: Request, *, max_bytes: int) -> list[Part]:
    """The files of an upload request, or a Problem (413, 415, 422) with nothing stored."""
    limit = max_bytes + FRAMING_BYTES
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(max_bytes)  # refused before a byte of the body is read
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind not in ("multipart/form-data", "application/json"):
        raise Problem(
            415,
            "unsupported_media_type",
            "send multipart/form-data with 'file' parts, or application/json {filename, text}",
        )
    counted = _counted(request, limit)
    try:
        return await (_multipart(counted) if kind == "multipart/form-data" else _text(counted))
    except _TooLarge:
        raise _too_large(max_bytes) from None
