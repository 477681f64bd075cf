"""Grow one dataset fast for ``bench.scale``: documents and succeeded jobs straight into the job
database, their chunks straight into Chroma (hash-embedded texts, the metadata the pipeline writes)
and into the lexical index, as ``tests/support/big_store.py`` does for the reconcile walk, but with
real texts and vectors, so that search and the recall audit see an index like the pipeline's.

One document in ten carries ``lang: de`` (the filtered searches select a tenth of the documents);
one chunk in 97 holds a reference code (``QZ-...``), the rare tokens the searches type.
"""

from __future__ import annotations

import hashlib
import random
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from sqlmodel import Session, select

from sluice.storage import lexical
from sluice.storage.models import Dataset, Document, Job, JobStatus, Stage, utcnow
from sluice.storage.vectors import chunk_id, metadata_fields

PER_DOC = 100  # chunks per bulk-loaded document
WORDS = 110  # words per chunk (about 700 characters: one chunk of the pipeline's 800)
DOCS_PER_COMMIT = 50
VECTOR_BATCH = 2000


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
        # One add to Chroma in flight while the next documents' rows are written (its server
        # is another process: the two overlap).
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="scale-add")
        self._pending: Future | None = None

    def text(self, n: int = WORDS) -> str:
        return " ".join(self.rng.choice(self.words) for _ in range(n))

    def grow(self, chunks: int) -> int:
        """Add documents of ``PER_DOC`` chunks until ``chunks`` have been bulk-loaded in all;
        returns how many were added now."""
        ctx = self.ctx
        with Session(ctx.engine) as session:
            ds = session.exec(select(Dataset).where(Dataset.name == self.dataset)).one()
            dataset_id, collection = ds.id, ds.collection
        added = 0
        while self.chunks < chunks:
            batch = min(DOCS_PER_COMMIT, -(-(chunks - self.chunks) // PER_DOC))
            made = self._rows(dataset_id, batch)
            self._chunks(dataset_id, collection, made)
            added += batch * PER_DOC
            self.chunks += batch * PER_DOC
        self._wait()
        return added

    def _wait(self) -> None:
        if self._pending is not None:
            self._pending.result()
            self._pending = None

    def _rows(self, dataset_id: int, n: int) -> list[tuple[int, str, int, dict]]:
        """``n`` documents with a succeeded active job each: (document id, sha, job id, meta)."""
        ctx = self.ctx
        version = ctx.pipeline_version
        made = []
        with Session(ctx.engine) as session:
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
                    started_at=utcnow(),
                    finished_at=utcnow(),
                    lease=1,
                )
                session.add(job)
                session.flush()
                doc.active_job_id = job.id
                made.append((doc.id, sha, job.id, meta))
            session.commit()
        return made

    def _chunks(self, dataset_id: int, collection: str, made) -> None:
        """Each document's chunks: texts, hash vectors and metadata to Chroma, words to the lexical
        index."""
        ctx = self.ctx
        version = ctx.pipeline_version
        ids: list[str] = []
        texts: list[str] = []
        metas: list[dict] = []
        for doc_id, sha, job_id, meta in made:
            rows = []
            for p in range(PER_DOC):
                body = self.text()
                if self.rng.random() < 1 / 97:
                    code = f"QZ-{doc_id:05d}{p:03d}"
                    self.codes.append(code)
                    body += f" reference {code} filed."
                cid = chunk_id(sha, version, p)
                rows.append(lexical.Row(chunk_id=cid, position=p, page=1 + p // 4, text=body))
                ids.append(cid)
                texts.append(body)
                metas.append(
                    {
                        "job_id": job_id,
                        "document_id": doc_id,
                        "pipeline_version": version,
                        "position": p,
                        "page": 1 + p // 4,
                        "filename": f"bulk-{doc_id:06d}.txt",
                        "sha256": sha,
                        "ocr": False,
                        **metadata_fields(meta),
                    }
                )
            lexical.write_job(
                ctx.engine, dataset_id=dataset_id, document_id=doc_id, job_id=job_id, rows=rows
            )
            if len(ids) >= VECTOR_BATCH:
                self._add(collection, ids, texts, metas)
        if ids:
            self._add(collection, ids, texts, metas)

    def _add(self, collection: str, ids: list[str], texts: list[str], metas: list[dict]) -> None:
        """Hand the rows to the add thread (after the add before them has ended)."""
        rows = {
            "ids": list(ids),
            "embeddings": self.ctx.embedder.encode(texts),
            "documents": list(texts),
            "metadatas": list(metas),
        }
        self._wait()
        self._pending = self._pool.submit(self.ctx.vectors.add, collection, **rows)
        ids.clear()
        texts.clear()
        metas.clear()
