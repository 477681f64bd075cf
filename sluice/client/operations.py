"""Every operation of the API, written once as a plan (``sluice.client.plans``): the request it
makes, the retries it may take, how its answer becomes a typed result. ``Client`` and
``AsyncClient`` both inherit these methods; each carries the plan's steps out its own way.

A method that acts in one dataset takes ``dataset=``; without one it uses the client's
``dataset``, else the one dataset the key reaches (``GET /v1/datasets`` lists only those; looked up
once, and again when that name answers 404, say after a rename); a key of several is
``DatasetNeeded``. Nothing falls back to ``default``."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from pathlib import Path
from typing import Any, BinaryIO, TypeVar
from urllib.parse import quote

import httpx

from .event_source import API_STOPPING, CLOSED, Event, EventParser, StreamClosed
from .plans import (
    ApiError,
    Attempt,
    Close,
    DatasetNeeded,
    Emit,
    Open,
    Plan,
    ReadLine,
    Request,
    Sleep,
    call,
    items,
    raise_for,
)
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
    DocumentPage,
    Health,
    Hit,
    Job,
    JobPage,
    ListedDocument,
    Result,
    Source,
    SourceRemoved,
    SyncResult,
    UploadedJob,
)
from .retrying import NO_RETRY, RETRY_STATUSES, Retry, retriable, retry_after

R = TypeVar("R", bound=Result)
T = TypeVar("T")
FINAL = ("succeeded", "failed", "cancelled", "superseded", "deleted")
STREAM_TIMEOUT = httpx.Timeout(30.0, read=None)  # a quiet stream sends a comment every 15 s
MAX_STREAM_SECONDS = 86400.0  # the most ``seconds`` one stream of the API takes
UploadFile = str | Path | bytes | tuple[str, bytes | BinaryIO]


def segment(value: str | int) -> str:
    """One path segment, every reserved character escaped."""
    return quote(str(value), safe="")


def where_text(where: dict[str, Any] | None) -> str | None:
    return None if where is None else json.dumps(where, separators=(",", ":"))


def given(**values: Any) -> dict[str, Any]:
    """The values that are not None."""
    return {k: v for k, v in values.items() if v is not None}


class Operations:
    """The API's operations, shared by ``Client`` and ``AsyncClient``."""

    def __init__(
        self,
        *,
        dataset: str | None = None,
        retries: Retry | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.default_dataset = dataset
        self.retries = retries if retries is not None else Retry()
        self.clock = clock
        self._key_dataset: str | None = None  # the key's one dataset, once looked up

    # --- the shared parts of every plan -----------------------------------------------------------

    def _send(self, request: Request) -> Plan[httpx.Response]:
        """The request, tried again on 429 and 503 (waiting their ``Retry-After``) and on a
        refused connection, as ``retry`` allows; a POST only with an ``Idempotency-Key``.
        ApiError for an error answer."""
        may_retry = request.method != "POST" or "Idempotency-Key" in request.headers
        policy = self.retries if may_retry else NO_RETRY
        started, attempt = self.clock(), 0
        while True:
            attempt += 1
            try:
                response = yield Attempt(request)
            except httpx.TransportError as exc:
                wait = policy.delay(attempt, self.clock() - started, None)
                if wait is None or not retriable(exc):
                    raise
            else:
                if response.status_code not in RETRY_STATUSES:
                    break
                wait = policy.delay(attempt, self.clock() - started, retry_after(response))
                if wait is None:
                    break
            yield Sleep(wait)
        raise_for(response)
        return response

    def _json(self, method: str, path: str, **request: Any) -> Plan[Any]:
        response = yield from self._send(Request(method, path, **request))
        return response.json()

    def _post(
        self, path: str, body: Any = None, *, idempotency_key: str | None = None, **request: Any
    ) -> Plan[Any]:
        """A POST with an Idempotency-Key (the caller's, or one made for this call while retries
        are on), so that trying it again replays the first answer instead of acting twice."""
        key = idempotency_key or (uuid.uuid4().hex if self.retries.enabled else None)
        headers = {"Idempotency-Key": key} if key else {}
        return (yield from self._json("POST", path, json=body, headers=headers, **request))

    def _dataset(self, name: str | None) -> Plan[str]:
        """The dataset a call acts in (see the module's docstring)."""
        if name:
            return name
        if self.default_dataset:
            return self.default_dataset
        if self._key_dataset is None:
            listed = yield from self._json("GET", "/v1/datasets")
            names = [d["name"] for d in listed["datasets"]]
            if len(names) != 1:
                raise DatasetNeeded(names)
            self._key_dataset = names[0]
        return self._key_dataset

    def _in_dataset(self, name: str | None, plan: Callable[[str], Plan[T]]) -> Plan[T]:
        """``plan`` in the call's dataset; the key's dataset looked up again when its name, as
        looked up before, answers 404 (renamed meanwhile) and the call sent again once."""
        chosen = yield from self._dataset(name)
        try:
            return (yield from plan(chosen))
        except ApiError as err:
            if name or self.default_dataset or err.status != 404:
                raise
            self._key_dataset = None
            again = yield from self._dataset(None)
            if again == chosen:
                raise
            return (yield from plan(again))

    def _one(self, cls: type[R], method: str, path: str, **request: Any) -> Plan[R]:
        return cls.from_dict((yield from self._json(method, path, **request)))

    # --- meta and datasets ------------------------------------------------------------------------

    @call("GET /v1/health")
    def health(self) -> Plan[Health]:
        """The API process answers (no key needed); ``ready`` once it has warmed up."""
        return (yield from self._one(Health, "GET", "/v1/health"))

    @call("GET /v1/datasets")
    def datasets(self) -> Plan[list[Dataset]]:
        """The datasets this key reaches, with their counts."""
        listed = yield from self._json("GET", "/v1/datasets")
        return [Dataset.from_dict(d) for d in listed["datasets"]]

    @call("GET /v1/datasets/{dataset}")
    def dataset(self, name: str | None = None) -> Plan[Dataset]:
        """One dataset with its counts (without a name: the key's one dataset)."""

        def get(chosen: str) -> Plan[Dataset]:
            return (yield from self._one(Dataset, "GET", f"/v1/datasets/{segment(chosen)}"))

        return (yield from self._in_dataset(name, get))

    @call("POST /v1/datasets")
    def create_dataset(
        self, name: str, *, idempotency_key: str | None = None
    ) -> Plan[DatasetCreated]:
        """A new dataset (a manage key of every dataset); 422 ``invalid_dataset_name``."""
        made = yield from self._post(
            "/v1/datasets", {"name": name}, idempotency_key=idempotency_key
        )
        return DatasetCreated.from_dict(made)

    @call("PATCH /v1/datasets/{dataset}")
    def rename_dataset(self, name: str, new_name: str) -> Plan[DatasetRenamed]:
        """A new name for the dataset: its documents, jobs and keys stay (a manage key of it)."""
        path = f"/v1/datasets/{segment(name)}"
        return (yield from self._one(DatasetRenamed, "PATCH", path, json={"name": new_name}))

    @call("DELETE /v1/datasets/{dataset}")
    def delete_dataset(self, name: str) -> Plan[DatasetDeleted]:
        """Delete the dataset and everything in it (its name is required: never implied). 409
        ``jobs_still_running``: closed already; call again."""
        return (yield from self._one(DatasetDeleted, "DELETE", f"/v1/datasets/{segment(name)}"))

    # --- uploads ----------------------------------------------------------------------------------

    def _upload(
        self,
        dataset: str | None,
        files: list[UploadFile],
        form: dict[str, str],
        idempotency_key: str | None,
    ) -> Plan[list[UploadedJob]]:
        with ExitStack() as opened:
            parts: list[tuple[str, Any]] = []
            for i, file in enumerate(files):
                if isinstance(file, tuple):
                    name, content = file
                elif isinstance(file, bytes):
                    name, content = (
                        ("upload.txt" if len(files) == 1 else f"upload-{i + 1}.txt"),
                        file,
                    )
                else:
                    path = Path(file)
                    name, content = path.name, opened.enter_context(path.open("rb"))
                parts.append(("file", (name, content, "application/octet-stream")))

            def send(chosen: str) -> Plan[list[UploadedJob]]:
                answer = yield from self._post(
                    f"/v1/datasets/{segment(chosen)}/documents",
                    files=parts,
                    data=form or None,
                    idempotency_key=idempotency_key,
                )
                return [UploadedJob.from_dict(j) for j in answer["jobs"]]

            return (yield from self._in_dataset(dataset, send))

    @call("POST /v1/datasets/{dataset}/documents")
    def upload(
        self,
        path_or_bytes: str | Path | bytes,
        *,
        dataset: str | None = None,
        filename: str | None = None,
        idempotency_key: str | None = None,
        external_id: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Plan[UploadedJob]:
        """Upload one file; its job (``job_id``, ``document_id``, ``existing``...). New bytes under
        a known ``external_id`` replace its live version once indexed; ``metadata``: the document's
        own fields (422 ``invalid_metadata`` names a bad key)."""
        file: UploadFile = path_or_bytes
        if isinstance(path_or_bytes, bytes):
            file = (filename or "upload.txt", path_or_bytes)
        elif filename is not None:
            file = (filename, Path(path_or_bytes).read_bytes())
        form = given(
            external_id=external_id,
            metadata=None if metadata is None else json.dumps(metadata),
        )
        jobs = yield from self._upload(dataset, [file], form, idempotency_key)
        return jobs[0]

    @call("POST /v1/datasets/{dataset}/documents")
    def upload_many(
        self,
        files: Iterable[str | Path | tuple[str, bytes | BinaryIO]],
        *,
        dataset: str | None = None,
        metadata: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Plan[list[UploadedJob]]:
        """Several files in one request (paths, or ``(name, bytes)``); one job each, in order.
        Every file is judged before any is stored: one refused file stores none of them."""
        form = given(metadata=None if metadata is None else json.dumps(metadata))
        return (yield from self._upload(dataset, list(files), form, idempotency_key))

    @call("POST /v1/datasets/{dataset}/documents")
    def upload_text(
        self,
        text: str,
        *,
        filename: str,
        dataset: str | None = None,
        external_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Plan[UploadedJob]:
        """A text as a document named ``filename`` (``.txt`` or ``.md``), sent as JSON."""
        body = {"filename": filename, "text": text}
        body |= given(external_id=external_id, metadata=metadata)

        def send(chosen: str) -> Plan[UploadedJob]:
            path = f"/v1/datasets/{segment(chosen)}/documents"
            answer = yield from self._post(path, body, idempotency_key=idempotency_key)
            return UploadedJob.from_dict(answer["jobs"][0])

        return (yield from self._in_dataset(dataset, send))

    # --- jobs -------------------------------------------------------------------------------------

    @call("GET /v1/jobs/{job_id}")
    def job(self, job_id: int) -> Plan[Job]:
        """A job's state: status, stage counts, why it waits, its error and fix."""
        return (yield from self._one(Job, "GET", f"/v1/jobs/{segment(job_id)}"))

    @call("GET /v1/jobs/{job_id}")
    def wait(self, job_id: int, *, timeout: float = 600.0) -> Plan[Job]:
        """Poll the job until it is final, as often as its ``Retry-After`` says (at most every 5 s;
        an unchanged job costs a 304). TimeoutError when it is not final in time."""
        deadline = self.clock() + timeout
        etag: str | None = None
        state: Job | None = None
        while True:
            headers = {"If-None-Match": etag} if etag else {}
            response = yield from self._send(
                Request("GET", f"/v1/jobs/{segment(job_id)}", headers=headers)
            )
            if response.status_code != 304:
                state, etag = Job.from_dict(response.json()), response.headers.get("ETag")
            if state is not None and (state.final or state.status in FINAL):
                return state
            left = deadline - self.clock()
            if left <= 0:
                raise TimeoutError(f"job {job_id} is not final after {timeout:.0f} s: {state}")
            yield Sleep(min(retry_after(response) or 1.0, left, 5.0))

    @call("GET /v1/jobs")
    def jobs(
        self,
        *,
        dataset: str | None = None,
        status: str | list[str] | None = None,
        where: dict[str, Any] | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> Plan[JobPage]:
        """One page of jobs, newest first, of ``dataset`` (else every dataset of the key), with a
        ``status`` (or one of several) and documents ``where`` allows; ``next_cursor`` goes on."""
        statuses = [status] if isinstance(status, str) else status
        params = given(
            dataset=dataset, status=statuses, where=where_text(where), limit=limit, cursor=cursor
        )
        return (yield from self._one(JobPage, "GET", "/v1/jobs", params=params))

    @items("GET /v1/jobs", Job)
    def iter_jobs(
        self,
        *,
        dataset: str | None = None,
        status: str | list[str] | None = None,
        where: dict[str, Any] | None = None,
        page_size: int = 100,
    ) -> Plan[None]:
        """Every job ``jobs`` would list, page after page (following ``next_cursor``)."""
        cursor: str | None = None
        while True:
            page = yield from Operations.jobs.plan(
                self, dataset=dataset, status=status, where=where, limit=page_size, cursor=cursor
            )
            for job in page.jobs:
                yield Emit(job)
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def _action(self, job_id: int, action: str, body: Any, key: str | None) -> Plan[ActionResult]:
        path = f"/v1/jobs/{segment(job_id)}/{action}"
        return ActionResult.from_dict((yield from self._post(path, body, idempotency_key=key)))

    @call("POST /v1/jobs/{job_id}/retry")
    def retry(self, job_id: int, *, idempotency_key: str | None = None) -> Plan[ActionResult]:
        """Run a failed or cancelled job again (409 ``action_refused`` says why not)."""
        return (yield from self._action(job_id, "retry", None, idempotency_key))

    @call("POST /v1/jobs/{job_id}/cancel")
    def cancel(self, job_id: int, *, idempotency_key: str | None = None) -> Plan[ActionResult]:
        """Cancel a job: a pending one never runs, a running one stops at its next batch."""
        return (yield from self._action(job_id, "cancel", None, idempotency_key))

    @call("POST /v1/jobs/{job_id}/unlock")
    def unlock(
        self, job_id: int, password: str, *, idempotency_key: str | None = None
    ) -> Plan[ActionResult]:
        """A password-protected PDF: the password opens it and the job runs again (the password
        is kept nowhere)."""
        return (yield from self._action(job_id, "unlock", {"password": password}, idempotency_key))

    # --- documents and chunks ---------------------------------------------------------------------

    @call("GET /v1/documents/{document_id}")
    def document(self, document_id: int) -> Plan[Document]:
        """A document with its jobs and, under an external id, how its versions stand."""
        return (yield from self._one(Document, "GET", f"/v1/documents/{segment(document_id)}"))

    @call("GET /v1/documents")
    def documents(self, *, external_id: str, dataset: str | None = None) -> Plan[list[Document]]:
        """The live document ``external_id`` names, in each dataset of the key (or ``dataset``)."""
        params = given(external_id=external_id, dataset=dataset)
        listed = yield from self._json("GET", "/v1/documents", params=params)
        return [Document.from_dict(d) for d in listed["documents"]]

    @call("GET /v1/datasets/{dataset}/documents")
    def list_documents(
        self,
        *,
        dataset: str | None = None,
        where: dict[str, Any] | None = None,
        offset: int = 0,
        limit: int = 50,
    ) -> Plan[DocumentPage]:
        """One page of a dataset's live documents, oldest first, those ``where`` allows."""
        params = given(offset=offset, limit=limit, where=where_text(where))

        def get(chosen: str) -> Plan[DocumentPage]:
            path = f"/v1/datasets/{segment(chosen)}/documents"
            return (yield from self._one(DocumentPage, "GET", path, params=params))

        return (yield from self._in_dataset(dataset, get))

    @items("GET /v1/datasets/{dataset}/documents", ListedDocument)
    def iter_documents(
        self,
        *,
        dataset: str | None = None,
        where: dict[str, Any] | None = None,
        page_size: int = 100,
    ) -> Plan[None]:
        """Every document ``list_documents`` would list, page after page."""
        chosen = yield from self._dataset(dataset)
        offset: int | None = 0
        while offset is not None:
            page = yield from Operations.list_documents.plan(
                self, dataset=chosen, where=where, offset=offset, limit=page_size
            )
            for document in page.documents:
                yield Emit(document)
            offset = page.next_offset

    @call("PATCH /v1/documents/{document_id}")
    def set_metadata(self, document_id: int, metadata: dict[str, Any]) -> Plan[Document]:
        """Replace a document's metadata (keys left out are removed); search sees it at once."""
        path = f"/v1/documents/{segment(document_id)}"
        return (yield from self._one(Document, "PATCH", path, json={"metadata": metadata}))

    @call("PATCH /v1/documents/{document_id}")
    def set_document_enabled(self, document_id: int, enabled: bool) -> Plan[Document]:
        """Switch a whole document off (its chunks kept, none answered by any search) or on."""
        path = f"/v1/documents/{segment(document_id)}"
        return (yield from self._one(Document, "PATCH", path, json={"enabled": enabled}))

    @call("DELETE /v1/documents/{document_id}")
    def delete_document(self, document_id: int) -> Plan[Deleted]:
        """Delete a document: its vectors, its jobs, its file when nothing else uses it."""
        return (yield from self._one(Deleted, "DELETE", f"/v1/documents/{segment(document_id)}"))

    @call("DELETE /v1/datasets/{dataset}/documents/by-external-id/{external_id}")
    def delete_by_external_id(
        self, external_id: str, *, dataset: str | None = None
    ) -> Plan[Deleted]:
        """Delete every version of ``external_id`` still there (ApiError 404 when there is none)."""

        def delete(chosen: str) -> Plan[Deleted]:
            path = f"/v1/datasets/{segment(chosen)}/documents/by-external-id/{segment(external_id)}"
            return (yield from self._one(Deleted, "DELETE", path))

        return (yield from self._in_dataset(dataset, delete))

    @call("PATCH /v1/chunks/{chunk_id}")
    def edit_chunk(self, chunk_id: str, text: str) -> Plan[ChunkState]:
        """Give a chunk new text: embedded and indexed again at once, kept across reindexes (the
        pipeline's own text again undoes the edit)."""
        path = f"/v1/chunks/{segment(chunk_id)}"
        return (yield from self._one(ChunkState, "PATCH", path, json={"text": text}))

    @call("GET /v1/documents/{document_id}/chunks")
    def chunks(self, document_id: int, *, offset: int = 0, limit: int = 50) -> Plan[ChunkPage]:
        """One page of the chunks search serves for the document, in order."""
        path = f"/v1/documents/{segment(document_id)}/chunks"
        params = {"offset": offset, "limit": limit}
        return (yield from self._one(ChunkPage, "GET", path, params=params))

    @items("GET /v1/documents/{document_id}/chunks", Chunk)
    def iter_chunks(self, document_id: int, *, page_size: int = 500) -> Plan[None]:
        """Every chunk of the document, page after page."""
        offset: int | None = 0
        while offset is not None:
            page = yield from Operations.chunks.plan(
                self, document_id, offset=offset, limit=page_size
            )
            for chunk in page.chunks:
                yield Emit(chunk)
            offset = page.next_offset

    @call("PATCH /v1/chunks/{chunk_id}")
    def set_chunk_enabled(self, chunk_id: str, enabled: bool) -> Plan[ChunkState]:
        """Switch a chunk off (kept in the index, left out of every search) or on again."""
        path = f"/v1/chunks/{segment(chunk_id)}"
        return (yield from self._one(ChunkState, "PATCH", path, json={"enabled": enabled}))

    # --- search -----------------------------------------------------------------------------------

    @call("POST /v1/datasets/{dataset}/search")
    def search(
        self,
        query: str,
        *,
        dataset: str | None = None,
        k: int = 5,
        mode: str = "hybrid",
        filename: str | None = None,
        pages: str | None = None,
        media_type: str | None = None,
        where: dict[str, Any] | None = None,
        min_score: float | None = None,
        max_chunks_per_document: int | None = None,
        dense_weight: float | None = None,
        rerank: bool | None = None,
        idempotency_key: str | None = None,
        **fields: Any,
    ) -> Plan[list[Hit]]:
        """The best ``k`` chunks (``mode``: hybrid, dense or lexical). ``where``: a metadata
        filter (``{"lang": "de", "year": {"$gte": 2020}}``, ``{"$or": [...]}``) applied before
        ranking; ``filename`` (contains), ``pages`` (``3-7``), ``media_type``; ``min_score``: only
        hits scoring at least this (0..1, one scale per mode); ``max_chunks_per_document``: at most
        this many hits of one document; ``dense_weight``: hybrid's dense share (0..1, the API's
        default 0.5); ``rerank``: the server's reranker rescores the best candidates (None: when
        one is set); ``fields``: any other field of the API's search body, sent as given."""
        body = {"query": query, "k": k, "mode": mode}
        body |= given(
            filename=filename,
            pages=pages,
            media_type=media_type,
            where=where,
            min_score=min_score,
            max_chunks_per_document=max_chunks_per_document,
            dense_weight=dense_weight,
            rerank=rerank,
            **fields,
        )

        def send(chosen: str) -> Plan[list[Hit]]:
            path = f"/v1/datasets/{segment(chosen)}/search"
            found = yield from self._post(path, body, idempotency_key=idempotency_key)
            return [Hit.from_dict(h) for h in found["hits"]]

        return (yield from self._in_dataset(dataset, send))

    # --- events -----------------------------------------------------------------------------------

    @items("GET /v1/events", Event)
    def events(
        self,
        *,
        dataset: str | None = None,
        last_event_id: int | None = None,
        seconds: float | None = None,
        resume: bool | Retry = True,
    ) -> Plan[None]:
        """The job events as they come, of ``dataset`` or every dataset of the key
        (``last_event_id``: after that one; 0: from the oldest kept; None: from now on), for
        ``seconds`` (None: until closed). ``resume``: a dropped stream, or one whose API stops,
        is opened again with ``Last-Event-ID`` of the last event seen, so nothing is missed or
        seen twice; the client's ``retry`` (or the Retry given) bounds each outage. StreamClosed
        when the API ends it for good (the key revoked, the datasets deleted)."""
        policy = (
            NO_RETRY if resume is False else resume if isinstance(resume, Retry) else self.retries
        )
        deadline = None if seconds is None else self.clock() + seconds
        last, failures, outage = last_event_id, 0, self.clock()
        while deadline is None or self.clock() < deadline:
            params = given(dataset=dataset)
            if deadline is not None:
                params["seconds"] = (
                    round(min(MAX_STREAM_SECONDS, deadline - self.clock()), 3) or 0.001
                )
            headers = {} if last is None else {"Last-Event-ID": str(last)}
            request = Request(
                "GET", "/v1/events", params=params, headers=headers, timeout=STREAM_TIMEOUT
            )
            closed: str | None = None
            try:
                response = yield Open(request)
                if response.status_code in RETRY_STATUSES:
                    wait = policy.delay(failures + 1, self.clock() - outage, retry_after(response))
                    if wait is None:
                        raise_for(response)
                    failures += 1
                    yield Sleep(wait or 0.0)
                    continue
                raise_for(response)
                failures = 0
                parser = EventParser()
                while (line := (yield ReadLine())) is not None:
                    got = parser.feed(line)
                    if isinstance(got, Event):
                        last = got.id
                        yield Emit(got)
                    elif isinstance(got, str) and got.startswith(CLOSED):
                        closed = got[len(CLOSED) :]
                yield Close()
            except httpx.TransportError:
                yield Close()
                if failures == 0:
                    outage = self.clock()
                failures += 1
                wait = policy.delay(failures, self.clock() - outage, None)
                if wait is None:
                    raise
                yield Sleep(wait)
                continue
            if closed is not None and closed != API_STOPPING:
                raise StreamClosed(closed)
            if not policy.enabled or (deadline is not None and self.clock() >= deadline):
                return
            outage = self.clock()
            yield Sleep(policy.backoff(1))  # a pause before the stream is opened again

    # --- audit ------------------------------------------------------------------------------------

    @call("GET /v1/audit")
    def audit_page(
        self,
        *,
        since: str | None = None,
        actor: str | None = None,
        action: str | None = None,
        dataset: str | None = None,
        outcome: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> Plan[AuditPage]:
        """One page of the audit log, newest first (a manage key of every dataset). ``since``:
        2h, 7d or an ISO time; ``action``: ``job.retry`` or a family (``job``); ``outcome``:
        done or refused."""
        params = given(
            since=since,
            actor=actor,
            action=action,
            dataset=dataset,
            outcome=outcome,
            limit=limit,
            cursor=cursor,
        )
        return (yield from self._one(AuditPage, "GET", "/v1/audit", params=params))

    @items("GET /v1/audit", AuditEntry)
    def iter_audit(
        self,
        *,
        since: str | None = None,
        actor: str | None = None,
        action: str | None = None,
        dataset: str | None = None,
        outcome: str | None = None,
        page_size: int = 500,
    ) -> Plan[None]:
        """Every audit row ``audit_page`` would list with these filters, following the cursor."""
        filters = {"since": since, "actor": actor, "action": action, "dataset": dataset}
        cursor: str | None = None
        while True:
            page = yield from Operations.audit_page.plan(
                self, **filters, outcome=outcome, limit=page_size, cursor=cursor
            )
            for entry in page.entries:
                yield Emit(entry)
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    @call("GET /v1/audit")
    def audit(
        self,
        *,
        limit: int = 500,
        since: str | None = None,
        actor: str | None = None,
        action: str | None = None,
        dataset: str | None = None,
        outcome: str | None = None,
    ) -> Plan[list[AuditEntry]]:
        """Audit rows, newest first, at most ``limit`` (following the cursor), with the filters
        of ``audit_page``."""
        filters = {"since": since, "actor": actor, "action": action, "dataset": dataset}
        found: list[AuditEntry] = []
        cursor: str | None = None
        while len(found) < limit:
            page = yield from Operations.audit_page.plan(
                self, **filters, outcome=outcome, limit=min(500, limit - len(found)), cursor=cursor
            )
            found += page.entries
            if not page.next_cursor:
                break
            cursor = page.next_cursor
        return found

    # --- sources ----------------------------------------------------------------------------------

    @call("GET /v1/sources")
    def sources(self) -> Plan[list[Source]]:
        """The sources of the key's datasets (a manage key)."""
        listed = yield from self._json("GET", "/v1/sources")
        return [Source.from_dict(s) for s in listed["sources"]]

    @call("GET /v1/sources/{name}")
    def source(self, name: str) -> Plan[Source]:
        """One source: where it reads, how often, its last run and whether it is confirmed."""
        return (yield from self._one(Source, "GET", f"/v1/sources/{segment(name)}"))

    @call("POST /v1/sources")
    def add_source(
        self,
        name: str,
        *,
        s3: str,
        dataset: str | None = None,
        include: list[str] | None = None,
        exclude: list[str] | None = None,
        every: str | None = None,
        idempotency_key: str | None = None,
    ) -> Plan[Source]:
        """Follow an S3 prefix (``s3://bucket/prefix/``, one the server allows) into a dataset,
        every ``every`` (``15m``); its first sync waits for ``sync_source(name, confirm=True)``.
        A folder source is added on the server's host (``sluice sources add``)."""
        chosen = yield from self._dataset(dataset)
        body = {"name": name, "dataset": chosen, "s3": s3}
        body |= given(include=include, exclude=exclude, every=every)
        made = yield from self._post("/v1/sources", body, idempotency_key=idempotency_key)
        return Source.from_dict(made)

    @call("POST /v1/sources/{name}/sync")
    def sync_source(
        self,
        name: str,
        *,
        preview: bool = False,
        confirm: bool = False,
        idempotency_key: str | None = None,
    ) -> Plan[SyncResult]:
        """Sync now, or ``preview`` only (the plan's counts and cost, nothing done). ``confirm``
        runs a new source's first sync and removals the guard holds; without it such a sync
        answers ``status`` ``unconfirmed`` (or ``held``) with the plan. 409 ``sync_running``."""
        path = f"/v1/sources/{segment(name)}/sync"
        body = {"preview": preview, "confirm": confirm}
        return SyncResult.from_dict(
            (yield from self._post(path, body, idempotency_key=idempotency_key))
        )

    @call("DELETE /v1/sources/{name}")
    def remove_source(self, name: str, *, keep_documents: bool = False) -> Plan[SourceRemoved]:
        """Forget a source: the documents it made are deleted (unless ``keep_documents``)."""
        path = f"/v1/sources/{segment(name)}"
        params = {"keep_documents": "true"} if keep_documents else None
        return (yield from self._one(SourceRemoved, "DELETE", path, params=params))
