"""Search one dataset: only chunks of each document's active (succeeded) job are answered.

Two rankers: dense (the vectors in Chroma) and lexical (the words in the job database, see
``sluice.storage.lexical``). ``hybrid`` fuses their rankings by reciprocal rank fusion; a query with
a quoted phrase answers only chunks holding the phrase. ``lexical`` never loads the model.

A document's chunks of a running, failed, cancelled or superseded run are in the stores for a
while; filtering on the document's active job keeps them out, so search never shows two pipeline
versions of one document and never loses a document while its new version is being built.

A metadata filter (``where``, sluice.ops.metadata) is decided on the document rows of the job
database, never on the chunks' copies: the documents it allows are read at one moment and both
rankers are restricted to them (lexical: in its SQL; dense: by exact comparison for a few chunks,
by screening an unfiltered query's ids for a broad share, else a Chroma ``where`` on
``document_id``), and the read that checks the active jobs checks the filter again. A metadata
change is one UPDATE of one document row, so a search sees all of a document's chunks under the
old metadata or all under the new, never half. Chunks switched off (sluice.ops.chunks) are left
out by every ranker, the rankers asking for more until ``k`` enabled ones are found or none are
left. A document switched off (sluice.ops.document_switch) is one UPDATE of its row, read by the
same statement as its active job: a search answers all of its chunks or none.

Scores are on one 0..1 scale in every mode (larger is better; docs/api.md, Search scores): dense,
the cosine similarity (below 0 shown as 0); lexical, the raw score (BM25 on SQLite, ts_rank on
PostgreSQL, both of the dataset's own index) as raw / (raw + ``LEXICAL_HALF``); hybrid, the fused
score divided by the most it can be. ``min_score`` keeps the hits scoring at least that, so an
answer may hold fewer than ``k``; ``max_chunks_per_document`` keeps at most that many of one
document, the rankers asked deeper until ``k`` come or none are left.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import text
from sqlalchemy.engine import Engine

from sluice import faults
from sluice.errors import OperationError
from sluice.ops import dense, sections
from sluice.ops import metadata as meta
from sluice.pipeline.running.chunk import heading_of
from sluice.storage import lexical
from sluice.storage.lexical import Filters
from sluice.storage.vectors import Hit

if TYPE_CHECKING:
    from sqlmodel import Session

    from sluice.pipeline.running.embed import Embedder
    from sluice.pipeline.running.rerank import Reranker
    from sluice.settings import Settings
    from sluice.storage.models import Dataset

log = logging.getLogger(__name__)

MODES = ("hybrid", "dense", "lexical")
# reciprocal rank fusion: score = sum of weight / (RRF_K + rank) over the rankers that found it,
# shown divided by the most it can be (rank 1 in both, a strict lexical hit): 0..1. The constant
# is small: a ranker's first places count more than hits both only half agree on (measured on
# SciFact abstracts by bench/beir.py: BENCHMARKS.md, Retrieval quality on a BEIR dataset).
RRF_K = 2
DENSE_WEIGHT = 0.5  # the dense ranker's share of the fusion by default: both weigh alike
# The raw lexical score shown as 0.5 (score = raw / (raw + half)): SQLite's BM25 and PostgreSQL's
# ts_rank (normalisation 1) have their own ranges. Measured on tests/test_search_controls.py's
# text: a good two-word match is BM25 ~9 and ts_rank ~0.09, both ~0.64 on this scale.
LEXICAL_HALF = {"sqlite": 5.0, "postgresql": 0.05}
STRICT_WEIGHT = (
    2.0  # a lexical hit holding every typed word and phrase (measured in bench/retrieval.py)
)
LEXICAL_DEPTH = (
    50  # candidates the lexical ranker gives the fusion, at least (cheap: one indexed query)
)


class Reader(dense.Reader, Protocol):
    """What a search reads through: a process's Context (sluice.pipeline.running.context), or the
    lighter one of a cold ``sluice search`` (sluice.cli.search_command); the job database and the
    vector store as the dense ranker reads them, and these."""

    @property
    def query_encoder(self) -> Embedder: ...

    @property
    def reranker(self) -> Reranker | None: ...

    @property
    def settings(self) -> Settings: ...


class UnknownDataset(OperationError):
    """No dataset has this name."""

    code, status = "not_found", 404
    hint = "See the datasets' names with `sluice datasets`."


class DatasetDeleting(UnknownDataset):
    """The dataset is being deleted (sluice.ops.dataset_admin): it answers no search."""

    code, status = "dataset_deleting", 409
    hint = (
        "Wait for the delete to finish (or run it again: sluice datasets delete NAME), then make "
        "the dataset again if you want it."
    )


class RerankUnavailable(OperationError):
    """A search asked for reranking where no reranker is set."""

    code, status = "rerank_unavailable", 422
    hint = (
        "Leave rerank out (or false), or have the operator name a cross-encoder's folder in "
        "SLUICE_RERANK_MODEL."
    )


class BadQuery(OperationError):
    """A search's mode, pages or controls that cannot be read; the message says how to write
    them."""

    code, status = "bad_query", 422
    hint = (
        "mode is hybrid, dense or lexical; pages is A-B, A-, -B or one page number; min_score and "
        "dense_weight are 0 to 1; max_chunks_per_document is at least 1."
    )


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
    matched: list[str] = field(default_factory=list)  # which rankers found it: dense, lexical
    snippet: str = ""  # the text around the first match, matched words in **bold**
    heading: str = ""  # the chunk's heading path, "Title > Section" ("" for none)
    where: str = (
        ""  # "slide 3", "section 2: Results", "rows 202-400"; "" for a page of a PDF or text
    )
    ocr: bool = False  # the text was read by OCR from a page image
    similarity: float | None = None  # the model's cosine similarity, when the dense ranker found it
    # Each ranker's own view (the Hit testing page): its rank (1 = first) and the lexical score.
    dense_rank: int | None = None
    lexical_rank: int | None = None
    lexical_score: float | None = None
    rerank_score: float | None = None  # the reranker's 0..1 score, when one reranked the hits
    context: str | None = None  # its section's text around it (the dataset's context_size)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Searched:
    """What a search reads of its dataset (one plain SQL read: no ORM on a cold search's path)."""

    id: int
    name: str
    collection: str
    context_size: int | None = None  # the dataset's own (None: the process's SLUICE_CONTEXT_SIZE)


def get_dataset(ctx: Reader, name: str) -> Dataset:
    from sqlmodel import Session

    with Session(ctx.engine) as session:
        return dataset_named(session, name)


def dataset_named(session: Session, name: str) -> Dataset:
    """The dataset called ``name``, read in ``session``; UnknownDataset when there is none."""
    from sqlmodel import select

    from sluice.storage.models import Dataset

    ds = session.exec(select(Dataset).where(Dataset.name == name)).first()
    if ds is None:
        raise UnknownDataset(f"no dataset named {name!r}")
    _refuse_deleting(name, ds.deleting_at)
    return ds


def _refuse_deleting(name: str, deleting_at) -> None:
    if deleting_at is not None:
        raise DatasetDeleting(f"dataset {name!r} is being deleted: it answers no search")


_DATASET = text(
    "SELECT id, collection, deleting_at, parse_settings FROM dataset WHERE name = :name"
)


def searched_dataset(ctx: Reader, name: str) -> Searched:
    """The dataset called ``name`` as a search reads it; UnknownDataset when there is none."""
    with ctx.engine.connect() as conn:
        row = conn.execute(_DATASET, {"name": name}).first()
    if row is None:
        raise UnknownDataset(f"no dataset named {name!r}")
    _refuse_deleting(name, row.deleting_at)
    own = row.parse_settings
    if isinstance(own, str):  # SQLite hands JSON back as its text
        own = json.loads(own or "null")
    size = (own or {}).get("context_size") if isinstance(own, dict) else None
    return Searched(
        id=row.id,
        name=name,
        collection=row.collection,
        context_size=int(size) if isinstance(size, int) else None,
    )


PAGE_MAX = 2**63 - 1  # a page number the job database can compare (64 bits)
PAGES_PATTERN = r"^\s*[0-9]{0,19}\s*(-\s*[0-9]{0,19}\s*)?$"  # the API's schema says the same
_PAGES = re.compile(r"^\s*([0-9]*)\s*(?:(-)\s*([0-9]*)\s*)?$")
PAGES_RULE = "write A-B, A-, -B or one page number (0 to 2**63-1)"


def parse_pages(value: str | None) -> tuple[int | None, int | None]:
    """``"3-7"``, ``"3-"``, ``"-7"`` or ``"5"`` as (first, last) page numbers; BadQuery for any
    other text, and for a number past 64 bits (no page is, and the database cannot compare it)."""
    if not value:
        return None, None
    m = _PAGES.match(value)
    if m is None:
        raise BadQuery(f"pages {value[:40]!r}: {PAGES_RULE}")
    first, sep, last = m.groups()
    a = int(first) if first else None
    b = (int(last) if last else None) if sep else a
    if any(n is not None and n > PAGE_MAX for n in (a, b)):
        raise BadQuery(f"pages {value[:40]!r}: a page number is at most 2**63-1")
    if a is not None and b is not None and a > b:
        raise BadQuery(f"pages {value!r}: the first page is after the last")
    return a, b


def search(
    ctx: Reader,
    *,
    query: str,
    dataset: str,
    k: int = 5,
    mode: str = "hybrid",
    filename: str | None = None,
    pages: str | None = None,
    media_type: str | None = None,
    where: dict | None = None,
    vector=None,
    min_score: float | None = None,
    max_chunks_per_document: int | None = None,
    dense_weight: float = DENSE_WEIGHT,
    rerank: bool | None = None,
) -> list[SearchHit]:
    """The best ``k`` chunks of ``dataset`` for ``query``; ``vector``: the query already encoded
    (``query_vector``), else it is encoded here when the mode needs it. ``where``: a metadata
    filter (sluice.ops.metadata; FilterError when it is malformed). ``min_score``: only hits
    scoring at least this (on the mode's 0..1 scale, see the module's doc), so fewer than ``k``
    may come; ``max_chunks_per_document``: at most this many hits of one document (the rankers
    look further for the others); ``dense_weight``: the dense ranker's share of a hybrid fusion
    (0: the lexical order, 1: the dense order; 0.5 weighs them alike). ``rerank``: the reranker
    (SLUICE_RERANK_MODEL) rescores the best candidates, its score the hit's (None: when one is
    set; True where none is: RerankUnavailable)."""
    check_controls(mode, min_score, max_chunks_per_document, dense_weight)
    reranker = _reranker(ctx, rerank)
    page_from, page_to = parse_pages(pages)
    conditions = meta.parse_where(where)
    parsed = lexical.parse_query(query)
    if parsed.empty or k <= 0:
        return []
    ds = searched_dataset(ctx, dataset)
    allowed = None
    if conditions:
        from sqlmodel import Session

        with Session(ctx.engine) as session:
            allowed = tuple(meta.matching_documents(session, ds.id, conditions))
    filters = Filters(
        filename=filename or None,
        media_type=media_type or None,
        page_from=page_from,
        page_to=page_to,
        document_ids=allowed,
    )
    if vector is None and mode in ("hybrid", "dense"):
        vector = query_vector(ctx, query)
    rank = Ranking(ctx, ds, parsed, mode, filters, conditions, vector, dense_weight)
    depth = k if reranker is None else max(k, reranker.depth)
    while True:
        ranked, more = rank(depth)
        if reranker is not None:
            ranked = _reranked(reranker, query, ranked[:depth])
        hits = _controlled(ranked, min_score, max_chunks_per_document)[:k]
        # the cap left out chunks of documents already answered: rank further for the others
        if len(hits) >= k or not more or max_chunks_per_document is None or depth >= k * 64:
            break
        depth *= 4
    _fill_positions(ctx, ds, [h for h in hits if "dense" not in h.matched])
    for h in hits:
        h.snippet = _snippet(h, parsed)
    size = ds.context_size if ds.context_size is not None else ctx.settings.context_size
    if size and hits:  # each hit's parent section, read from the word index
        found = sections.contexts(ctx.engine, ds.id, [h.chunk_id for h in hits], size)
        for h in hits:
            h.context = found.get(h.chunk_id)
    return hits


def _reranker(ctx: Reader, rerank: bool | None) -> Reranker | None:
    if rerank is False:
        return None
    found = ctx.reranker
    if found is None and rerank:
        raise RerankUnavailable("rerank: no reranker is set (SLUICE_RERANK_MODEL is empty)")
    return found


def _reranked(reranker: Reranker, query: str, hits: list[SearchHit]) -> list[SearchHit]:
    """The hits in the reranker's order, its score theirs (the fused one ranked them in); a tie
    keeps the rankers' order."""
    scores = reranker.score(query, [h.text for h in hits])
    for h, score in zip(hits, scores, strict=True):
        h.rerank_score = h.score = round(min(1.0, max(0.0, float(score))), 4)
    return sorted(hits, key=lambda h: -(h.rerank_score or 0.0))


def check_controls(
    mode: str, min_score: float | None, max_chunks_per_document: int | None, dense_weight: float
) -> None:
    """BadQuery for a mode, threshold, cap or weight search cannot take (the API's schema bounds
    them the same; the console and ``sluice search`` come here)."""
    if mode not in MODES:
        raise BadQuery(f"mode {mode!r}: one of {', '.join(MODES)}")
    if min_score is not None and not (isinstance(min_score, int | float) and 0 <= min_score <= 1):
        raise BadQuery(f"min_score {min_score!r}: a number from 0 to 1")
    cap = max_chunks_per_document
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
        raise BadQuery(f"max_chunks_per_document {cap!r}: a whole number, at least 1")
    if not (isinstance(dense_weight, int | float) and 0 <= dense_weight <= 1):
        raise BadQuery(f"dense_weight {dense_weight!r}: a number from 0 to 1")


def _controlled(hits: list[SearchHit], min_score: float | None, cap: int | None) -> list[SearchHit]:
    """The hits scoring at least ``min_score`` (as shown, rounded), at most ``cap`` of each
    document, in their order."""
    out: list[SearchHit] = []
    per_document: dict[int, int] = {}
    for h in hits:
        if min_score is not None and h.score < min_score:
            continue
        if cap is not None and per_document.get(h.document_id, 0) >= cap:
            continue
        per_document[h.document_id] = per_document.get(h.document_id, 0) + 1
        out.append(h)
    return out


@dataclass
class Ranking:
    """One search's rankers, asked for the best ``depth`` hits (scored on the mode's scale, best
    first) and whether they may hold more."""

    ctx: Reader
    ds: Searched
    parsed: lexical.Query
    mode: str
    filters: Filters
    conditions: meta.Where
    vector: Any
    dense_weight: float

    def __call__(self, depth: int) -> tuple[list[SearchHit], bool]:
        ctx, mode = self.ctx, self.mode
        lexical_n = max(LEXICAL_DEPTH, depth * 4)
        dense_n = max(dense.DENSE_DEPTH, depth * 2) if mode == "hybrid" else depth
        for again in (False, True):
            lexical_hits, dense_hits = self._rank(lexical_n, dense_n)
            if mode != "hybrid":
                break
            # Each ranker read the active jobs at its own moment: a document whose new version
            # became active in between would be answered in both versions. One read decides for
            # both; after a switch the new version is complete in both stores, so one more round
            # finds it there.
            active = dense.active_jobs(
                ctx,
                {h.document_id for h in lexical_hits} | {h.document_id for h in dense_hits},
                self.conditions,
            )
            ranked: list[lexical.LexicalHit | SearchHit] = [*lexical_hits, *dense_hits]
            if all(active.get(h.document_id) == h.job_id for h in ranked):
                break
            if again:
                lexical_hits = [h for h in lexical_hits if active.get(h.document_id) == h.job_id]
                dense_hits = [h for h in dense_hits if active.get(h.document_id) == h.job_id]
        more = len(lexical_hits) >= lexical_n or len(dense_hits) >= dense_n
        if mode == "dense":
            return _ranked(dense_hits, "dense_rank"), more
        if mode == "lexical":
            half = lexical_half(ctx.engine)
            hits = [_from_lexical(h, ctx, unit_lexical(h.score, half)) for h in lexical_hits]
            return _ranked(hits, "lexical_rank"), more
        fused = _fuse(
            ctx,
            dense_hits,
            lexical_hits,
            required=bool(self.parsed.quoted),
            weight=self.dense_weight,
        )
        return fused, more

    def _rank(
        self, lexical_n: int, dense_n: int
    ) -> tuple[list[lexical.LexicalHit], list[SearchHit]]:
        """The rankers the mode asks; hybrid's two at once, the dense one on a thread of
        ``_RANKERS`` (they are independent: a search costs the slower one, not both).

        ``search_between_rankers`` is hit by each of hybrid's two: by the lexical one once it has
        read (``ranker="lexical"``), by the dense one before it reads (``ranker="dense"``). A hook
        holding the dense one until the lexical one has come lands a write between the two reads,
        as when they ran one after the other."""
        if self.mode == "lexical":
            return self._words(lexical_n), []
        if self.mode == "dense":
            return [], self._vectors(dense_n)
        if not _RANKER_SLOTS.acquire(blocking=False):  # every thread busy: one after the other,
            words = self._words(lexical_n)  # never queued behind other searches
            faults.hit("search_between_rankers", dataset=self.ds.name, ranker="lexical")
            return words, self._vectors(dense_n, True)
        try:
            pending = _RANKERS.submit(contextvars.copy_context().run, self._vectors, dense_n, True)
        except BaseException:
            _RANKER_SLOTS.release()
            raise
        pending.add_done_callback(lambda _done: _RANKER_SLOTS.release())
        try:
            words = self._words(lexical_n)
            faults.hit("search_between_rankers", dataset=self.ds.name, ranker="lexical")
        except BaseException:
            pending.cancel()  # one already running ends on its own; its answer is dropped
            raise
        return words, pending.result()

    def _words(self, n: int) -> list[lexical.LexicalHit]:
        return lexical.search(
            self.ctx.engine, dataset_id=self.ds.id, query=self.parsed, n=n, filters=self.filters
        )

    def _vectors(self, n: int, hybrid: bool = False) -> list[SearchHit]:
        if hybrid:
            faults.hit("search_between_rankers", dataset=self.ds.name, ranker="dense")
        hits = dense.best(self.ctx, self.ds, self.vector, n, self.filters, self.conditions)
        return _dense_hits(hits)


# Hybrid's dense rankers, beside their lexical ones (each search's caller thread): a few, since a
# search waits on the store or the database most of the time. A search that finds every thread
# taken runs its two rankers one after the other on its own thread: one dataset's slow searches
# never hold another's in a queue.
RANKER_THREADS = 8
_RANKERS = ThreadPoolExecutor(RANKER_THREADS, thread_name_prefix="search-dense")
_RANKER_SLOTS = threading.BoundedSemaphore(RANKER_THREADS)


def lexical_half(engine: Engine) -> float:
    """The raw lexical score that is 0.5 on the 0..1 scale, for this job database's ranker."""
    return LEXICAL_HALF.get(engine.dialect.name, LEXICAL_HALF["sqlite"])


def unit_lexical(raw: float, half: float) -> float:
    """A raw lexical score (BM25 on SQLite, ts_rank on PostgreSQL; larger is better) on the 0..1
    scale: raw / (raw + half), so it depends on the dataset's own index alone."""
    raw = max(raw, 0.0)
    return round(raw / (raw + half), 4)


def _snippet(h: SearchHit, parsed) -> str:
    """The hit's snippet, of its text under its heading path (which ``h.heading`` takes)."""
    h.heading, body = heading_of(h.text)
    return lexical.snippet(body, parsed)


def _ranked(hits: list[SearchHit], field: str) -> list[SearchHit]:
    """The hits of one ranker, each told its rank in it (1 = first)."""
    for rank, h in enumerate(hits, start=1):
        setattr(h, field, rank)
    return hits


def _fill_positions(ctx: Reader, ds: Searched, hits: list[SearchHit]) -> None:
    """Where in its file a hit only the word index found sits (slide, section, rows) and whether OCR
    read it: that is kept with the vectors, so ask the store for those few chunks (no model
    needed)."""
    if not hits:
        return
    try:
        got = ctx.vectors.get(ds.collection, [h.chunk_id for h in hits])
    except Exception as exc:  # the hits stand without it; the page number is known
        log.warning("search: positions of %d hit(s) unavailable: %s", len(hits), exc)
        return
    meta = dict(zip(got.get("ids") or [], got.get("metadatas") or [], strict=False))
    for h in hits:
        m = meta.get(h.chunk_id) or {}
        h.where, h.ocr = str(m.get("where", "")), bool(m.get("ocr", False))


def _from_lexical(h: lexical.LexicalHit, ctx: Reader, score: float | None = None) -> SearchHit:
    return SearchHit(
        filename=h.filename,
        page=h.page,
        score=round(h.score if score is None else score, 4),
        text=h.text,
        job_id=h.job_id,
        document_id=h.document_id,
        chunk_id=h.chunk_id,
        pipeline_version=_version(h.chunk_id),
        matched=["lexical"],
        lexical_score=round(h.score, 4),
    )


def _version(cid: str) -> str:
    parts = cid.split("-")
    return parts[1] if len(parts) == 3 else ""


def _fuse(
    ctx: Reader,
    dense: list[SearchHit],
    lex: list[lexical.LexicalHit],
    *,
    required: bool,
    weight: float = DENSE_WEIGHT,
) -> list[SearchHit]:
    """Reciprocal rank fusion, a lexical hit that holds every typed word counting double (a rare
    token is evidence the dense ranker cannot weigh); with a quoted phrase, only chunks holding it
    count. ``weight``: the dense ranker's share (its votes count 2 * weight, the lexical ones
    2 * (1 - weight)); a hit only a ranker of weight 0 found is left out. The score is the fused
    one divided by the most it can be, so 1 is rank 1 in both rankers (0..1)."""
    dense_w, lexical_w = 2 * weight, 2 * (1 - weight)
    best = (dense_w + lexical_w * STRICT_WEIGHT) / (RRF_K + 1)
    scores: dict[str, float] = {}
    hits: dict[str, SearchHit] = {}
    for rank, lh in enumerate(lex, start=1):
        scores[lh.chunk_id] = lexical_w * (STRICT_WEIGHT if lh.strict else 1.0) / (RRF_K + rank)
        hits[lh.chunk_id] = _from_lexical(lh, ctx)
        hits[lh.chunk_id].lexical_rank = rank
    for rank, h in enumerate(dense, start=1):
        if required and h.chunk_id not in hits:
            continue
        scores[h.chunk_id] = scores.get(h.chunk_id, 0.0) + dense_w / (RRF_K + rank)
        h.dense_rank = rank
        if h.chunk_id in hits:
            both = hits[h.chunk_id]
            both.matched, both.similarity, both.dense_rank, both.where, both.ocr = (
                ["dense", "lexical"],
                h.similarity,
                rank,
                h.where,
                h.ocr,
            )
        else:
            hits[h.chunk_id] = h
    order = sorted((c for c in scores if scores[c] > 0), key=lambda cid: (-scores[cid], cid))
    out = []
    for cid in order:
        h = hits[cid]
        h.score = round(min(scores[cid] / best, 1.0), 4)
        out.append(h)
    return out


def query_vector(ctx: Reader, query: str):
    """The query as dense search encodes it (None when nothing is left to encode): a search of
    several datasets encodes it once and passes it to each (``search(..., vector=)``)."""
    text = query.replace('"', " ").strip()
    return ctx.query_encoder.encode([text])[0] if text else None


def _dense_hits(hits: list[Hit]) -> list[SearchHit]:
    return [
        SearchHit(
            filename=str(h.metadata.get("filename", "")),
            page=int(h.metadata.get("page", 0)),
            score=round(min(max(h.score, 0.0), 1.0), 4),  # similarity, below 0 shown as 0
            text=h.text,
            job_id=int(h.metadata["job_id"]),  # every hit kept has one (_job_of)
            document_id=int(h.metadata.get("document_id", 0)),
            chunk_id=h.id,
            pipeline_version=str(h.metadata.get("pipeline_version", "")),
            matched=["dense"],
            where=str(h.metadata.get("where", "")),
            ocr=bool(h.metadata.get("ocr", False)),
            similarity=round(h.score, 4),
        )
        for h in hits
    ]
