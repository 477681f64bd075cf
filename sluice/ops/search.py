"""Search one dataset: only chunks of each document's active (succeeded) job are answered.

A document's chunks of a running, failed, cancelled or superseded run are in the collection for a
while; filtering on the document's active job keeps them out, so search never shows two pipeline
versions of one document and never loses a document while its new version is being built.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from sqlmodel import Session, select

from sluice.pipeline.context import Context
from sluice.storage.models import Dataset, Document


class UnknownDataset(LookupError):
    pass


@dataclass
class SearchHit:
    filename: str
    page: int
    score: float
    text: str
    job_id: int
    document_id: int
    chunk_id: str
    pipeline_version: str
    where: str = ""  # "slide 3", "section 2: Results", "rows 202-400"; "" for a page of a PDF or text
    ocr: bool = False  # the text was read by OCR from a page image

    def to_dict(self) -> dict:
        return asdict(self)


def get_dataset(ctx: Context, name: str) -> Dataset:
    with Session(ctx.engine) as session:
        ds = session.exec(select(Dataset).where(Dataset.name == name)).first()
    if ds is None:
        raise UnknownDataset(f"no dataset named {name!r}")
    return ds


def search(ctx: Context, *, query: str, dataset: str, k: int = 5) -> list[SearchHit]:
    query = query.strip()
    if not query or k <= 0:
        return []
    ds = get_dataset(ctx, dataset)
    vector = ctx.query_encoder.encode([query])[0]
    total = ctx.vectors.count(ds.collection)
    n = min(total, max(20, k * 4))
    requeried = False
    while True:
        hits = ctx.vectors.query(ds.collection, vector, n=n)
        doc_ids = {int(h.metadata.get("document_id", -1)) for h in hits}
        with Session(ctx.engine) as session:
            active = dict(session.exec(
                select(Document.id, Document.active_job_id).where(Document.id.in_(doc_ids),
                                                                  Document.deleted_at.is_(None))
            ).all())
        kept = [h for h in hits if active.get(int(h.metadata.get("document_id", -1))) == int(h.metadata["job_id"])]
        # A document whose active job switched between the query and this read lost all its hits;
        # its new chunks were complete before the switch, so one more query finds them.
        switched = any(active.get(int(h.metadata.get("document_id", -1))) not in (None, int(h.metadata["job_id"]))
                       for h in hits)
        if switched and not requeried:
            requeried = True
            continue
        if len(kept) >= k or n >= total:
            break
        n = min(total, n * 4)
    return [
        SearchHit(filename=str(h.metadata.get("filename", "")), page=int(h.metadata.get("page", 0)),
                  score=round(h.score, 4), text=h.text, job_id=int(h.metadata["job_id"]),
                  document_id=int(h.metadata.get("document_id", 0)), chunk_id=h.id,
                  pipeline_version=str(h.metadata.get("pipeline_version", "")),
                  where=str(h.metadata.get("where", "")), ocr=bool(h.metadata.get("ocr", False)))
        for h in kept[:k]
    ]
