"""The small-document and tiny-job figures of ``bench.run`` alone, in a few minutes:

    python -m bench.small [--documents 200] [--tiny 300] [--rounds 1]

Per round: the raw limit of the model on the small documents' chunks (``bench.encode``, the
precision ``auto`` picks), then Sluice on the same 1-3 page PDFs (one worker process, the
Procfile's 4 threads, or each of ``--threads 4,8``), then tiny .txt jobs through the real queue
with 2 and 4 worker threads (``--tiny-threads``; ``bench.orchestration``). Prints one JSON line per
round, with the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from bench import corpus as corpus_mod
from bench.run import BATCH, SMALL_THREADS, small_limit
from bench.system import Services, clean_environment


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=200)
    parser.add_argument("--tiny", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--threads",
        default=str(SMALL_THREADS),
        help="worker threads for the small documents, comma-separated to compare (default: the "
        "Procfile's)",
    )
    parser.add_argument(
        "--tiny-threads", default="2,4", help="worker threads for the tiny jobs, comma-separated"
    )
    args = parser.parse_args(argv)
    clean_environment()
    from bench.orchestration import sluice_jobs_per_second
    from bench.sluice_runs import ingest_corpus
    from sluice.pipeline.running.embed import resolve_precision

    auto = resolve_precision("auto")
    with Services() as svc:
        work = svc.workdir
        small = corpus_mod.generate_small(work / "small", documents=args.documents)
        warm = corpus_mod.generate_big(work / "warm" / "warm-up.pdf", pages=2, seed=99)
        for r in range(args.rounds):
            load = [os.getloadavg()[0]]
            limit = small_limit(svc, small, auto)[f"raw_{auto}_packed"]
            limit_cps = limit["chunks"] / limit["seconds"]
            sluice = {}
            for threads in [int(t) for t in args.threads.split(",")]:
                run = ingest_corpus(
                    svc,
                    small,
                    name=f"small-{r}-w{threads}",
                    warm=warm,
                    workers=threads,
                    settings={
                        "SLUICE_EMBED_BATCH_SIZE": str(BATCH),
                        "SLUICE_EMBED_PRECISION": "auto",
                    },
                )
                sluice[threads] = run["chunks"] / run["seconds"]
            tiny = {
                f"w{w}": sluice_jobs_per_second(svc, jobs=args.tiny, workers=w)["jobs_per_s"]
                for w in [int(t) for t in args.tiny_threads.split(",") if t]
            }
            load.append(os.getloadavg()[0])
            print(
                json.dumps(
                    {
                        "round": r + 1,
                        "precision": auto,
                        "small_limit_chunks_per_s": round(limit_cps, 1),
                        "small_sluice_chunks_per_s": {
                            f"w{w}": round(cps, 1) for w, cps in sluice.items()
                        },
                        "small_ratio": {
                            f"w{w}": round(cps / limit_cps, 3) for w, cps in sluice.items()
                        },
                        "small_chunks": run["chunks"],
                        "tiny_jobs_per_s": {k: round(v, 1) for k, v in tiny.items()},
                        "load": load,
                    }
                ),
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
