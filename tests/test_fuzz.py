"""Fuzz: a few hundred mutated PDFs (byte flips, truncations, spliced and dropped ranges, damaged
streams and cross-reference tables), made deterministically from the sample corpus.

Every one ends classified: refused at upload with an error kind, or its job ends succeeded, or
failed with an error kind, a code other than "internal_error" (which would mean nobody recognised
the failure) and a message. A batch also goes through a real huey_consumer, which must stay alive.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from sluice.ops.ingest import ingest_bytes
from sluice.pipeline.running.runner import run_job
from sluice.storage.models import JobStatus
from tests.support.helpers import job, wait_for

SEED = 20240611
CASES = 300
WORKER_CASES = 30
BIG = 1_000_000  # samples above this size are mutated less often (they take longer to parse)


def load_corpus(samples: Path) -> list[bytes]:
    return [p.read_bytes() for p in sorted(samples.glob("*.pdf"))]


def _flip(rng: random.Random, data: bytes, donors: list[bytes]) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 64)):
        i = rng.randrange(len(out))
        out[i] ^= 1 << rng.randrange(8)
    return bytes(out)


def _truncate(rng: random.Random, data: bytes, donors: list[bytes]) -> bytes:
    return data[: rng.randint(1, len(data) - 1)]


def _splice(rng: random.Random, data: bytes, donors: list[bytes]) -> bytes:
    donor = rng.choice(donors)
    start = rng.randrange(len(donor))
    piece = donor[start : start + rng.randint(16, 8192)]
    at = rng.randrange(len(data))
    if rng.random() < 0.5:
        return data[:at] + piece + data[at:]  # inserted: every later offset shifts
    return data[:at] + piece + data[at + len(piece) :]  # overwritten in place


def _zero_range(rng: random.Random, data: bytes, donors: list[bytes]) -> bytes:
    at = rng.randrange(len(data))
    n = rng.randint(1, 4096)
    return data[:at] + bytes(min(n, len(data) - at)) + data[at + n :]


def _drop_range(rng: random.Random, data: bytes, donors: list[bytes]) -> bytes:
    at = rng.randrange(len(data))
    return data[:at] + data[at + rng.randint(1, 4096) :]


def _repeat_range(rng: random.Random, data: bytes, donors: list[bytes]) -> bytes:
    at = rng.randrange(len(data))
    piece = data[at : at + rng.randint(1, 2048)]
    return data[:at] + piece * rng.randint(2, 20) + data[at:]


def _damage_near(token: bytes) -> Callable[[random.Random, bytes, list[bytes]], bytes]:
    """Garble the bytes right after a random occurrence of ``token`` (a stream, xref,
    trailer...)."""

    def mutate(rng: random.Random, data: bytes, donors: list[bytes]) -> bytes:
        spots, i = [], data.find(token)
        while i != -1 and len(spots) < 500:
            spots.append(i)
            i = data.find(token, i + 1)
        if not spots:
            return _flip(rng, data, donors)
        at = rng.choice(spots) + len(token)
        n = rng.randint(1, 64)
        return data[:at] + rng.randbytes(n) + data[at + n :]

    return mutate


MUTATIONS = {
    "flip": _flip,
    "truncate": _truncate,
    "splice": _splice,
    "zero": _zero_range,
    "drop": _drop_range,
    "repeat": _repeat_range,
    "stream": _damage_near(b"stream\n"),
    "xref": _damage_near(b"xref"),
    "startxref": _damage_near(b"startxref"),
    "obj": _damage_near(b" obj"),
    "trailer": _damage_near(b"trailer"),
}


def mutated_pdfs(corpus: list[bytes], n: int, seed: int) -> list[tuple[str, bytes]]:
    """``n`` distinct mutants: one to three mutations each, the names saying which."""
    rng = random.Random(seed)
    weights = [0.2 if len(d) > BIG else 1.0 for d in corpus]
    out: list[tuple[str, bytes]] = []
    seen: set[bytes] = set(corpus)
    while len(out) < n:
        base = rng.choices(range(len(corpus)), weights)[0]
        data = corpus[base]
        ops = rng.sample(sorted(MUTATIONS), rng.choice((1, 1, 2, 3)))
        for op in ops:
            data = MUTATIONS[op](rng, data, corpus) or b"%"
        if data in seen:
            continue
        seen.add(data)
        out.append((f"{len(out):03d}-s{base:02d}-{'+'.join(ops)}.pdf", data))
    return out


def check_classified(ctx, name: str, result, outcomes: Counter) -> None:
    """One mutant: refused at upload with a kind, or its job in a classified final state."""
    if not result.accepted:
        assert result.error_kind and result.error_code and result.message, (name, result)
        outcomes[("refused", result.error_kind, result.error_code)] += 1
        return
    j = job(ctx, result.job_id)
    if j.status == JobStatus.succeeded:
        assert j.chunk_count >= 1 and j.error_kind is None, (name, j)
        outcomes[("succeeded", "", "")] += 1
        return
    assert j.status == JobStatus.failed, (name, j.status, j.error_message)
    assert j.error_kind is not None and j.error_code and j.error_message, (name, j)
    assert j.error_code not in ("internal_error", "service_unavailable"), (
        name,
        j.error_message,
        j.error_detail,
    )
    outcomes[("failed", j.error_kind.value, j.error_code)] += 1


def summary(outcomes: Counter) -> str:
    return "\n".join(f"{n:4d}  {' / '.join(filter(None, k))}" for k, n in sorted(outcomes.items()))


def test_mutated_pdfs_all_end_classified(make_ctx, samples):
    # One attempt: anything classified transient would otherwise wait in retrying.
    ctx = make_ctx(SLUICE_MAX_ATTEMPTS="1")
    corpus = load_corpus(samples)
    outcomes: Counter = Counter()
    for name, data in mutated_pdfs(corpus, CASES, SEED):
        result = ingest_bytes(ctx, data, dataset="default", filename=name)
        if result.accepted and not result.duplicate:
            outcome = run_job(result.job_id, ctx=ctx)
            assert outcome.result in ("succeeded", "failed"), (name, outcome)
        check_classified(ctx, name, result, outcomes)
    print(f"\n{CASES} mutated PDFs (seed {SEED}):\n{summary(outcomes)}")
    assert sum(outcomes.values()) == CASES
    # The mutants exercise both sides: some still read, many are refused or fail.
    assert outcomes[("succeeded", "", "")] > 0
    assert sum(n for k, n in outcomes.items() if k[0] != "succeeded") > 0


def test_a_worker_survives_a_batch_of_mutated_pdfs(make_ctx, samples, start_worker):
    ctx = make_ctx(SLUICE_MAX_ATTEMPTS="1")
    from sluice.pipeline.queueing.publishing import publish

    worker = start_worker(workers=2)
    corpus = load_corpus(samples)
    results = [
        (name, ingest_bytes(ctx, data, dataset="default", filename=name, publish=publish))
        for name, data in mutated_pdfs(corpus, WORKER_CASES, SEED + 1)
    ]
    job_ids = [r.job_id for _, r in results if r.accepted]
    wait_for(ctx, job_ids, timeout=180)
    outcomes: Counter = Counter()
    for name, result in results:
        check_classified(ctx, name, result, outcomes)
    assert worker.alive(), worker.output()[-3000:]
    # Still working afterwards: an intact sample goes through.
    good = ingest_bytes(ctx, corpus[0], dataset="after", filename="intact.pdf", publish=publish)
    assert wait_for(ctx, [good.job_id], timeout=60)[0].status == JobStatus.succeeded
    assert worker.alive()
    print(f"\nworker batch of {WORKER_CASES}:\n{summary(outcomes)}")
