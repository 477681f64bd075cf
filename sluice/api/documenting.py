"""What the server adds to FastAPI's ``/openapi.json`` so that ``/reference`` answers: the models'
own examples as written (FastAPI drops every null of the document, an example's ``null`` fields
too), the examples of operations whose models carry none (sluice.api.examples.BY_OPERATION), and
on every error response ``x-problem-codes``, the ``code``s that status answers there (docs/api.md,
Errors, says what each means and what to do; tests/test_reference.py checks each is a row there)."""

from __future__ import annotations

import sys
from typing import Any

from sluice.api import examples

# The codes any operation may answer at a status (the key gate, the guard, the validation).
COMMON: dict[int, tuple[str, ...]] = {
    401: ("unauthorized",),
    403: ("scope_missing", "read_only", "host_not_allowed"),
    404: ("not_found",),
    422: ("invalid_request",),
    429: ("rate_limited", "too_many_connections"),
}
_SOURCE_422 = ("bad_source", "bad_source_name", "bad_every", "bad_dataset_name")
_DATASET_ADMIN = {
    404: ("unknown_dataset",),
    409: ("dataset_name_taken", "dataset_deleting", "jobs_still_running", "refused"),
    422: ("invalid_dataset_name",),
}
_IDEMPOTENT = {
    409: ("idempotency_in_flight",),
    422: ("idempotency_key_reused", "bad_idempotency_key"),
}
# The codes of one operation beyond COMMON, where they are known.
BY_OPERATION: dict[tuple[str, str], dict[int, tuple[str, ...]]] = {
    ("post", "/v1/datasets"): {
        409: ("dataset_name_taken", *_IDEMPOTENT[409]),
        422: ("invalid_dataset_name", *_IDEMPOTENT[422]),
    },
    ("patch", "/v1/datasets/{dataset}"): _DATASET_ADMIN,
    ("delete", "/v1/datasets/{dataset}"): _DATASET_ADMIN,
    ("post", "/v1/datasets/{dataset}/documents"): {
        409: ("external_id_conflict", *_IDEMPOTENT[409]),
        413: ("too_large",),
        415: ("unsupported_media_type", "unsupported_type"),
        422: (
            "empty_file",
            "unreadable_archive",
            "archive_too_large",
            "no_file",
            "malformed_multipart",
            "bad_external_id",
            "external_id_needs_one_file",
            "invalid_metadata",
            "bad_dataset_name",
            "dataset_deleting",
            "upload_contended",
            *_IDEMPOTENT[422],
        ),
        503: ("blob_store_unavailable", "blob_store_auth_failed"),
    },
    ("get", "/v1/datasets/{dataset}/documents"): {422: ("invalid_filter",)},
    ("delete", "/v1/datasets/{dataset}/documents/by-external-id/{external_id}"): {
        409: ("action_refused",),
        422: ("bad_external_id",),
    },
    ("get", "/v1/jobs"): {422: ("invalid_filter",)},
    ("post", "/v1/jobs/{job_id}/retry"): {409: ("action_refused",)},
    ("post", "/v1/jobs/{job_id}/cancel"): {409: ("action_refused",)},
    ("post", "/v1/jobs/{job_id}/unlock"): {409: ("action_refused",)},
    ("delete", "/v1/documents/{document_id}"): {409: ("action_refused",)},
    ("patch", "/v1/documents/{document_id}"): {422: ("invalid_metadata",)},
    ("patch", "/v1/chunks/{chunk_id}"): {
        409: ("ambiguous_chunk", "edit_conflict"),
        422: ("invalid_chunk_text",),
        503: ("vector_store_unavailable",),
    },
    ("post", "/v1/datasets/{dataset}/search"): {
        409: ("dataset_deleting",),
        422: ("bad_query", "invalid_filter", "rerank_unavailable"),
        503: ("vector_store_unavailable",),
    },
    ("get", "/v1/events"): {429: ("too_many_streams",)},
    ("post", "/v1/sources"): {
        404: ("unknown_dataset",),
        409: ("source_exists",),
        422: (*_SOURCE_422, "folder_not_from_api", "source_location_refused"),
    },
    ("get", "/v1/sources/{name}"): {404: ("unknown_source",)},
    ("delete", "/v1/sources/{name}"): {404: ("unknown_source",), 409: ("sync_running",)},
    ("post", "/v1/sources/{name}/sync"): {404: ("unknown_source",), 409: ("sync_running",)},
}


def codes(method: str, path: str, status: int) -> list[str]:
    """The codes an operation answers at ``status``: the common ones, then its own."""
    own = BY_OPERATION.get((method, path), {}).get(status, ())
    return list(dict.fromkeys([*COMMON.get(status, ()), *own]))


def _put_example(media: dict[str, Any], value: Any) -> None:
    if "example" not in media and "examples" not in media:
        media["example"] = value


def model_examples() -> dict[str, list[Any]]:
    """The ``examples`` of the models of sluice.api (pydantic models and dataclasses), by name."""
    found: dict[str, list[Any]] = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith("sluice.api.") or module is None:
            continue
        for obj in vars(module).values():
            if not isinstance(obj, type) or obj.__module__ != name:
                continue
            config = getattr(obj, "model_config", None) or getattr(obj, "__pydantic_config__", {})
            extra = config.get("json_schema_extra") if isinstance(config, dict) else None
            if isinstance(extra, dict) and "examples" in extra:
                found[obj.__name__] = extra["examples"]
    return found


def decorate(schema: dict[str, Any]) -> None:
    """Put back the models' examples; add those of examples.BY_OPERATION and each error
    response's ``x-problem-codes``."""
    components = schema.get("components", {}).get("schemas", {})
    for name, values in model_examples().items():
        if name in components:
            components[name]["examples"] = values
    for path, item in schema["paths"].items():
        for method, op in item.items():
            given = examples.BY_OPERATION.get((method, path), {})
            body = op.get("requestBody", {}).get("content", {}).get("application/json")
            if body is not None and "request" in given:
                _put_example(body, given["request"])
            for status, answer in op.get("responses", {}).items():
                media = answer.get("content", {}).get("application/json")
                if media is not None and status in given:
                    _put_example(media, given[status])
                if status.isdigit() and int(status) >= 400:
                    found = codes(method, path, int(status))
                    if found:
                        answer["x-problem-codes"] = found
