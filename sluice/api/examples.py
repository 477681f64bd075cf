"""The examples ``/openapi.json`` publishes (and ``/reference`` draws): one plain value per model,
built from each other so that a nested one says the same as its own. tests/test_reference.py
checks each against its schema, so an example cannot drift from what the API answers."""

from __future__ import annotations

from typing import Any

Example = dict[str, Any]  # a JSON object (what pydantic's json_schema_extra takes)
AT = "2024-05-01T12:00:00+00:00"
LATER = "2024-05-01T12:00:09+00:00"

HEALTH: Example = {"status": "ok", "version": "0.9.0", "ready": True}
DATASET: Example = {
    "name": "contracts",
    "documents": 12,
    "chunks": 480,
    "jobs": {"succeeded": 12, "running": 1},
    "created_at": AT,
}
DATASET_LIST: Example = {"datasets": [DATASET]}
DATASET_CREATE: Example = {"name": "contracts"}
DATASET_CREATED: Example = {
    "ok": True,
    "message": "dataset 'contracts' is ready",
    "dataset": DATASET,
}
DATASET_RENAME: Example = {"name": "contracts-2024"}
DATASET_RENAMED: Example = {
    "ok": True,
    "message": "dataset 'contracts' is now called 'contracts-2024'",
    "dataset": {**DATASET, "name": "contracts-2024"},
}
DATASET_DELETED: Example = {"ok": True, "message": "dataset 'contracts' deleted: 12 document(s)"}

METADATA: Example = {"lang": "de", "year": 2024, "team": ["legal"]}
TEXT_UPLOAD: Example = {
    "filename": "note.txt",
    "text": "The invoice 2024-117 is due on 1 June.",
    "external_id": "notes/2024-117",
    "metadata": METADATA,
}
MULTIPART_UPLOAD: Example = {
    "file": ["(the bytes of handbook.pdf)"],
    "external_id": "hr/handbook",
    "metadata": '{"lang": "en", "year": 2024}',
}
UPLOADED: Example = {
    "jobs": [
        {
            "job_id": 9,
            "document_id": 9,
            "filename": "handbook.pdf",
            "status": "queued",
            "existing": False,
            "external_id": "hr/handbook",
            "version": 2,
            "replaces_document_id": 4,
            "metadata_changed": False,
        }
    ]
}

JOB: Example = {
    "id": 9,
    "dataset": "contracts",
    "document_id": 9,
    "filename": "handbook.pdf",
    "status": "running",
    "stage": "embedding",
    "done": 320,
    "total": 500,
    "progress": "embedding 320/500 chunks",
    "attempt": 1,
    "max_attempts": 3,
    "final": False,
    "waiting": None,
    "waiting_for": None,
    "waiting_since": None,
    "error_kind": None,
    "error_code": None,
    "error_message": None,
    "fix_hint": None,
    "cancel_requested": False,
    "chunk_count": None,
    "page_count": 42,
    "pipeline_version": "p3",
    "created_at": AT,
    "updated_at": LATER,
    "finished_at": None,
    "next_attempt_at": None,
    "heartbeat_at": LATER,
    "version_message": "version 2 is being built; version 1 still serving",
}
JOB_LIST: Example = {"jobs": [JOB], "next_cursor": "9"}
ACTION: Example = {
    "ok": True,
    "message": "job 9: queued again",
    "queue_note": "",
    "warnings": [],
    "job": {
        **JOB,
        "status": "queued",
        "stage": "queued",
        "done": 0,
        "total": 0,
        "progress": "queued",
        "attempt": 2,
    },
}
UNLOCK: Example = {"password": "the PDF's password"}

DOCUMENT: Example = {
    "id": 9,
    "dataset": "contracts",
    "filename": "handbook.pdf",
    "sha256": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "size": 482133,
    "media_type": "application/pdf",
    "created_at": AT,
    "deleted": False,
    "active_job_id": 9,
    "chunk_count": 500,
    "page_count": 42,
    "jobs": [{"id": 9, "status": "succeeded", "pipeline_version": "p3", "chunk_count": 500}],
    "metadata": METADATA,
    "external_id": "hr/handbook",
    "version": 2,
    "version_state": "serving",
    "version_message": "version 2 (live)",
    "replaces_document_id": 4,
    "replaced_by": None,
    "serving_document_id": 9,
    "serving_version": 2,
    "enabled": True,
    "disabled_at": None,
    "disabled_by": None,
}
DOCUMENT_LIST: Example = {"documents": [DOCUMENT]}
LISTED_DOCUMENTS: Example = {
    "documents": [
        {
            "id": 9,
            "filename": "handbook.pdf",
            "media_type": "application/pdf",
            "size": 482133,
            "created_at": AT,
            "active_job_id": 9,
            "metadata": METADATA,
        }
    ],
    "offset": 0,
    "limit": 50,
    "next_offset": 50,
}
DOCUMENT_PATCH: Example = {"metadata": {"lang": "en", "year": 2024}, "enabled": True}
CHUNK_ID = "9f86d081884c7d65:000012"
CHUNKS: Example = {
    "chunks": [
        {
            "chunk_id": CHUNK_ID,
            "position": 12,
            "page": 3,
            "text": "Holidays: every employee has 30 days a year.",
            "enabled": True,
        }
    ],
    "offset": 0,
    "limit": 100,
    "next_offset": None,
}
CHUNK_PATCH: Example = {"enabled": False}
CHUNK_STATE: Example = {
    "chunk_id": CHUNK_ID,
    "dataset": "contracts",
    "document_id": 9,
    "enabled": False,
}
DELETED: Example = {
    "ok": True,
    "message": "deleted document 9 (handbook.pdf, dataset contracts): 500 chunk(s) removed, "
    "1 job(s) marked deleted, blob removed",
    "vectors_removed": 500,
    "blob_removed": True,
    "jobs_deleted": [9],
}

SEARCH: Example = {
    "query": "holidays per year",
    "k": 5,
    "mode": "hybrid",
    "where": {"$or": [{"lang": "en"}, {"year": {"$gte": 2024}}]},
    "min_score": 0.3,
    "max_chunks_per_document": 2,
    "dense_weight": 0.5,
}
HITS: Example = {
    "hits": [
        {
            "score": 0.82,
            "text": "Holidays: every employee has 30 days a year.",
            "snippet": "Holidays: every employee has 30 days a year.",
            "heading": "Handbook > Time off",
            "document_id": 9,
            "chunk_id": CHUNK_ID,
            "job_id": 9,
            "filename": "handbook.pdf",
            "page": 3,
            "location": "page 3",
            "where": "page 3",
            "matched": ["holidays", "year"],
            "ocr": False,
            "similarity": 0.71,
            "rerank_score": None,
            "context": None,
        }
    ]
}

EVENTS = (
    'id: 41\nevent: job.progress\ndata: {"event": {"kind": "progress", "at": "' + AT + '", '
    '"actor": "worker", "message": "embedding 320/500 chunks"}, "job": {"id": 9, ...}}\n\n'
)

AUDIT: Example = {
    "entries": [
        {
            "id": 77,
            "at": AT,
            "actor_kind": "api_key",
            "actor_name": "app",
            "actor_key": "k_3f2a",
            "address": "10.0.0.7",
            "action": "document.delete",
            "target_kind": "document",
            "target_id": "9",
            "dataset": "contracts",
            "params": {},
            "outcome": "ok",
            "code": None,
            "reason": "",
        }
    ],
    "next_cursor": "77",
}

SOURCE_CREATE: Example = {
    "name": "team-share",
    "dataset": "contracts",
    "s3": "s3://bucket/team/",
    "include": ["*.pdf"],
    "exclude": [],
    "every": "15m",
}
SOURCE: Example = {
    "name": "team-share",
    "dataset": "contracts",
    "kind": "s3",
    "location": "s3://bucket/team/",
    "include": ["*.pdf"],
    "exclude": [],
    "every_seconds": 900,
    "next_run_at": None,
    "documents": 0,
    "tombstoned": 0,
    "last_run": None,
    "state": "unconfirmed",
    "confirmed": False,
    "preview": {"added": 120, "changed": 0, "removed": 0},
}
SOURCE_LIST: Example = {"sources": [SOURCE]}
SYNC_REQUEST: Example = {"preview": False, "confirm": True}
SYNC: Example = {
    "source": "team-share",
    "ran": True,
    "preview": False,
    "status": "done",
    "run_id": 3,
    "counts": {"added": 120, "changed": 0, "removed": 0},
    "failed": [],
    "held_reason": "",
    "cost": "120 job(s), 2,400 chunk(s) to embed",
    "to_embed": 2400,
    "message": "synced: 120 added",
    "seconds": 2.4,
}
SOURCE_REMOVED: Example = {
    "ok": True,
    "message": "source 'team-share' removed",
    "deleted": 120,
    "kept": 0,
    "adopted": 0,
}
PROBLEM: Example = {
    "type": "urn:sluice:problem:not_found",
    "title": "Not found",
    "status": 404,
    "detail": "no job 9",
    "code": "not_found",
    "hint": "check the id, and the datasets of the key",
}

# The operations whose models live beside routes others own: their examples, put on the
# operation's own media types by the server's document (sluice.api.server).
BY_OPERATION: dict[tuple[str, str], dict[str, Any]] = {
    ("patch", "/v1/documents/{document_id}"): {"request": DOCUMENT_PATCH, "200": DOCUMENT},
    ("get", "/v1/datasets/{dataset}/documents"): {"200": LISTED_DOCUMENTS},
    ("patch", "/v1/chunks/{chunk_id}"): {"request": CHUNK_PATCH, "200": CHUNK_STATE},
}
