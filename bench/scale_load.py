"""Grow one dataset fast for ``bench.scale``: documents, succeeded jobs and their events straight
into the job database, their chunks straight into Chroma (hash-embedded texts, the metadata the
pipeline writes) and into the lexical index, as ``tests/support/big_store.py`` does for the
reconcile walk, but with real texts and vectors, so that search and the recall audit see an index
like the pipeline's.

Fast because nothing is computed twice: a chunk is ``WORDS`` words of a small vocabulary, so its
hash-embedder vector is its word counts times each word's own vector, and its index tokens are its
words (both checked against ``HashEmbedder.encode`` and ``lexical.index_tokens`` on the first
chunks of every batch); rows go to the job database and the lexical index in one transaction per
``DOCS_PER_COMMIT`` documents, and to Chroma in adds of ``VECTOR_BATCH`` (on a thread of its own:
Chroma's server, another process, builds its graph meanwhile).

One document in ten carries ``lang: de`` (the filtered searches select a tenth of the documents);
one chunk in 97 holds a reference code (``QZ-...``), the rare tokens the searches type.
"""

from __future__ import annotations

import hashlib
import random
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
from sqlalchemy import insert, text
from sqlmodel import Session, select

from sluice.storage import lexical
from sluice.storage.models import Dataset, Document, Job, JobEvent, JobStatus, Stage, utcnow
from sluice.storage.vectors import chunk_id, metadata_fields

PER_DOC = 100  # chunks per bulk-loaded document
WORDS = 110  # words per chunk (about 700 characters: one chunk of the pipeline's 800)
DOCS_PER_COMMIT = 50
VECTOR_BATCH = 5000  # chunks per add to Chroma (its server takes at most 5,461)
CHECKED = 3  # chunks of each batch whose vector and tokens are compared with the real functions


def vocabulary() -> list[str]:
    """Invented words (many) and common ones (weighted), as bench.retrieval's latency corpus."""
    words = [
        f"{a}{b}"
        for a in ("ka", "lo", "mi", "ne", "su", "ta", "ve", "ro", "di", "pa", "gu", "ze")
        for b in ("ran", "tel", "mos", "bik", "fu", "dor", "sal", "win", "pex", "lam")
    ] * 3
    common = ("the", "and", "of", "report", "station", "water", "track", "budget", "annual")
    return words + list(common) * 20


@dataclass
class Loader:
    """The dataset being grown and what has been put into it so far."""

    ctx: object
    dataset: str
    seed: int = 17
    documents: int = 0
    chunks: int = 0
    codes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.words = vocabulary()
        self._np = np.random.default_rng(self.seed)
        # Each distinct word once, its vector as the hash embedder makes it, and which distinct
        # word each entry of ``words`` is (the list repeats words to weight them).
        self._distinct = sorted(set(self.words))
        where = {w: i for i, w in enumerate(self._distinct)}
        self._slot = np.array([where[w] for w in self.words])
        self._unit = self._word_vectors(self._distinct)
        # One add to Chroma in flight while the next documents' rows are written (its server
        # is another process: the two overlap).
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="scale-add")
        self._pending: Future | None = None
        self._events: list[dict] | None = None

    def _word_vectors(self, words: list[str]) -> np.ndarray:
        """What one occurrence of each word adds to a hash-embedder vector before normalising."""
        embedder = self.ctx.embedder
        dim = embedder.dim
        out = np.zeros((len(words), dim), dtype=np.float32)
        for row, word in enumerate(words):
            h = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
            out[row, h % dim] = 1.0 if (h >> 63) else -1.0
        return out

    def text(self, n: int = WORDS) -> str:
        return " ".join(self.rng.choices(self.words, k=n))

    def grow(self, chunks: int) -> int:
        """Add documents of ``PER_DOC`` chunks until ``chunks`` have been bulk-loaded in all;
        returns how many were added now."""
        ctx = self.ctx
        with Session(ctx.engine) as session:
            ds = session.exec(select(Dataset).where(Dataset.name == self.dataset)).one()
            dataset_id, collection = ds.id, ds.collection
        added = 0
        pending: tuple[list, list, np.ndarray, list] = ([], [], np.zeros((0, 1)), [])
        while self.chunks < chunks:
            batch = min(DOCS_PER_COMMIT, -(-(chunks - self.chunks) // PER_DOC))
            ids, texts, vectors, metas = self._batch(dataset_id, batch)
            pending = (
                pending[0] + ids,
                pending[1] + texts,
                np.concatenate([pending[2], vectors]) if pending[0] else vectors,
                pending[3] + metas,
            )
            while len(pending[0]) >= VECTOR_BATCH:
                self._add(collection, *(part[:VECTOR_BATCH] for part in pending))
                pending = tuple(part[VECTOR_BATCH:] for part in pending)  # type: ignore[assignment]
            added += batch * PER_DOC
            self.chunks += batch * PER_DOC
        if pending[0]:
            self._add(collection, *pending)
        self._wait()
        return added

    def _wait(self) -> None:
        if self._pending is not None:
            self._pending.result()
            self._pending = None

    def _event_pattern(self, session: Session, dataset_id: int) -> list[dict]:
        """The events a real job of this dataset left (its first upload's), as a pattern for the
        bulk-loaded jobs'; empty when there is none."""
        if self._events is None:
            first = session.exec(
                select(Job.id).where(Job.dataset_id == dataset_id).order_by(Job.id).limit(1)
            ).first()
            rows = []
            if first is not None:
                rows = session.exec(
                    select(JobEvent).where(JobEvent.job_id == first).order_by(JobEvent.id)
                ).all()
            self._events = [
                {
                    "kind": e.kind,
                    "from_status": e.from_status,
                    "to_status": e.to_status,
                    "stage": e.stage,
                    "attempt": e.attempt,
                    "actor": e.actor,
                    "message": e.message,
                    "data": e.data,
                }
                for e in rows
            ]
        return self._events

    def _batch(self, dataset_id: int, n: int):
        """``n`` documents with a succeeded active job each, their events and their chunks' rows
        in the lexical index, in one transaction; returns their chunks for Chroma."""
        ctx = self.ctx
        version = ctx.pipeline_version
        docs = []
        with Session(ctx.engine) as session:
            pattern = self._event_pattern(session, dataset_id)
            for _ in range(n):
                d = self.documents
                self.documents += 1
                sha = hashlib.sha256(f"scale-{self.seed}-{d}".encode()).hexdigest()
                meta = {"lang": "de" if d % 10 == 0 else "en", "shard": d % 10}
                doc = Document(
                    dataset_id=dataset_id,
                    sha256=sha,
                    size=PER_DOC * WORDS * 6,
                    media_type="text/plain",
                    filename=f"bulk-{d:06d}.txt",
                    blob_key=sha,
                    metadata_=meta,
                )
                session.add(doc)
                session.flush()
                now = utcnow()
                job = Job(
                    document_id=doc.id,
                    dataset_id=dataset_id,
                    filename=doc.filename,
                    idempotency_key=f"{dataset_id}:{sha}:{version}",
                    pipeline_version=version,
                    status=JobStatus.succeeded,
                    stage=Stage.done,
                    chunk_count=PER_DOC,
                    total=PER_DOC,
                    done=PER_DOC,
                    started_at=now,
                    finished_at=now,
                    lease=1,
                )
                session.add(job)
                session.flush()
                doc.active_job_id = job.id
                docs.append((doc.id, sha, job.id, meta, doc.filename))
            if pattern:
                session.connection().execute(
                    insert(JobEvent),
                    [
                        {**e, "job_id": job_id, "at": utcnow()}
                        for *_, job_id, _, _ in docs
                        for e in pattern
                    ],
                )
            chunks = self._chunks(docs)
            self._lexical(session, dataset_id, docs, chunks[1])
            session.commit()
        return chunks

    def _chunks(self, docs) -> tuple[list[str], list[str], np.ndarray, list[dict]]:
        """Every chunk of these documents: ids, texts, vectors and metadata as the pipeline
        writes them."""
        version = self.ctx.pipeline_version
        m = len(docs) * PER_DOC
        picks = self._np.integers(0, len(self.words), size=(m, WORDS))
        slots = self._slot[picks]
        counts = np.zeros((m, len(self._distinct)), dtype=np.float32)
        np.add.at(counts, (np.arange(m)[:, None], slots), 1.0)
        vectors = counts @ self._unit
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        words = self.words
        ids, texts, metas, coded = [], [], [], []
        for k, (doc_id, sha, job_id, meta, filename) in enumerate(docs):
            for p in range(PER_DOC):
                row = k * PER_DOC + p
                body = " ".join([words[i] for i in picks[row]])
                if self.rng.random() < 1 / 97:
                    code = f"QZ-{doc_id:05d}{p:03d}"
                    self.codes.append(code)
                    body += f" reference {code} filed."
                    coded.append(row)
                ids.append(chunk_id(sha, version, p))
                texts.append(body)
                metas.append(
                    {
                        "job_id": job_id,
                        "document_id": doc_id,
                        "pipeline_version": version,
                        "position": p,
                        "page": 1 + p // 4,
                        "filename": filename,
                        "sha256": sha,
                        "ocr": False,
                        **metadata_fields(meta),
                    }
                )
        embedder = self.ctx.embedder
        if coded:  # words beyond the vocabulary: the embedder itself
            vectors[coded] = embedder.encode([texts[i] for i in coded])
        check = list(range(min(CHECKED, m))) + coded[:1]
        if not np.allclose(vectors[check], embedder.encode([texts[i] for i in check]), atol=1e-5):
            raise AssertionError("the bulk loader's vectors are not the hash embedder's")
        return ids, texts, vectors, metas

    def _lexical(self, session: Session, dataset_id: int, docs, texts: list[str]) -> None:
        """The chunks' rows in the lexical index, in the session's transaction (PostgreSQL: one
        ``write_job`` per document)."""
        rows = [
            (doc_id, job_id, p, texts[k * PER_DOC + p], chunk_id(sha, self.ctx.pipeline_version, p))
            for k, (doc_id, sha, job_id, _, _) in enumerate(docs)
            for p in range(PER_DOC)
        ]
        if session.get_bind().dialect.name != "sqlite":
            session.commit()
            for k, (doc_id, _, job_id, _, _) in enumerate(docs):
                lexical.write_job(
                    self.ctx.engine,
                    dataset_id=dataset_id,
                    document_id=doc_id,
                    job_id=job_id,
                    rows=[
                        lexical.Row(chunk_id=cid, position=p, page=1 + p // 4, text=body)
                        for d, _, p, body, cid in rows[k * PER_DOC : (k + 1) * PER_DOC]
                    ],
                )
            return
        if not lexical_ready(session, dataset_id):
            raise RuntimeError("the dataset has no full-text table yet: ingest one document first")
        plain = [body for _, _, _, body, _ in rows if "QZ-" not in body]
        for body in plain[:CHECKED]:  # a coded chunk's tokens are worked out below
            if lexical.index_tokens(body) != body.split():
                raise AssertionError("the bulk loader's index tokens are not lexical's")
        params = [
            {
                "dataset_id": dataset_id,
                "chunk_id": cid,
                "document_id": doc_id,
                "job_id": job_id,
                "position": p,
                "page": 1 + p // 4,
                "text": body,
                # plain words are their own tokens; a coded chunk's are worked out
                "terms": " ".join(lexical.index_tokens(body) if "QZ-" in body else body.split()),
            }
            for doc_id, job_id, p, body, cid in rows
        ]
        session.connection().execute(
            text(
                "INSERT INTO lexical_chunk (dataset_id, chunk_id, document_id, job_id, position, "
                "page, text, terms) VALUES (:dataset_id, :chunk_id, :document_id, :job_id, "
                ":position, :page, :text, :terms)"
            ),
            params,
        )

    def _add(self, collection: str, ids, texts, vectors, metas) -> None:
        """Hand the rows to the add thread (after the add before them has ended)."""
        rows = {
            "ids": list(ids),
            "embeddings": np.asarray(vectors, dtype=np.float32),
            "documents": list(texts),
            "metadatas": list(metas),
        }
        self._wait()
        self._pending = self._pool.submit(self.ctx.vectors.add, collection, **rows)


def lexical_ready(session: Session, dataset_id: int) -> bool:
    """Whether the dataset's FTS5 table (and the triggers that fill it) exists."""
    found = session.connection().execute(
        text("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = :n"),
        {"n": lexical.fts_table(dataset_id)},
    )
    return found.first() is not None
