"""Chroma over HTTP, in every process (an embedded client serves stale results across processes).

Embeddings are always supplied: Chroma's default embedding function would try to download a model.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:  # numpy is imported where vectors are handled, not by a lexical search
    import numpy as np

log = logging.getLogger(__name__)

PAGE = 1000
HTTP_TIMEOUT = (
    120.0  # seconds for one request to the Chroma server (an add of 2,000 vectors takes < 1 s)
)


# The graph of a new collection. With Chroma's defaults (16 neighbours, ef_construction 100) a
# fresh collection of 4,000 clustered 384-d vectors already had chunks its own vector did not find
# (measured with 1.5.9); with these, none. An existing collection keeps its graph until a rebuild
# (pipeline.reconcile.recall) makes it again. ef_search, the depth of each query's walk, is raised
# on an existing collection when a process opens it (``collection``): at 100,000 chunks recall@10
# against exact search was 0.950 at 100, 0.985 at 200 and 0.9975 at 400, a query of 10 costing
# 4.7, 5.3 and 7.6 ms (BENCHMARKS.md). Chroma 1.5.9 applies a changed ef_search when its server
# next loads the collection (a restart), not to a graph it holds already.
HNSW: dict[str, Any] = {
    "space": "cosine",
    "max_neighbors": 32,
    "ef_construction": 200,
    "ef_search": 400,
}


class ChromaAuthError(PermissionError):
    """The Chroma server refused the token (or asked for one): check SLUICE_CHROMA_TOKEN."""


class ChromaAnswered(RuntimeError):
    """Chroma, or the gate in front of it, answered a read with an HTTP error ``status``."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


# Statuses of a store that is down or on its way (the gate's 502 for a broken upstream connection,
# a proxy's 503 or 504), not of a request it refused.
UNAVAILABLE_STATUSES = (502, 503, 504)
# httpx's transport failures by name (httpx is imported only by whoever met one): how each reads.
_HTTPX_FAILURES = {
    "ConnectError": "connection refused",
    "ConnectTimeout": "no answer in time",
    "ReadTimeout": "no answer in time",
    "WriteTimeout": "no answer in time",
    "PoolTimeout": "no answer in time",
    "RemoteProtocolError": "connection dropped",
    "ReadError": "connection dropped",
    "WriteError": "connection dropped",
}


def read_failure(exc: BaseException) -> str | None:
    """Why a read of the store failed on the way there or back, in a few words (a refused or
    dropped connection, no answer in time, a 502, 503 or 504), or None for any other failure: a
    read the store refused, or a bug, which stays what it is. Follows the exception's causes:
    chromadb raises a bare ``Exception`` of the answer's text (empty for the gate's 502) from the
    ``httpx.HTTPStatusError`` that knows the status."""
    import http.client

    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        response = getattr(link, "response", None)
        status = getattr(link, "status", None) if isinstance(link, ChromaAnswered) else None
        if status is None and type(link).__name__ == "HTTPStatusError" and response is not None:
            status = getattr(response, "status_code", None)
        if status is not None:
            return f"HTTP {status}" if status in UNAVAILABLE_STATUSES else None
        if isinstance(link, ChromaAuthError):
            return None
        name = type(link).__name__
        if name in _HTTPX_FAILURES:
            return _HTTPX_FAILURES[name]
        if isinstance(link, TimeoutError):  # socket.timeout too
            return "no answer in time"
        if isinstance(link, ConnectionRefusedError):
            return "connection refused"
        if isinstance(link, (ConnectionError, http.client.HTTPException)):
            return "connection dropped"  # reset, aborted, closed without an answer
        suppressed = link.__cause__ is not None or link.__suppress_context__
        link = link.__cause__ if suppressed else link.__context__
    return None


@dataclass(frozen=True)
class Hit:
    id: str
    score: float
    text: str
    metadata: dict[str, Any]


class QueryHits(list):
    """The hits of one query, and how many of its answers were deleted while it ran (left out)."""

    vanished: int = 0


def chunk_id(sha256: str, pipeline_version: str, position: int) -> str:
    """Stable id of a chunk: the same document, pipeline version and position give the same id."""
    return f"{chunk_prefix(sha256, pipeline_version)}{position:06d}"


def chunk_prefix(sha256: str, pipeline_version: str) -> str:
    """What every chunk id of one document under one pipeline version starts with."""
    return f"{sha256[:32]}-{pipeline_version}-"


def split_chunk_id(cid: str) -> tuple[str, int] | None:
    """(prefix, position) of a chunk id, or None for an id no Sluice job makes."""
    prefix, sep, pos = cid.rpartition("-")
    if not sep or not pos.isdigit() or f"{int(pos):06d}" != pos:
        return None
    return prefix + "-", int(pos)


META_PREFIX = "meta_"  # a chunk's copy of its document's metadata key: meta_<key>


def metadata_fields(metadata: dict[str, Any] | None) -> dict[str, Any]:
    """The copy of a document's metadata each of its chunks carries: ``meta_<key>``; a list as a
    list (Chroma filters those with ``$contains``), an empty list left out (Chroma refuses one)."""
    return {
        f"{META_PREFIX}{k}": (list(v) if isinstance(v, list) else v)
        for k, v in (metadata or {}).items()
        if not (isinstance(v, list) and not v)
    }


def stored_metadata_fields(chunk_metadata: dict[str, Any]) -> dict[str, Any]:
    """The ``meta_`` fields of one chunk's stored metadata (what ``metadata_fields`` wrote)."""
    return {k: v for k, v in chunk_metadata.items() if k.startswith(META_PREFIX)}


@dataclass(eq=False)
class Rows:
    """One caller's rows for an add, and how it went."""

    ids: list[str]
    embeddings: np.ndarray
    documents: list[str]
    metadatas: list[dict[str, Any]]
    wake: threading.Event = field(default_factory=threading.Event)
    lead: bool = False
    done: bool = False
    error: BaseException | None = None


class GroupCommit:
    """Group commit for the adds of one collection: rows that several threads add at the same
    moment travel in one request, and each caller returns once its own rows are written.

    Chroma's server pays for a request about what it pays for 25 vectors (BENCHMARKS.md). A caller
    finding no write under way writes its rows at once (a lone caller waits for nobody); callers
    arriving meanwhile queue, and when the write ends the first of them writes everything queued.
    When a combined write fails, each caller's rows are tried alone, so every caller gets its own
    answer.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: list[Rows] = []
        self._busy = False

    def submit(self, rows: Rows, write: Callable[[list[Rows]], None]) -> None:
        with self._lock:
            self._queue.append(rows)
            if not self._busy:
                self._busy = rows.lead = True
        if not rows.lead:
            rows.wake.wait()
        if not rows.done:  # this caller leads: it writes everything queued, its own rows included
            with self._lock:
                batch, self._queue = self._queue, []
            written = False
            try:
                self._write(batch, write)
                written = True
            finally:
                for other in batch:
                    if not written and other.error is None:
                        other.error = RuntimeError("the combined index write was interrupted")
                    other.done = True
                    other.wake.set()
                with self._lock:
                    if self._queue:
                        self._queue[0].lead = True
                        self._queue[0].wake.set()
                    else:
                        self._busy = False
        if rows.error is not None:
            raise rows.error

    @staticmethod
    def _write(batch: list[Rows], write: Callable[[list[Rows]], None]) -> None:
        try:
            write(batch)
        except Exception as exc:
            if len(batch) == 1:
                batch[0].error = exc
                return
            for rows in batch:
                try:
                    write([rows])
                except Exception as own:
                    rows.error = own


_NONE = object()  # no such collection (a read or delete that may not make it)


def _unknown_collection(exc: BaseException) -> bool:
    """chromadb's NotFoundError for a collection id the server does not know (any more)."""
    return type(exc).__name__ == "NotFoundError" or (
        "collection" in str(exc).lower() and "does not exist" in str(exc).lower()
    )


def _deepen_search(coll: Any) -> None:
    """Raise an existing collection's ``ef_search`` to ``HNSW``'s (a collection made before it was
    raised): kept by Chroma, in force once its server next loads the collection. A store that
    refuses leaves the collection as it was (searches still answer, less completely)."""
    hnsw = (getattr(coll, "configuration", None) or {}).get("hnsw") or {}
    if not hnsw or int(hnsw.get("ef_search") or 0) >= HNSW["ef_search"]:
        return
    try:
        coll.modify(configuration={"hnsw": {"ef_search": HNSW["ef_search"]}})
    except Exception as exc:
        log.warning("collection %s keeps ef_search %s: %s", coll.name, hnsw.get("ef_search"), exc)


class VectorStore:
    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        auth_header: str = "Authorization",
        timeout: float = HTTP_TIMEOUT,
    ) -> None:
        self.url = url
        self._token = token
        self._auth_header = auth_header
        self._timeout = timeout
        self._client = None
        self._collections: dict[str, Any] = {}
        self._groups: dict[str, GroupCommit] = {}
        self._lock = threading.Lock()
        self.vanished_hits = (
            0  # query results deleted while a query ran (left out), in all queries so far
        )

    @classmethod
    def from_settings(cls, s: Any) -> VectorStore:
        """The store ``SLUICE_CHROMA_URL`` names, with its token and header (``Settings``)."""
        token = s.chroma_token.get_secret_value() if s.chroma_token else None
        return cls(s.chroma_url, token=token, auth_header=s.chroma_auth_header)

    def _headers(self) -> dict[str, str]:
        if not self._token:
            return {}
        if self._auth_header.lower() != "authorization":
            return {self._auth_header: self._token}
        return {self._auth_header: f"Bearer {self._token}"}

    @property
    def client(self):
        if self._client is None:
            import chromadb
            import httpx
            from chromadb.config import Settings as ChromaSettings

            parts = urlsplit(self.url)
            headers = self._headers()
            # chromadb's own HTTP session has no timeout, and creating the client already talks to
            # the server: a server that accepts but never answers would hang the worker (its
            # heartbeat thread beating on). Ask once with a timeout, then bound the session too.
            timeout = httpx.Timeout(self._timeout, connect=min(10.0, self._timeout))
            port = parts.port or (443 if parts.scheme == "https" else 80)
            host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname
            probe = httpx.get(
                f"{parts.scheme}://{host}:{port}/api/v2/heartbeat", headers=headers, timeout=timeout
            )
            if probe.status_code in (401, 403):
                raise ChromaAuthError(
                    f"the Chroma server at {self.url} refused the credentials "
                    f"(HTTP {probe.status_code})"
                )
            client = chromadb.HttpClient(
                host=parts.hostname,
                port=port,
                ssl=parts.scheme == "https",
                headers=headers or None,
                settings=ChromaSettings(anonymized_telemetry=False),
            )
            session = getattr(getattr(client, "_server", None), "_session", None)
            if isinstance(session, httpx.Client):
                session.timeout = timeout
            self._client = client
        return self._client

    def heartbeat(self) -> int:
        return self.client.heartbeat()

    def collection(self, name: str, *, create: bool = True):
        """This process's handle of collection ``name``. Only a write makes the collection
        (``create``); a read or delete asks for an existing one and raises chromadb's
        NotFoundError when there is none, so that a late read or delete of a dataset whose
        collection was dropped (a dataset delete, a reindex's swap) never makes it again."""
        with self._lock:
            coll = self._collections.get(name)
            if coll is None:
                if create:
                    coll = self.client.get_or_create_collection(
                        name,
                        embedding_function=None,
                        metadata={"hnsw:space": "cosine"},
                        configuration={"hnsw": dict(HNSW)},  # a new collection only
                    )
                else:
                    coll = self.client.get_collection(name, embedding_function=None)
                _deepen_search(coll)
                self._collections[name] = coll
            return coll

    def _on(
        self, name: str, call: Callable[[Any], Any], *, missing: Callable[[], Any] | None = None
    ) -> Any:
        """``call(collection)``; when the server no longer knows the handle this process holds (the
        collection was dropped and made again behind its back), look it up again and try once
        more. With ``missing`` (reads and deletes) the collection is never made: when there is
        none, ``missing()`` is the answer."""

        def answer(coll: Any) -> Any:
            if coll is _NONE:  # only with ``missing``: without it the lookup raised
                assert missing is not None
                return missing()
            return call(coll)

        def handle() -> Any:
            try:
                return self.collection(name, create=missing is None)
            except Exception as exc:
                if missing is None or not _unknown_collection(exc):
                    raise
                return _NONE

        coll = handle()
        if coll is _NONE:
            return answer(coll)
        try:
            return call(coll)
        except Exception as exc:
            if not _unknown_collection(exc):
                raise
            with self._lock:
                if self._collections.get(name) is coll:
                    del self._collections[name]
        return answer(handle())

    def add(
        self,
        name: str,
        *,
        ids: Sequence[str],
        embeddings: np.ndarray,
        documents: Sequence[str],
        metadatas: Sequence[dict[str, Any]],
    ) -> None:
        """Add new rows; returns once they are written. Adds that threads of this process make to
        the same collection at the same moment travel in one request (see ``GroupCommit``)."""
        if not ids:
            return
        import numpy as np

        rows = Rows(
            list(ids), np.asarray(embeddings, dtype=np.float32), list(documents), list(metadatas)
        )
        with self._lock:
            group = self._groups.setdefault(name, GroupCommit())
        group.submit(
            rows,
            lambda batch: self._on(
                name,
                lambda coll: coll.add(
                    ids=[i for r in batch for i in r.ids],
                    embeddings=np.concatenate([r.embeddings for r in batch]),
                    documents=[d for r in batch for d in r.documents],
                    metadatas=[m for r in batch for m in r.metadatas],
                ),
            ),
        )

    def ids_where(self, name: str, where: dict[str, Any]) -> list[str]:
        return [i for page in self.iter_pages(name, where=where, include=[]) for i in page["ids"]]

    def iter_pages(
        self,
        name: str,
        *,
        where: dict[str, Any] | None = None,
        include: list[str] | None = None,
        page_size: int = PAGE,
    ) -> Iterator[dict[str, Any]]:
        """Walk a collection page by page (bounded memory for audits of any size)."""
        offset = 0
        while True:

            def page_at(coll: Any, offset: int = offset) -> Any:
                return coll.get(
                    where=where,
                    limit=page_size,
                    offset=offset,
                    include=include if include is not None else ["metadatas"],
                )

            page = self._on(name, page_at, missing=lambda: {"ids": []})
            if not page["ids"]:
                return
            yield page
            if len(page["ids"]) < page_size:
                return
            offset += page_size

    def window(self, name: str, *, offset: int, limit: int) -> list[str]:
        """The ids of ``limit`` chunks from ``offset`` in the collection's own order."""
        got = self._on(
            name,
            lambda coll: coll.get(limit=limit, offset=offset, include=[]),
            missing=lambda: {"ids": []},
        )
        return list(got["ids"])

    def get(
        self, name: str, ids: Sequence[str], include: list[str] | None = None
    ) -> dict[str, Any]:
        include = ["metadatas"] if include is None else include  # [] asks for the ids alone
        if self._client is None:  # a search's few chunks: over HTTP, as count and query
            got = self._read(name, "get", {"ids": list(ids), "include": include})
            return got or {"ids": [], **{key: [] for key in include}}
        return self._on(
            name,
            lambda coll: coll.get(ids=list(ids), include=include),
            missing=lambda: {"ids": [], **{key: [] for key in include}},
        )

    def delete(
        self, name: str, *, ids: Sequence[str] | None = None, where: dict[str, Any] | None = None
    ) -> None:
        if ids is not None:
            ids = list(ids)
            for start in range(0, len(ids), PAGE):

                def delete_part(coll: Any, part: list[str] = ids[start : start + PAGE]) -> Any:
                    return coll.delete(ids=part)

                self._on(name, delete_part, missing=lambda: None)
        elif where is not None:
            self._on(name, lambda coll: coll.delete(where=where), missing=lambda: None)

    def set_metadata_fields(self, name: str, ids: Sequence[str], fields: dict[str, Any]) -> int:
        """Make the ``meta_`` fields of these chunks exactly ``fields`` (their other metadata as it
        is): the vectors are not written again. Returns how many chunks were there."""
        got = self.get(name, ids)
        found = list(got.get("ids") or [])
        if not found:
            return 0
        metas = []
        for meta in got.get("metadatas") or []:
            # Chroma's update merges keys; a key set to None is removed
            stale = {k: None for k in stored_metadata_fields(meta or {}) if k not in fields}
            metas.append({**stale, **fields})
        self._on(name, lambda coll: coll.update(ids=found, metadatas=metas), missing=lambda: None)
        return len(found)

    def _read(self, name: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """A read of collection ``name`` over Chroma's HTTP API itself (``path``: ``count``,
        ``query`` or ``get``), None when there is no such collection. A process that has not made
        the chromadb client yet reads this way: importing chromadb and making its client cost a
        cold ``sluice search`` most of its second; the answers are the same JSON the client
        returns."""
        import http.client
        import json

        parts = urlsplit(self.url)
        base = "/api/v2/tenants/default_tenant/databases/default_database/collections"
        # http.client rather than httpx: importing httpx and making its client cost a cold search
        # a quarter of a second. https trusts what httpx trusts: SSL_CERT_FILE or SSL_CERT_DIR when
        # set (a private CA, as in a deployment behind a TLS proxy), certifi's bundle otherwise.
        conn: http.client.HTTPConnection
        connect = min(10.0, self._timeout)
        if parts.scheme == "https":
            import os
            import ssl

            cafile, capath = os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR")
            if not (cafile or capath):
                import certifi

                cafile = certifi.where()
            context = ssl.create_default_context(cafile=cafile, capath=capath)
            conn = http.client.HTTPSConnection(
                parts.hostname or "", parts.port, timeout=connect, context=context
            )
        else:
            conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=connect)

        def call(method: str, url: str, payload: Any = None) -> tuple[int, Any]:
            headers = {**self._headers(), "Accept": "application/json"}
            data = None
            if payload is not None:
                data = json.dumps(payload).encode()
                headers["Content-Type"] = "application/json"
            conn.request(method, url, body=data, headers=headers)
            answer = conn.getresponse()
            raw = answer.read()
            if answer.status in (401, 403):
                raise ChromaAuthError(
                    f"the Chroma server at {self.url} refused the credentials "
                    f"(HTTP {answer.status})"
                )
            if answer.status == 404:
                return 404, None
            if answer.status >= 400:
                raise ChromaAnswered(
                    f"the Chroma server at {self.url} answered HTTP {answer.status} to {method} "
                    f"{url}: {raw[:300].decode(errors='replace')}",
                    answer.status,
                )
            return answer.status, json.loads(raw)

        try:
            conn.connect()
            if conn.sock is not None:
                conn.sock.settimeout(self._timeout)
            status, found = call("GET", f"{base}/{name}")
            if status == 404:
                return None
            status, got = call(
                "GET" if body is None else "POST", f"{base}/{found['id']}/{path}", body
            )
            return None if status == 404 else got  # 404: dropped in between
        finally:
            conn.close()

    def weaker_graph(self, name: str) -> bool:
        """Whether the collection's graph was built with fewer neighbours or a shallower
        construction than ``HNSW``: a rebuild would make a better one. A collection that tells no
        graph settings (another index kind) is not: a rebuild would make the same again."""
        coll = self._on(name, lambda coll: coll, missing=lambda: None)
        hnsw = (getattr(coll, "configuration", None) or {}).get("hnsw") or {}
        if not hnsw:
            log.info("collection %s tells no HNSW settings: not rebuilt for a hard chunk", name)
            return False
        return any(
            int(hnsw.get(key) or 0) < HNSW[key] for key in ("max_neighbors", "ef_construction")
        )

    def count(self, name: str) -> int:
        if self._client is None:
            got = self._read(name, "count")
            return int(got or 0)
        return self._on(name, lambda coll: coll.count(), missing=lambda: 0)

    def query(
        self, name: str, embedding: np.ndarray, *, n: int, where: dict[str, Any] | None = None
    ) -> QueryHits:
        if n <= 0:
            return QueryHits()
        import numpy as np

        include = ["documents", "metadatas", "distances"]
        if self._client is None:
            vector = [float(x) for x in np.asarray(embedding, dtype=np.float32)]
            body = {"query_embeddings": [vector], "n_results": n, "include": include}
            if where is not None:
                body["where"] = where
            res = self._read(name, "query", body) or {
                "ids": [[]],
                "metadatas": [[]],
                "documents": [[]],
                "distances": [[]],
            }
        else:
            res = self._on(
                name,
                lambda coll: coll.query(
                    query_embeddings=[np.asarray(embedding, dtype=np.float32)],
                    n_results=n,
                    where=where,
                    include=include,
                ),
                missing=lambda: {key: [[]] for key in ("ids", *include)},
            )
        hits = QueryHits()
        for i, cid in enumerate(res["ids"][0]):
            meta = res["metadatas"][0][i]
            if meta is None:
                # Chroma finds the id in its vector index, then reads the record: a delete landing
                # in between leaves an id without metadata or text. That chunk is gone; leave it
                # out.
                hits.vanished += 1
                with self._lock:
                    self.vanished_hits += 1
                continue
            hits.append(
                Hit(
                    id=cid,
                    score=1.0 - float(res["distances"][0][i]),
                    text=res["documents"][0][i] or "",
                    metadata=dict(meta),
                )
            )
        return hits

    def nearest(self, name: str, embedding: np.ndarray, *, n: int) -> list[tuple[str, float]]:
        """The ``n`` nearest chunks as (id, cosine similarity), best first, no filter, nothing else
        read: Chroma reads a hit's metadata and text record by record (at 100,000 chunks 400 hits
        with them cost 38 ms, their ids and distances 7 ms), so a deep query screened by id reads
        only the few it keeps (``get``)."""
        if n <= 0:
            return []
        import numpy as np

        vector = [float(x) for x in np.asarray(embedding, dtype=np.float32)]
        body = {"query_embeddings": [vector], "n_results": n, "include": ["distances"]}
        if self._client is None:
            res = self._read(name, "query", body) or {"ids": [[]], "distances": [[]]}
        else:
            res = self._on(
                name,
                lambda coll: coll.query(**body),
                missing=lambda: {"ids": [[]], "distances": [[]]},
            )
        return [
            (cid, 1.0 - float(d)) for cid, d in zip(res["ids"][0], res["distances"][0], strict=True)
        ]

    def vectors_where(
        self, name: str, where: dict[str, Any], *, limit: int
    ) -> tuple[list[str], np.ndarray]:
        """The ids and stored vectors of at most ``limit`` chunks that ``where`` selects (one
        request: for exact search over a few documents' chunks)."""
        import numpy as np

        body = {"where": where, "limit": limit, "include": ["embeddings"]}
        if self._client is None:
            got = self._read(name, "get", body) or {"ids": [], "embeddings": []}
        else:
            got = self._on(
                name,
                lambda coll: coll.get(**body),
                missing=lambda: {"ids": [], "embeddings": []},
            )
        ids = list(got.get("ids") or [])
        if not ids:  # an empty array has no row length to reshape by
            return ids, np.zeros((0, 0), dtype=np.float32)
        return ids, np.asarray(got.get("embeddings"), dtype=np.float32).reshape(len(ids), -1)

    def query_ids(
        self, name: str, embeddings: np.ndarray, *, n: int
    ) -> list[list[tuple[str, float]]]:
        """The ``n`` nearest chunks of each embedding as (id, cosine distance), one request, no
        filter."""
        if not len(embeddings) or n <= 0:
            return [[] for _ in range(len(embeddings))]
        import numpy as np

        res = self._on(
            name,
            lambda coll: coll.query(
                query_embeddings=np.asarray(embeddings, dtype=np.float32),
                n_results=n,
                include=["distances"],
            ),
            missing=lambda: {key: [[] for _ in embeddings] for key in ("ids", "distances")},
        )
        return [
            list(zip(ids, map(float, dists), strict=True))
            for ids, dists in zip(res["ids"], res["distances"], strict=True)
        ]

    def drop_collection(self, name: str) -> None:
        with self._lock:
            self._collections.pop(name, None)
        try:
            self.client.delete_collection(name)
        except Exception:
            pass
