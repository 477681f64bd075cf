"""The Python client of Sluice's HTTP API (httpx), for applications and for the tests.

    from sluice.client import Client

    with Client("http://127.0.0.1:8700", key) as sluice:
        job = sluice.upload("report.pdf", dataset="contracts")
        done = sluice.wait(job["job_id"], timeout=300)
        for hit in sluice.search("termination notice", dataset="contracts"):
            print(hit["score"], hit["filename"], hit["page"])

Errors come back as ``ApiError`` with the problem's ``status``, ``code`` and ``detail``. This module
imports nothing else of Sluice, so it can be copied into an application as it is.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

FINAL = ("succeeded", "failed", "cancelled", "superseded", "deleted")


class ApiError(Exception):
    """An answer of the API that is an error (problem+json)."""

    def __init__(self, status: int, code: str, detail: str, body: dict | None = None) -> None:
        super().__init__(f"{status} {code}: {detail}")
        self.status, self.code, self.detail, self.body = status, code, detail, body or {}


@dataclass
class Event:
    id: int
    type: str
    data: dict[str, Any] = field(default_factory=dict)


def _raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        body = response.json()
    except ValueError:
        body = {}
    raise ApiError(
        response.status_code,
        str(body.get("code", f"http_{response.status_code}")),
        str(body.get("detail", response.text[:200])),
        body,
    )


class Client:
    def __init__(self, url: str, key: str, *, timeout: float = 30.0, **httpx_options: Any):
        self.http = httpx.Client(
            base_url=url.rstrip("/"),
            headers={"Authorization": f"Bearer {key}"},
            timeout=timeout,
            **httpx_options,
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.http.request(method, path, **kwargs)
        _raise_for(response)
        return response.json()

    def upload(
        self,
        path_or_bytes: str | Path | bytes,
        *,
        dataset: str = "default",
        filename: str | None = None,
        idempotency_key: str | None = None,
        external_id: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Upload one file; returns its job entry (``job_id``, ``document_id``, ``existing``...).
        New bytes under a known ``external_id`` replace its live version once they are indexed.
        ``metadata``: the document's own fields (ApiError 422 ``invalid_metadata`` names a bad
        key)."""
        if isinstance(path_or_bytes, bytes):
            data, name = path_or_bytes, filename or "upload.txt"
        else:
            data, name = Path(path_or_bytes).read_bytes(), filename or Path(path_or_bytes).name
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        body = self._json(
            "POST",
            f"/v1/datasets/{dataset}/documents",
            files=[("file", (name, data, "application/octet-stream"))],
            data={
                **({"external_id": external_id} if external_id is not None else {}),
                **({"metadata": json.dumps(metadata)} if metadata is not None else {}),
            }
            or None,
            headers=headers,
        )
        return body["jobs"][0]

    def set_metadata(self, document_id: int, metadata: dict[str, Any]) -> dict[str, Any]:
        """Replace a document's metadata (keys left out are removed); returns the document."""
        return self._json("PATCH", f"/v1/documents/{document_id}", json={"metadata": metadata})

    def list_documents(
        self,
        *,
        dataset: str = "default",
        where: dict[str, Any] | None = None,
        offset: int = 0,
        limit: int = 50,
    ) -> dict[str, Any]:
        """One page of a dataset's documents (``documents``, ``next_offset``) ``where`` allows."""
        params: dict[str, Any] = {"offset": offset, "limit": limit}
        if where is not None:
            params["where"] = json.dumps(where)
        return self._json("GET", f"/v1/datasets/{dataset}/documents", params=params)

    def set_chunk_enabled(self, chunk_id: str, enabled: bool) -> dict[str, Any]:
        """Switch a chunk off (kept, left out of every search) or on again."""
        path = f"/v1/chunks/{quote(chunk_id, safe='')}"
        return self._json("PATCH", path, json={"enabled": enabled})

    def document(self, document_id: int) -> dict[str, Any]:
        return self._json("GET", f"/v1/documents/{document_id}")

    def documents(self, *, external_id: str, dataset: str | None = None) -> list[dict[str, Any]]:
        """The live document ``external_id`` names, in each dataset of the key (or ``dataset``)."""
        params = {"external_id": external_id, **({"dataset": dataset} if dataset else {})}
        return self._json("GET", "/v1/documents", params=params)["documents"]

    def delete_by_external_id(self, external_id: str, *, dataset: str = "default") -> dict:
        """Delete every version of ``external_id`` still there (ApiError 404 when there is none)."""
        path = f"/v1/datasets/{dataset}/documents/by-external-id/{quote(external_id, safe='')}"
        return self._json("DELETE", path)

    def job(self, job_id: int) -> dict[str, Any]:
        return self._json("GET", f"/v1/jobs/{job_id}")

    def wait(self, job_id: int, *, timeout: float = 600.0) -> dict[str, Any]:
        """Poll the job until it is final, as often as its ``Retry-After`` says (conditional polls:
        an unchanged job costs a 304). TimeoutError if it is not final in time."""
        deadline = time.monotonic() + timeout
        etag, state = None, None
        while True:
            headers: dict[str, str] = {"If-None-Match": etag} if etag else {}
            response = self.http.get(f"/v1/jobs/{job_id}", headers=headers)
            _raise_for(response)
            if response.status_code != 304:
                state, etag = response.json(), response.headers.get("ETag")
            if state is not None and state["status"] in FINAL:
                return state
            pause = float(response.headers.get("Retry-After", "1") or 1)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"job {job_id} is not final after {timeout:.0f} s: {state}")
            time.sleep(min(pause, left, 5.0))

    def search(
        self,
        query: str,
        *,
        dataset: str = "default",
        k: int = 5,
        mode: str = "hybrid",
        where: dict[str, Any] | None = None,
        **filters,
    ) -> list[dict[str, Any]]:
        """The best ``k`` chunks; ``where``: a metadata filter (``{"lang": "de", "year":
        {"$gte": 2020}}``), applied before ranking; ``filters``: filename, pages, media_type."""
        body = {"query": query, "k": k, "mode": mode, **filters}
        if where is not None:
            body["where"] = where
        return self._json("POST", f"/v1/datasets/{dataset}/search", json=body)["hits"]

    def datasets(self) -> list[dict[str, Any]]:
        return self._json("GET", "/v1/datasets")["datasets"]

    def audit(self, *, limit: int = 500, **filters: Any) -> list[dict[str, Any]]:
        """Audit log rows, newest first, at most ``limit`` (following the cursor); ``filters``:
        since (2h, 7d or an ISO time), actor, action, dataset, outcome. A manage key of every
        dataset only."""
        params = {k: v for k, v in filters.items() if v is not None}
        found: list[dict[str, Any]] = []
        while len(found) < limit:
            page = self._json(
                "GET", "/v1/audit", params={**params, "limit": min(500, limit - len(found))}
            )
            found += page["entries"]
            if not page["next_cursor"]:
                break
            params["cursor"] = page["next_cursor"]
        return found

    def events(
        self,
        *,
        dataset: str | None = None,
        last_event_id: int | None = None,
        seconds: float | None = None,
    ) -> Iterator[Event]:
        """The server-sent events, as they come (``last_event_id``: resume after it; 0: from the
        oldest kept). Reconnecting is the caller's: pass the last ``Event.id`` seen."""
        params: dict[str, Any] = {}
        if dataset:
            params["dataset"] = dataset
        if seconds:
            params["seconds"] = seconds
        headers = {"Last-Event-ID": str(last_event_id)} if last_event_id is not None else {}
        with self.http.stream(
            "GET",
            "/v1/events",
            params=params,
            headers=headers,
            timeout=httpx.Timeout(30, read=None),
        ) as response:
            if response.status_code >= 400:
                response.read()
                _raise_for(response)
            yield from parse_events(response.iter_lines())


def parse_events(lines: Iterator[str]) -> Iterator[Event]:
    """Server-sent events from their lines (comments and ``retry:`` skipped)."""
    fields: dict[str, str] = {}
    for line in lines:
        if not line:
            if "data" in fields:
                yield Event(
                    int(fields.get("id", "0") or 0),
                    fields.get("event", "message"),
                    json.loads(fields["data"]),
                )
            fields = {}
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        fields[name] = f"{fields[name]}\n{value}" if name == "data" and name in fields else value
