"""The Python client of Sluice's HTTP API (httpx), for applications and for the tests.

    from sluice.client import Client

    with Client("http://127.0.0.1:8700", key) as sluice:
        job = sluice.upload("report.pdf", dataset="contracts")
        done = sluice.wait(job.job_id, timeout=300)
        for hit in sluice.search("termination notice", dataset="contracts", where={"year": 2024}):
            print(hit.score, hit.filename, hit.page)

``AsyncClient`` has the same methods, to be awaited (``async with AsyncClient(...) as sluice``).
Answers are typed results (``sluice.client.results``, one per schema of ``/openapi.json``);
errors are ``ApiError`` with the problem's ``status``, ``code``, ``detail`` and ``hint``. A 429 or
503 is tried again after its ``Retry-After`` (``Retry``). This package imports nothing else of
Sluice, so it can be copied into an application as it is (only httpx is needed).
"""

from .clients import AsyncClient, Client
from .event_source import Event, StreamClosed, parse_events
from .operations import FINAL, Operations
from .plans import ApiError, DatasetNeeded
from .results import (
    ActionResult,
    AuditEntry,
    AuditPage,
    Chunk,
    ChunkPage,
    ChunkState,
    Dataset,
    DatasetCreated,
    DatasetDeleted,
    DatasetRenamed,
    Deleted,
    Document,
    DocumentJob,
    DocumentPage,
    Health,
    Hit,
    Job,
    JobPage,
    ListedDocument,
    Problem,
    Result,
    Source,
    SourceRemoved,
    SyncResult,
    UploadedJob,
    Waiting,
)
from .retrying import Retry

__all__ = [
    "FINAL",
    "ActionResult",
    "ApiError",
    "AsyncClient",
    "AuditEntry",
    "AuditPage",
    "Chunk",
    "ChunkPage",
    "ChunkState",
    "Client",
    "Dataset",
    "DatasetCreated",
    "DatasetDeleted",
    "DatasetNeeded",
    "DatasetRenamed",
    "Deleted",
    "Document",
    "DocumentJob",
    "DocumentPage",
    "Event",
    "Health",
    "Hit",
    "Job",
    "JobPage",
    "ListedDocument",
    "Operations",
    "Problem",
    "Result",
    "Retry",
    "Source",
    "SourceRemoved",
    "StreamClosed",
    "SyncResult",
    "UploadedJob",
    "Waiting",
    "parse_events",
]
