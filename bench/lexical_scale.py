"""The word index alone at size, under two vocabularies: ``bench.scale``'s (129 distinct words, each
in 46 to 98% of chunks, so five typed words match a twentieth of the dataset) and one drawn as
natural text is (Zipf's law over 50,000 words: a few words in most chunks, most words in few).
Both engines rank every match before their ``LIMIT`` (no skipping of the WAND kind), so what a
search costs at size depends on how many chunks its words share; this tells the bench corpus's
cost from a corpus's.

    python -m bench.lexical_scale [--sizes 100000,300000,1000000] [--out BENCHMARKS.md]

A SQLite job database of its own per vocabulary (documents, succeeded jobs and the lexical rows
straight in, the FTS5 triggers filling the dataset's table); searches through
``sluice.storage.lexical.search``, as the search path asks it: a third rare codes, a third quoted
two-word phrases of frequent words, a third five words drawn as the text is.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import numpy as np
from sqlalchemy import text
from sqlmodel import Session

from bench.report import load_average, write_section
from bench.scale import machine
from bench.scale_load import PER_DOC, WORDS, vocabulary
from sluice.ops.search import LEXICAL_DEPTH
from sluice.storage import lexical
from sluice.storage.db import ensure_dataset, get_engine
from sluice.storage.models import Document, Job, JobStatus, Stage, utcnow

TITLE = "## The word index at size, by vocabulary"
DISTINCT = 50_000  # the natural vocabulary's words
SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]  # 70: three make 343,000 words


def natural() -> tuple[list[str], np.ndarray]:
    """50,000 invented words and their Zipf-Mandelbrot weights (1 / (rank + 2.7)), as English."""
    rng = random.Random(5)
    seen: dict[str, None] = {}
    while len(seen) < DISTINCT:
        seen.setdefault("".join(rng.choice(SYLLABLES) for _ in range(3)), None)
    weights = 1.0 / (np.arange(DISTINCT) + 2.7)
    return list(seen), weights / weights.sum()


class Grower:
    """One dataset's lexical rows, grown to a size: ``draw`` gives the word indexes of n words."""

    def __init__(self, folder: Path, kind: str) -> None:
        self.engine = get_engine(f"sqlite:///{folder / kind}.db")
        self.rng = np.random.default_rng(11)
        if kind == "bench":
            self.words = sorted(set(vocabulary()))
            where = {w: i for i, w in enumerate(self.words)}
            picks = np.array([where[w] for w in vocabulary()])
            self.draw = lambda n: picks[self.rng.integers(0, len(picks), size=n)]
            self.frequent = vocabulary()[:120]
        else:
            self.words, p = natural()
            self.draw = lambda n: self.rng.choice(DISTINCT, size=n, p=p)
            self.frequent = self.words[:120]
        with Session(self.engine) as session:
            self.dataset_id = int(ensure_dataset(session=session, name="words").id or 0)
            session.commit()
        lexical.ensure_dataset_index(self.engine, self.dataset_id)
        self.chunks, self.documents = 0, 0
        self.codes: list[str] = []

    def grow(self, size: int) -> None:
        while self.chunks < size:
            self._documents(min(50, -(-(size - self.chunks) // PER_DOC)))

    def _documents(self, n: int) -> None:
        rows = []
        with Session(self.engine) as session:
            for _ in range(n):
                sha = hashlib.sha256(f"words-{self.documents}".encode()).hexdigest()
                self.documents += 1
                doc = Document(
                    dataset_id=self.dataset_id,
                    sha256=sha,
                    size=1,
                    blob_key=sha,
                    media_type="text/plain",
                    filename=f"{sha[:8]}.txt",
                )
                session.add(doc)
                session.flush()
                now = utcnow()
                job = Job(
                    document_id=doc.id,
                    dataset_id=self.dataset_id,
                    filename=doc.filename,
                    idempotency_key=sha,
                    pipeline_version="v1",
                    status=JobStatus.succeeded,
                    stage=Stage.done,
                    started_at=now,
                    finished_at=now,
                )
                session.add(job)
                session.flush()
                doc.active_job_id = job.id
                picks = self.draw(PER_DOC * WORDS).reshape(PER_DOC, WORDS)
                for p in range(PER_DOC):
                    body = " ".join(self.words[i] for i in picks[p])
                    if self.rng.random() < 1 / 97:
                        code = f"QZ-{doc.id:05d}{p:03d}"
                        self.codes.append(code)
                        body += f" reference {code} filed."
                    rows.append(
                        {
                            "d": self.dataset_id,
                            "c": f"{sha[:16]}-{p}",
                            "doc": doc.id,
                            "j": job.id,
                            "p": p,
                            "t": body,
                            "terms": " ".join(lexical.index_tokens(body)),
                        }
                    )
            session.connection().execute(
                text(
                    "INSERT INTO lexical_chunk (dataset_id, chunk_id, document_id, job_id, "
                    "position, page, text, terms) VALUES (:d, :c, :doc, :j, :p, 1, :t, :terms)"
                ),
                rows,
            )
            session.commit()
        self.chunks += len(rows)

    def optimize(self) -> None:
        """Merge the FTS5 table's segments into one (many transactions of rows leave many)."""
        fts = lexical.fts_table(self.dataset_id)
        with self.engine.begin() as conn:
            conn.execute(text(f"INSERT INTO {fts}({fts}) VALUES ('optimize')"))

    def queries(self, n: int) -> list[str]:
        rng = random.Random(3)
        out = []
        for i in range(n):
            if i % 3 == 0 and self.codes:
                out.append(rng.choice(self.codes))
            elif i % 3 == 1:
                out.append('"' + " ".join(rng.choice(self.frequent) for _ in "ab") + '"')
            else:
                out.append(" ".join(self.words[j] for j in self.draw(5)))
        return out

    def measure(self, typed: list[str]) -> dict:
        """p50 / p95 ms of each kind of query, as deep as hybrid asks its lexical ranker."""
        lexical.search(self.engine, dataset_id=self.dataset_id, query=lexical.parse_query("x"), n=1)
        times: dict[str, list[float]] = {"codes": [], "phrases": [], "five words": []}
        for i, q in enumerate(typed):
            t = time.perf_counter()
            parsed = lexical.parse_query(q)
            lexical.search(self.engine, dataset_id=self.dataset_id, query=parsed, n=LEXICAL_DEPTH)
            times[("codes", "phrases", "five words")[i % 3]].append(
                1000 * (time.perf_counter() - t)
            )
        times["all"] = [x for v in list(times.values()) for x in v]
        out = {}
        for kind, values in times.items():
            values.sort()
            out[kind] = (statistics.median(values), values[int(0.95 * (len(values) - 1))])
        return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lexical_scale")
    parser.add_argument("--sizes", default="100000,300000,1000000")
    parser.add_argument("--queries", type=int, default=90)
    parser.add_argument("--vocabularies", default="bench,natural")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    started, load = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), [load_average()]
    results: dict[tuple[str, int], dict] = {}
    with tempfile.TemporaryDirectory(prefix="sluice-words-") as folder:
        for kind in args.vocabularies.split(","):
            grower = Grower(Path(folder), kind)
            for size in sizes:
                t = time.monotonic()
                grower.grow(size)
                print(f"{kind} {grower.chunks:,} chunks in {time.monotonic() - t:.0f} s",
                      file=sys.stderr, flush=True)  # fmt: skip
                typed = grower.queries(args.queries)
                with mock.patch.object(lexical, "COMMON_FLOOR", 10**15):
                    results[f"{kind}, every token loose", size] = grower.measure(typed)
                results[kind, size] = grower.measure(typed)
                if size == sizes[-1]:
                    grower.optimize()
                    results[f"{kind}, after FTS5 optimize", size] = grower.measure(typed)
                print(kind, size, results[kind, size], file=sys.stderr, flush=True)
            grower.engine.dispose()
    load.append(load_average())
    section = report(results, sizes, started, load, args.queries)
    print(section)
    if args.out:
        write_section(args.out, TITLE, section)
    return 0


def report(results: dict, sizes: list[int], started: str, load: list[str], queries: int) -> str:
    kinds = ("all", "codes", "phrases", "five words")
    lines = [
        TITLE,
        "",
        f"`python -m bench.lexical_scale --sizes {','.join(map(str, sizes))} --queries {queries}`"
        f" ({started}). Machine: {machine()}; load average {load[0]} at start, {load[1]} at end "
        f"(1/5/15 min). `lexical.search` for {LEXICAL_DEPTH} chunks (hybrid's lexical ranker at "
        "k=10), SQLite;"
        " p50 / p95 ms. The bench vocabulary is `bench.scale`'s; the natural one draws 50,000 "
        'words by Zipf\'s law (weight 1 / (rank + 2.7)). "Every token loose": the loose match'
        " (a question no chunk holds every word of) ranks every chunk holding any token, as before"
        ' `lexical.informative`; "after FTS5 optimize": the same index merged into one segment.',
        "",
        "| vocabulary | chunks | " + " | ".join(kinds) + " |",
        "| --- | --- |" + " --- |" * len(kinds),
    ]
    for (kind, size), got in results.items():
        cells = " | ".join(f"{got[k][0]:.1f} / {got[k][1]:.1f}" for k in kinds)
        lines.append(f"| {kind} | {size:,} | {cells} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
