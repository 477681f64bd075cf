"""The lexical index: every indexed chunk's words, in the job database, beside the vectors.

A dense model cannot rank a rare token (an invoice number, a product code, a name): the words of
each chunk are kept in a full-text index of the job database, SQLite FTS5 (ranked by BM25) or
PostgreSQL full text (a ``tsvector`` column with a GIN index, ranked by ``ts_rank``), so every
process that reaches the job database reaches the index.

Rows carry the chunk id the vectors carry (``vectors.chunk_id``), the job, the document, the
position and the page. They obey the index contract with the vectors: a job writes its rows
idempotently (all of them, in one transaction, whatever an earlier attempt left), cancel, delete,
supersede and reconcile remove them, and search serves only rows of each document's active job.

Text is tokenised here, the same way for chunks and queries, so both engines see the same tokens:
NFKC, lower case, runs of letters and digits; runs of Chinese, Japanese, Korean and Thai characters
(written without spaces) become overlapping character bigrams, so a word inside a sentence finds it
(a typed word of two or more characters is the phrase of its bigrams, in order). A chunk also keeps
the last character of each such run, marked (``TAIL``), so that one typed character, searched as a
prefix, finds every run holding it.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from sluice.errors import LeaseLost
from sluice.storage import id_lists

_THAI_MARKS = "\u0e31\u0e34-\u0e3a\u0e47-\u0e4e"  # Thai vowel and tone marks (Mn): part of a word
_WORD = re.compile(f"(?:[^\\W_]|[{_THAI_MARKS}])+")
_CJK = re.compile(  # scripts written without spaces: Thai, kana, bopomofo, Han, Hangul, half-width
    "([\u0e01-\u0e4e\u3040-\u30ff\u3100-\u312f\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af"
    "\uf900-\ufaff\uff66-\uff9f\U00020000-\U0002fa1f]+)"
)
_UNIT = re.compile(f".[{_THAI_MARKS}]*")  # one character of such a run, with the marks it carries
_PHRASE = re.compile(r'"([^"]*)"')
TAIL = "\ue000"  # a private-use character: both engines keep it inside a token, no query has it
# FTS5's unicode61 splits tokens at combining marks (Mn), PostgreSQL does not: on SQLite each Thai
# mark is written as a private-use character of its own (a token character there), so a Thai word
# stays one token and ง่าย is not งาย.
_FTS5_MARKS = str.maketrans(
    {
        chr(c): chr(0xE800 + c - 0x0E00)
        for c in [0x0E31, *range(0x0E34, 0x0E3B), *range(0x0E47, 0x0E4F)]
    }
)
BATCH = 500  # rows per insert statement
CANDIDATES = 200  # best full-text matches joined and filtered at first, more when too few survive
READ_MAX = 10_000  # ids of ranked matches one statement reads the rows of (SQLite binds 32,766)
COMMON_FLOOR = 20_000  # indexed chunks from which the loose match leaves out words most chunks hold


def _word_tokens(word: str) -> list[str]:
    """Tokens of one run of letters and digits: itself, or bigrams of characters (a Thai character
    with its marks) for its parts written without spaces."""
    out: list[str] = []
    for i, part in enumerate(_CJK.split(word)):
        if not part:
            continue
        if i % 2 == 0:  # not CJK
            out.append(part)
            continue
        units = _UNIT.findall(part)
        if len(units) == 1:
            out.append(units[0])
        else:
            out.extend(units[j] + units[j + 1] for j in range(len(units) - 1))
    return out


def normalise(word: str) -> str:
    return unicodedata.normalize("NFKC", word).lower()


def lone(token: str) -> bool:
    """A one-character CJK token: a query searches it as a prefix (the bigrams it starts, and the
    tail token of a run it ends), so one typed character finds every run that holds it."""
    return _CJK.fullmatch(token) is not None and len(_UNIT.findall(token)) == 1


def index_tokens(value: str) -> list[str]:
    """The tokens a chunk is indexed by: its tokens, then the last character of each CJK run of two
    or more, marked with ``TAIL`` (no typed word holds it; only a lone character's prefix search
    reaches it). They follow every other token, so phrase positions do not move."""
    runs = (
        _UNIT.findall(run)
        for m in _WORD.finditer(normalise(value))
        for run in _CJK.findall(m.group())
    )
    tails = [units[-1] + TAIL for units in runs if len(units) > 1]
    return tokens(value) + tails


def tokens(value: str) -> list[str]:
    """The tokens of a text, in order (positions matter for phrases)."""
    out: list[str] = []
    for m in _WORD.finditer(normalise(value)):
        out.extend(_word_tokens(m.group()))
    return out


@dataclass(frozen=True)
class Query:
    """What an operator typed: phrases (quoted, or one typed word of several tokens such as
    ``XJ-4471`` or a CJK sentence) that must all match, and the bare tokens for a looser match."""

    groups: tuple[tuple[str, ...], ...]
    quoted: tuple[tuple[str, ...], ...] = ()
    terms: tuple[str, ...] = field(default=())

    @property
    def empty(self) -> bool:
        return not self.groups


def parse_query(value: str) -> Query:
    groups: list[tuple[str, ...]] = []
    quoted: list[tuple[str, ...]] = []
    for m in _PHRASE.finditer(value):
        t = tuple(tokens(m.group(1)))
        if t:
            groups.append(t)
            quoted.append(t)
    rest = _PHRASE.sub(" ", value).replace('"', " ")
    for word in rest.split():
        t = tuple(tokens(word))
        if t:
            groups.append(t)
    seen: dict[str, None] = {}
    for g in groups:
        for token in g:
            seen.setdefault(token, None)
    return Query(tuple(groups), tuple(quoted), tuple(seen))


@dataclass(frozen=True)
class Row:
    chunk_id: str
    position: int
    page: int
    text: str


@dataclass(frozen=True)
class LexicalHit:
    chunk_id: str
    document_id: int
    job_id: int
    position: int
    page: int
    text: str
    filename: str
    media_type: str
    score: float  # larger is better
    strict: bool = True  # it holds every typed word and phrase (not only some of the tokens)


@dataclass(frozen=True)
class Filters:
    """Narrow a search: file name (case-insensitive substring), media type, page range, and the
    documents a metadata filter allows (None: no such filter)."""

    filename: str | None = None
    media_type: str | None = None
    page_from: int | None = None
    page_to: int | None = None
    document_ids: tuple[int, ...] | None = None


# --- schema ---------------------------------------------------------------------------------------

_TABLE = """CREATE TABLE IF NOT EXISTS lexical_chunk (
    id {id} PRIMARY KEY,
    dataset_id INTEGER NOT NULL,
    chunk_id VARCHAR(120) NOT NULL,
    document_id INTEGER NOT NULL,
    job_id INTEGER NOT NULL,
    position INTEGER NOT NULL,
    page INTEGER NOT NULL,
    text TEXT NOT NULL,
    {terms} NOT NULL,
    UNIQUE (dataset_id, chunk_id))"""
_INDEXES = [
    "CREATE INDEX IF NOT EXISTS ix_lexical_chunk_job ON lexical_chunk (job_id, position)",
    "CREATE INDEX IF NOT EXISTS ix_lexical_chunk_document ON lexical_chunk (document_id)",
]
_SQLITE = [_TABLE.format(id="INTEGER", terms="terms TEXT"), *_INDEXES]


def fts_table(dataset_id: int) -> str:
    """The dataset's own full-text index on SQLite: BM25 reads its statistics (row count, average
    length, term frequencies) from the table it ranks in, so one table for every dataset would make
    one dataset's scores depend on another's content."""
    return f"lexical_fts_{int(dataset_id)}"


def _fts_statements(dataset_id: int) -> list[str]:
    """The dataset's FTS5 table over its rows of ``lexical_chunk`` (external content: the words live
    once) and the triggers that keep it in step, also when someone deletes rows by hand."""
    d, fts = int(dataset_id), fts_table(dataset_id)
    return [
        f"""CREATE VIRTUAL TABLE IF NOT EXISTS {fts} USING fts5(
            terms, content='lexical_chunk', content_rowid='id',
            tokenize='unicode61 remove_diacritics 0')""",
        f"""CREATE TRIGGER IF NOT EXISTS lexical_chunk_ai_{d} AFTER INSERT ON lexical_chunk
            WHEN new.dataset_id = {d} BEGIN
            INSERT INTO {fts}(rowid, terms) VALUES (new.id, new.terms); END""",
        f"""CREATE TRIGGER IF NOT EXISTS lexical_chunk_ad_{d} AFTER DELETE ON lexical_chunk
            WHEN old.dataset_id = {d} BEGIN
            INSERT INTO {fts}({fts}, rowid, terms) VALUES ('delete', old.id, old.terms); END""",
        f"""CREATE TRIGGER IF NOT EXISTS lexical_chunk_au_{d} AFTER UPDATE OF terms ON lexical_chunk
            WHEN new.dataset_id = {d} BEGIN
            INSERT INTO {fts}({fts}, rowid, terms) VALUES ('delete', old.id, old.terms);
            INSERT INTO {fts}(rowid, terms) VALUES (new.id, new.terms); END""",
    ]


def _fts_exists(conn: Connection, dataset_id: int) -> bool:
    found = conn.execute(
        text("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = :n"),
        {"n": fts_table(dataset_id)},
    ).first()
    return found is not None


_known: set[tuple[str, int]] = set()  # (database, dataset id): full-text tables this process saw


def _key(engine: Connection | Engine, dataset_id: int) -> tuple[str, int]:
    return str(engine.engine.url if isinstance(engine, Connection) else engine.url), int(dataset_id)


def _ensure_fts(conn: Connection, dataset_id: int) -> None:
    if not _fts_exists(conn, dataset_id):
        for stmt in _fts_statements(dataset_id):
            conn.execute(text(stmt))


def ensure_dataset_index(engine: Engine, dataset_id: int) -> None:
    """Make a new dataset's own full-text table (SQLite), so that its first job pays nothing."""
    if _postgres(engine):
        return
    with engine.begin() as conn:
        _ensure_fts(conn, dataset_id)
    _known.add(_key(engine, dataset_id))


def _remember_tables(conn: Connection) -> None:
    names = conn.execute(
        text("SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'lexical_fts_%'")
    ).scalars()
    for name in names:
        suffix = name.removeprefix("lexical_fts_")
        if suffix.isdigit():
            _known.add(_key(conn, int(suffix)))


def _split_shared_fts(conn: Connection) -> None:
    """A database of an older Sluice has one full-text table for every dataset: each dataset's rows
    move to a table of its own, in one transaction (a second process racing it sees "locked" and
    checks again)."""
    shared = conn.execute(
        text("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'lexical_fts'")
    ).first()
    if shared is None:
        return
    for suffix in ("ai", "ad", "au"):  # the first write takes the write lock
        conn.execute(text(f"DROP TRIGGER IF EXISTS lexical_chunk_{suffix}"))
    conn.execute(text("DROP TABLE lexical_fts"))
    datasets = conn.execute(text("SELECT DISTINCT dataset_id FROM lexical_chunk")).scalars()
    for dataset_id in list(datasets):
        _ensure_fts(conn, dataset_id)
        fts = fts_table(dataset_id)
        conn.execute(
            text(
                f"INSERT INTO {fts}(rowid, terms) SELECT id, terms FROM lexical_chunk WHERE "
                "dataset_id = :d"
            ),
            {"d": dataset_id},
        )


_POSTGRES = [
    _TABLE.format(id="BIGSERIAL", terms="tsv TSVECTOR"),
    *_INDEXES,
    "CREATE INDEX IF NOT EXISTS ix_lexical_chunk_tsv ON lexical_chunk USING GIN (tsv)",
]


def _postgres(conn: Connection | Engine) -> bool:
    return conn.dialect.name == "postgresql"


def init_schema(engine: Engine) -> None:
    """Create the lexical tables if missing (``db.init_schema`` calls it, and retries a lost
    race)."""
    with engine.begin() as conn:
        for stmt in _POSTGRES if _postgres(engine) else _SQLITE:
            conn.execute(text(stmt))
        if not _postgres(engine):
            _split_shared_fts(conn)
            _remember_tables(conn)


# --- writing and removing -------------------------------------------------------------------------


def _tsvector(toks: Sequence[str]) -> str:
    """A tsvector literal with positions (tokens hold only letters and digits: no quoting
    needed)."""
    return " ".join(f"'{t}':{min(i + 1, 16383)}" for i, t in enumerate(toks))


def write_job(
    engine: Engine,
    *,
    dataset_id: int,
    document_id: int,
    job_id: int,
    rows: Iterable[Row],
    lease: int | None = None,
) -> int:
    """Make the job's rows exactly ``rows``, in one transaction (a re-run writes the same ids again,
    and what an older run left beyond the new count goes). Returns how many rows it wrote.

    With ``lease`` (a worker's attempt), only while that attempt still owns the running job, checked
    in the same transaction with the job's row locked: a job deleted, superseded or taken back
    meanwhile raises LeaseLost and writes nothing (its cleanup has run or runs after this)."""
    pg = _postgres(engine)
    params = []
    for r in rows:
        toks = index_tokens(r.text)
        params.append(
            {
                "dataset_id": dataset_id,
                "chunk_id": r.chunk_id,
                "document_id": document_id,
                "job_id": job_id,
                "position": r.position,
                "page": r.page,
                "text": r.text,
                "terms": _tsvector(toks) if pg else " ".join(toks).translate(_FTS5_MARKS),
            }
        )
    column, value = ("tsv", "CAST(:terms AS tsvector)") if pg else ("terms", ":terms")
    # A chunk id is the same for the same bytes and pipeline version: a row another job of this
    # dataset left with these ids (never the case unless by hand) is taken over, not a conflict
    # (on SQLite the update trigger keeps the full-text index in step).
    insert = text(
        "INSERT INTO lexical_chunk (dataset_id, chunk_id, document_id, job_id, position, page, "
        f"text, {column}) VALUES (:dataset_id, :chunk_id, :document_id, :job_id, :position, :page, "
        f":text, {value}) ON CONFLICT (dataset_id, chunk_id) DO UPDATE SET "
        "document_id = excluded.document_id, job_id = excluded.job_id, "
        "position = excluded.position, page = excluded.page, text = excluded.text, "
        f"{column} = excluded.{column}"
    )
    with engine.begin() as conn:
        # The delete comes first: on SQLite it takes the write lock, so the check below sees the
        # latest job row and nothing changes it before this commits.
        conn.execute(text("DELETE FROM lexical_chunk WHERE job_id = :job_id"), {"job_id": job_id})
        if lease is not None:
            _still_ours(conn, job_id, lease, pg)
        if not pg and params and _key(engine, dataset_id) not in _known:
            _ensure_fts(conn, dataset_id)  # a dataset made before its table was
        for start in range(0, len(params), BATCH):
            conn.execute(insert, params[start : start + BATCH])
    if not pg and params:
        _known.add(_key(engine, dataset_id))
    return len(params)


def _still_ours(conn: Connection, job_id: int, lease: int, pg: bool) -> None:
    owned = conn.execute(
        text(
            "SELECT 1 FROM job WHERE id = :j AND lease = :l AND status = 'running'"
            + (" FOR UPDATE" if pg else "")
        ),
        {"j": job_id, "l": lease},
    ).first()
    if owned is None:
        raise LeaseLost(f"job {job_id} is no longer owned by lease {lease}")


def _expanding(name: str):
    from sqlalchemy import bindparam

    return bindparam(name, expanding=True)


def delete_job(engine: Engine, job_id: int) -> int:
    """Remove every row a job wrote (cancel, supersede, delete). Returns how many went."""
    with engine.begin() as conn:
        return conn.execute(
            text("DELETE FROM lexical_chunk WHERE job_id = :j"), {"j": job_id}
        ).rowcount


def delete_jobs(engine: Engine, job_ids: Sequence[int]) -> int:
    if not job_ids:
        return 0
    with engine.begin() as conn:
        return conn.execute(
            text("DELETE FROM lexical_chunk WHERE job_id IN :ids").bindparams(_expanding("ids")),
            {"ids": list(job_ids)},
        ).rowcount


def delete_ids(engine: Engine, dataset_id: int, chunk_ids: Sequence[str]) -> int:
    n = 0
    with engine.begin() as conn:
        for start in range(0, len(chunk_ids), BATCH):
            n += conn.execute(
                text(
                    "DELETE FROM lexical_chunk WHERE dataset_id = :d AND chunk_id IN :ids"
                ).bindparams(_expanding("ids")),
                {"d": dataset_id, "ids": list(chunk_ids[start : start + BATCH])},
            ).rowcount
    return n


def update_fields(engine: Engine, dataset_id: int, fixes: Sequence[tuple[str, dict]]) -> None:
    """Rewrite job_id / document_id / position of rows (reconcile's metadata repair)."""
    allowed = {"job_id", "document_id", "position"}
    with engine.begin() as conn:
        for cid, values in fixes:
            values = {k: v for k, v in values.items() if k in allowed}
            if not values:
                continue
            sets = ", ".join(f"{k} = :{k}" for k in values)
            conn.execute(
                text(f"UPDATE lexical_chunk SET {sets} WHERE dataset_id = :d AND chunk_id = :cid"),
                {**values, "d": dataset_id, "cid": cid},
            )


def set_texts(engine: Engine, dataset_id: int, job_id: int, texts: dict[str, str]) -> int:
    """Give rows of ``job_id`` new text (a chunk edited by hand), their words indexed again in the
    same statement; how many rows there were."""
    pg = _postgres(engine)
    column, value = ("tsv", "CAST(:terms AS tsvector)") if pg else ("terms", ":terms")
    stmt = text(
        f"UPDATE lexical_chunk SET text = :text, {column} = {value} "
        "WHERE dataset_id = :d AND job_id = :j AND chunk_id = :cid"
    )
    n = 0
    with engine.begin() as conn:
        for cid, value_text in texts.items():
            toks = index_tokens(value_text)
            terms = _tsvector(toks) if pg else " ".join(toks).translate(_FTS5_MARKS)
            n += conn.execute(
                stmt, {"text": value_text, "terms": terms, "d": dataset_id, "j": job_id, "cid": cid}
            ).rowcount
    return n


# --- reading --------------------------------------------------------------------------------------


def iter_rows(engine: Engine, dataset_id: int, *, page_size: int = 5000):
    """(chunk_id, job_id, document_id, position) of every row of a dataset, page by page."""
    last = ""
    while True:
        with engine.connect() as conn:
            page = conn.execute(
                text(
                    "SELECT chunk_id, job_id, document_id, position FROM lexical_chunk "
                    "WHERE dataset_id = :d AND chunk_id > :last ORDER BY chunk_id LIMIT :n"
                ),
                {"d": dataset_id, "last": last, "n": page_size},
            ).all()
        if not page:
            return
        yield [tuple(r) for r in page]
        if len(page) < page_size:
            return
        last = page[-1][0]


def get_fields(engine: Engine, dataset_id: int, chunk_ids: Sequence[str]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    with engine.connect() as conn:
        for start in range(0, len(chunk_ids), BATCH):
            for cid, jid, did, pos in conn.execute(
                text(
                    "SELECT chunk_id, job_id, document_id, position FROM lexical_chunk "
                    "WHERE dataset_id = :d AND chunk_id IN :ids"
                ).bindparams(_expanding("ids")),
                {"d": dataset_id, "ids": list(chunk_ids[start : start + BATCH])},
            ):
                out[cid] = {"job_id": jid, "document_id": did, "position": pos}
    return out


def count_job(engine: Engine, job_id: int) -> int:
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT COUNT(*) FROM lexical_chunk WHERE job_id = :j"), {"j": job_id}
        ).scalar_one()


@dataclass(frozen=True)
class ChunkRow:
    chunk_id: str
    position: int
    page: int
    text: str
    enabled: bool = True  # False: switched off (kept, left out of search)


# A row of lexical_chunk l that is not switched off (the disabled_chunk table, sluice.ops.chunks).
_ENABLED = (
    "NOT EXISTS (SELECT 1 FROM disabled_chunk x WHERE x.dataset_id = l.dataset_id "
    "AND x.chunk_id = l.chunk_id)"
)


def job_chunks(engine: Engine, job_id: int, *, offset: int = 0, limit: int = 50) -> list[ChunkRow]:
    """A job's chunks in order (the document view), one page of them."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                f"SELECT l.chunk_id, l.position, l.page, l.text, {_ENABLED} FROM lexical_chunk l "
                "WHERE l.job_id = :j ORDER BY l.position LIMIT :n OFFSET :o"
            ),
            {"j": job_id, "n": limit, "o": offset},
        )
        return [ChunkRow(r[0], r[1], r[2], r[3], bool(r[4])) for r in rows]


def neighbours(
    engine: Engine, dataset_id: int, chunk_ids: Sequence[str], reach: int
) -> dict[str, tuple[int, list[tuple[int, str]]]]:
    """For each chunk id of the dataset: its position, and (position, text) of its job's chunks
    from ``reach`` positions before it to ``reach`` after it, itself included, in order."""
    if not chunk_ids:
        return {}
    stmt = text(
        "SELECT c.chunk_id, c.position, n.position, n.text FROM lexical_chunk c "
        "JOIN lexical_chunk n ON n.job_id = c.job_id AND n.dataset_id = c.dataset_id "
        "AND n.position BETWEEN c.position - :r AND c.position + :r "
        "WHERE c.dataset_id = :d AND c.chunk_id IN :ids ORDER BY c.chunk_id, n.position"
    ).bindparams(_expanding("ids"))
    out: dict[str, tuple[int, list[tuple[int, str]]]] = {}
    with engine.connect() as conn:
        for cid, own, position, value in conn.execute(
            stmt, {"r": reach, "d": dataset_id, "ids": list(chunk_ids)}
        ):
            out.setdefault(cid, (int(own), []))[1].append((int(position), value))
    return out


def chunk_places(engine: Engine, chunk_id: str) -> list[tuple[int, int, int]]:
    """(dataset id, document id, job id) of every row holding this chunk id."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT dataset_id, document_id, job_id FROM lexical_chunk WHERE chunk_id = :c "
                "ORDER BY dataset_id"
            ),
            {"c": chunk_id},
        )
        return [(int(a), int(b), int(c)) for a, b, c in rows]


def count_job_disabled(engine: Engine, job_id: int) -> int:
    """A job's chunks that are switched off (kept, left out of search)."""
    with engine.connect() as conn:
        return conn.execute(
            text(f"SELECT COUNT(*) FROM lexical_chunk l WHERE l.job_id = :j AND NOT {_ENABLED}"),
            {"j": job_id},
        ).scalar_one()


def count_disabled(engine: Engine, dataset_id: int) -> int:
    """Chunks switched off in a dataset, of its live documents."""
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT COUNT(*) FROM disabled_chunk x JOIN document d ON d.id = x.document_id "
                "WHERE x.dataset_id = :d AND d.deleted_at IS NULL"
            ),
            {"d": dataset_id},
        ).scalar_one()


def disabled_ids(engine: Engine, dataset_id: int) -> set[str]:
    """The chunk ids switched off in a dataset."""
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT chunk_id FROM disabled_chunk WHERE dataset_id = :d"), {"d": dataset_id}
        )
        return {r[0] for r in rows}


def _fts5_expr(query: Query, *, loose: bool) -> str:
    if loose:
        expr = " OR ".join(f'"{t}"' + ("*" if lone(t) else "") for t in query.terms)
    else:
        expr = " AND ".join(
            '"' + " ".join(g) + '"' + ("*" if len(g) == 1 and lone(g[0]) else "")
            for g in query.groups
        )
    return expr.translate(_FTS5_MARKS)


def _tsquery_expr(query: Query, *, loose: bool) -> str:
    if loose:
        return " | ".join(f"'{t}'" + (":*" if lone(t) else "") for t in query.terms)
    return " & ".join(
        "(" + " <-> ".join(f"'{t}'" for t in g) + (":*" if len(g) == 1 and lone(g[0]) else "") + ")"
        for g in query.groups
    )


def search(
    engine: Engine,
    *,
    dataset_id: int,
    query: Query,
    n: int,
    filters: Filters | None = None,
    loose: bool = True,
) -> list[LexicalHit]:
    """The best ``n`` chunks of the dataset's active jobs for the query, best first.

    Every group (quoted phrase, typed word) must match; when no chunk has them all and ``loose``
    allows (no quoted phrase), chunks holding any of the tokens answer instead (``strict`` False),
    of a large dataset any but the tokens at least half its chunks hold (``informative``).
    """
    if query.empty or n <= 0:
        return []
    hits = _run(engine, dataset_id, query, n, filters, loose=False)
    if not hits and loose and not query.quoted and len(query.terms) > 1:
        looser = informative(engine, dataset_id, query)
        hits = [
            replace(h, strict=False)
            for h in (_run(engine, dataset_id, looser, n, filters, loose=True) if looser else ())
        ]
    return hits


def informative(engine: Engine, dataset_id: int, query: Query) -> Query | None:
    """The query for its loose match, on SQLite less the tokens at least half the dataset's
    indexed chunks hold once it has ``COMMON_FLOOR`` of them (None when every token is such).

    FTS5's BM25 weighs such a token 1e-6 (its IDF is clamped there), so it adds nothing to a rank
    but its matches: "the" in a five-word question made the loose match rank nearly every chunk
    (1 s p95 at 1,000,000 chunks). Asking costs a walk of at most half a token's matches, unranked.
    PostgreSQL's ``ts_rank`` has no such weight, and counting a dataset's rows there walks them all
    (0.2 to 0.7 s at 1,000,000): its loose match keeps every token.
    """
    if _postgres(engine) or _key(engine, dataset_id) not in _known:
        return query  # SQLite without a full-text table: the loose match finds nothing either
    fts = fts_table(dataset_id)
    with engine.connect() as conn:
        total = _indexed(conn, dataset_id)
        if total < COMMON_FLOOR:
            return query
        half = -(-total // 2)
        held = text(f"SELECT count(*) FROM (SELECT 1 FROM {fts} WHERE {fts} MATCH :q LIMIT :n) h")
        kept = tuple(
            t
            for t in query.terms
            if conn.execute(held, {"q": _fts5_expr(_one(t), loose=True), "n": half}).scalar_one()
            < half
        )
    return replace(query, terms=kept) if kept else None


def _one(token: str) -> Query:
    return Query(groups=((token,),), terms=(token,))


def _indexed(conn: Connection, dataset_id: int) -> int:
    """The dataset's rows in its FTS5 table, as BM25 counts them: the first varint of the table's
    averages record (row 1 of its ``_data``), not a count of every row."""
    block = conn.execute(text(f"SELECT block FROM {fts_table(dataset_id)}_data WHERE id = 1"))
    data, value = bytes(block.scalar() or b""), 0
    for i, byte in enumerate(data[:9]):  # SQLite's varint: 7 bits a byte, big-endian, 8 in the 9th
        if i == 8:
            return (value << 8) | byte
        value = (value << 7) | (byte & 0x7F)
        if byte < 0x80:
            break
    return value


def _run(
    engine: Engine, dataset_id: int, query: Query, n: int, filters: Filters | None, *, loose: bool
) -> list[LexicalHit]:
    f = filters or Filters()
    if f.document_ids is not None and not f.document_ids:
        return []
    pg = _postgres(engine)
    ranked_sql, params = _ranking(pg, dataset_id, query, f, loose=loose)
    # Rank in the full-text index alone, then read only the best: carrying every match's text
    # through the join and the sort cost as much as the ranking. When inactive jobs, chunks or
    # documents switched off, or a page range leave fewer than asked, rank more, until every
    # match was seen.
    where = ["l.dataset_id = :d", _ENABLED, "d.disabled_at IS NULL"]  # chunk, document switched on
    pages: dict = {}
    if f.page_from is not None:
        where.append("l.page >= :pf")
        pages["pf"] = f.page_from
    if f.page_to is not None:
        where.append("l.page <= :pt")
        pages["pt"] = f.page_to
    rows_sql = text(
        "SELECT l.id, l.chunk_id, l.document_id, l.job_id, l.position, l.page, l.text, "
        "d.filename, d.media_type FROM lexical_chunk l JOIN document d ON d.id = l.document_id "
        "AND d.active_job_id = l.job_id AND d.deleted_at IS NULL WHERE l.id IN :ids AND "
        + " AND ".join(where)
    ).bindparams(_expanding("ids"))
    params["m"] = max(CANDIDATES, 4 * n)
    with engine.connect() as conn:
        if not pg and _key(engine, dataset_id) not in _known:
            if not _fts_exists(conn, dataset_id):
                return []  # nothing of this dataset was ever indexed
            _known.add(_key(engine, dataset_id))
        read = 0  # the best ids already read (a later round ranks them again, reads only more)
        rows: list = []
        while True:
            best = conn.execute(ranked_sql, params).all()
            scores = {int(i): float(score) for i, score in best}
            ids = list(scores)
            while len(rows) < n and read < len(ids):  # best first, BATCH ids a statement
                part = ids[read : read + max(BATCH, min(n, READ_MAX))]
                rows += conn.execute(rows_sql, {"d": dataset_id, **pages, "ids": part}).all()
                read += len(part)
            if len(rows) >= n or len(best) < params["m"]:
                rows = [r for r in rows if int(r[0]) in scores]  # a write may have moved them
                rows.sort(key=lambda r: (-scores[int(r[0])], r[1]))
                return [_hit(r[1:], scores[int(r[0])]) for r in rows[:n]]
            params["m"] *= 8


def _ranking(pg: bool, dataset_id: int, query: Query, f: Filters, *, loose: bool):
    """The statement that ranks the dataset's matches (ids and scores, best first, ``:m`` of
    them), and its parameters but ``m``.

    The documents a filter allows (a metadata filter's list, a file name, a media type) narrow the
    ranking itself, so only their matches are scored and sorted: ranked first and filtered after,
    a filter allowing a tenth of the documents left a tenth of each round's best, and the rounds
    and a count of every match made a search at 100,000 chunks cost 1.7 s (p95)."""
    params: dict = {"d": dataset_id}
    scope = []
    if f.document_ids is not None:
        scope.append(id_lists.sql("document_id", "docs", f.document_ids, params, pg=pg))
    named = []
    if f.filename:
        named.append("LOWER(filename) LIKE :fn")
        params["fn"] = f"%{f.filename.lower()}%"
    if f.media_type:
        named.append("media_type = :mt")
        params["mt"] = f.media_type
    if named:
        scope.append(
            "document_id IN (SELECT id FROM document WHERE dataset_id = :d AND "
            + " AND ".join(named)
            + ")"
        )
    if pg:
        params["q"] = _tsquery_expr(query, loose=loose)
        narrowed = "".join(f" AND {c}" for c in scope)
        ranked = (
            "SELECT id, ts_rank(tsv, q.q, 1) AS score FROM lexical_chunk, CAST(:q AS tsquery) "
            f"AS q(q) WHERE tsv @@ q.q AND dataset_id = :d{narrowed} ORDER BY score DESC LIMIT :m"
        )
    else:
        params["q"] = _fts5_expr(query, loose=loose)
        fts = fts_table(dataset_id)
        # The allowed rows' ids, read from the document index alone, are a list each match is
        # looked up in; the unary + keeps SQLite from handing that list to FTS5 as rowids to
        # seek one by one (for a tenth of 100,000 chunks: 0.9 s instead of 8 ms).
        narrowed = (
            f" AND +rowid IN (SELECT id FROM lexical_chunk WHERE {' AND '.join(scope)})"
            if scope
            else ""
        )
        ranked = (
            f"SELECT rowid AS id, -bm25({fts}) AS score FROM {fts} WHERE {fts} MATCH :q"
            f"{narrowed} ORDER BY score DESC LIMIT :m"
        )
    return text(ranked), params


def _hit(r, score: float) -> LexicalHit:
    return LexicalHit(
        chunk_id=r[0],
        document_id=r[1],
        job_id=r[2],
        position=r[3],
        page=r[4],
        text=r[5],
        filename=r[6],
        media_type=r[7],
        score=score,
    )


# --- highlighting ---------------------------------------------------------------------------------


def matched_spans(value: str, query: Query) -> list[tuple[int, int]]:
    """Where the query's tokens occur in a text, as (start, end) character offsets."""
    wanted = set(query.terms)
    if not wanted:
        return []
    spans: list[tuple[int, int]] = []
    for m in _WORD.finditer(value):
        word = m.group()
        norm = normalise(word)
        if len(norm) != len(word):  # offsets would drift: judge the word as a whole
            if any(t in wanted for t in [*_word_tokens(norm), *filter(lone, norm)]):
                spans.append(m.span())
            continue
        pos = 0
        for i, part in enumerate(_CJK.split(norm)):
            if i % 2 == 0:
                if part and part in wanted:
                    spans.append((m.start() + pos, m.start() + pos + len(part)))
            else:
                spans.extend(
                    (m.start() + pos + a, m.start() + pos + b) for a, b in _unit_spans(part, wanted)
                )
            pos += len(part)
    merged: list[tuple[int, int]] = []
    for s, e in sorted(spans):
        if merged and s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(e, merged[-1][1]))
        else:
            merged.append((s, e))
    return merged


def _unit_spans(part: str, wanted: set[str]) -> list[tuple[int, int]]:
    """Where a CJK run's wanted bigrams and lone characters are, as offsets in the run (a Thai
    character with its marks is one character)."""
    units = [m.span() for m in _UNIT.finditer(part)]
    spans = []
    for k, (s, e) in enumerate(units):
        if k + 1 < len(units) and part[s : units[k + 1][1]] in wanted:
            spans.append((s, units[k + 1][1]))
        elif part[s:e] in wanted:  # a one-character run, or a lone typed character
            spans.append((s, e))
    return spans


def snippet(
    value: str, query: Query, *, width: int = 240, mark: tuple[str, str] = ("**", "**")
) -> str:
    """A window of the text around the first match, matched words wrapped in ``mark``."""
    flat = " ".join(value.split())
    spans = matched_spans(flat, query)
    if not spans:
        return flat[:width] + ("..." if len(flat) > width else "")
    start = max(0, spans[0][0] - width // 3)
    end = min(len(flat), start + width)
    out, at = [], start
    for s, e in spans:
        if e <= start or s >= end:
            continue
        s, e = max(s, start), min(e, end)
        out.append(flat[at:s])
        out.append(f"{mark[0]}{flat[s:e]}{mark[1]}")
        at = e
    out.append(flat[at:end])
    return ("..." if start > 0 else "") + "".join(out) + ("..." if end < len(flat) else "")
