"""Throughput of the cluster with one and with two worker hosts, each limited to one core
(``taskset``), with the real model (offline, as the workers load it): the same corpus of fresh
documents each time (no chunk in the embedding cache), queued while the queue is paused, then the
pause lifted once the workers have loaded the model. Chunks per second are counted between the
first job's start and the last one's end, as the job database records them.

Run at the end of the cluster test (a small corpus) and by ``python -m bench.cluster_throughput``
(a larger one, its row in BENCHMARKS.md).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

from tests.cluster.netns import Host
from tests.cluster.recipe import sluice, wait_until

REAL_MODEL = {  # what the FAST settings of the fault run change back for a measurement
    "SLUICE_EMBEDDER": "sentence-transformers",
    "SLUICE_EMBED_BATCH_SIZE": "32",
    "SLUICE_LEASE_SECONDS": "60",
    "SLUICE_HEARTBEAT_SECONDS": "5",
}


@dataclass
class Run:
    hosts: int
    documents: int
    chunks: int
    seconds: float

    @property
    def chunks_per_second(self) -> float:
        return self.chunks / self.seconds if self.seconds else 0.0


@dataclass
class Throughput:
    one: Run
    two: Run
    load_average: tuple[float, float, float]

    @property
    def ratio(self) -> float:
        return self.two.chunks_per_second / self.one.chunks_per_second

    def to_dict(self) -> dict:
        return {
            "one": asdict(self.one),
            "two": asdict(self.two),
            "ratio": self.ratio,
            "load_average": list(self.load_average),
        }

    def lines(self) -> list[str]:
        one, two = self.one, self.two
        return [
            f"cluster: throughput, real model, each worker host on one core: one host "
            f"{one.chunks_per_second:.1f} chunks/s ({one.chunks} chunks of {one.documents} "
            f"documents in {one.seconds:.1f} s), two hosts {two.chunks_per_second:.1f} chunks/s "
            f"({two.chunks} in {two.seconds:.1f} s): ratio {self.ratio:.2f}",
            "cluster: load average before the measurement "
            + " ".join(f"{x:.2f}" for x in self.load_average)
            + " (a shared machine: not idle)",
        ]


def document(i: int, run: str) -> bytes:
    """10 chunks, every word of its own run (nothing cached)."""
    words = ["ledger", "harbour", "signal", "orchard", "furnace", "lantern", "meadow", "copper"]
    parts = []
    for p in range(10):
        body = " ".join(f"{words[(i + p + j) % len(words)]}{run}{i}x{p}y{j}" for j in range(34))
        parts.append(f"Report {run} number {i}, section {p}. {body}.")
    return "\n\n".join(parts).encode()


def measure(
    *,
    engine,
    entry: Host,
    entry_env: dict[str, str],
    workers: list[Host],
    envs: dict[str, str | dict[str, str]],
    upload,
    documents: int,
) -> Throughput:
    """One run with ``workers[0]`` alone, then one with both (its worker still up); every worker
    process stopped before and after. ``upload(data, name) -> job id`` sends through the entry
    host."""
    load = os.getloadavg()
    restart_api(entry, {**entry_env, **REAL_MODEL})
    for host in workers:
        host.kill_all()
    runs = []
    for n in (1, 2):  # the first host's worker stays up for the second run: one model load less
        runs.append(
            _one_run(engine, entry, entry_env, workers[:n], envs, upload, documents, f"r{n}")
        )
    for host in workers:
        host.kill_all()
    return Throughput(runs[0], runs[1], load)


def restart_api(entry: Host, env: dict[str, str]) -> None:
    """The entry host's API again with the real model's settings: an upload's pipeline version is
    decided there, and the workers run only jobs of their own version."""
    api = [p for p in entry.procs if list(p.args)[-2:] == ["serve", "api"]]  # type: ignore[arg-type]
    for proc in api:
        proc.kill()
        proc.wait(10)
        entry.procs.remove(proc)
    entry.start("api-real-model", sluice("serve", "api"), {**env, "SLUICE_API_HOSTS": entry.ip})
    wait_until(lambda: _api_up(entry), timeout=90, what="the API is back")


def _api_up(entry: Host) -> bool:
    return "Application startup complete" in entry.log("api-real-model")


def _one_run(engine, entry, entry_env, hosts, envs, upload, documents, tag) -> Run:
    paused = entry.run(sluice("pause", "--reason", "throughput run: queue the corpus"), entry_env)
    assert paused.returncode == 0, paused.stderr
    ids = [upload(document(i, tag), f"{tag}-{i:03d}.txt") for i in range(documents)]
    for core, host in enumerate(hosts):
        if host.pids():
            continue  # up since the run before, its model loaded
        log = f"worker-{tag}"
        env = {**envs[host.name], **REAL_MODEL}
        host.start(log, ["taskset", "-c", str(core), *sluice("serve", "worker")], env)
        wait_until(
            lambda h=host, w=log: "loaded all-MiniLM" in h.log(w),
            timeout=180,
            what=f"{host.name} loaded the model",
        )
    resumed = entry.run(sluice("resume"), entry_env)
    assert resumed.returncode == 0, resumed.stderr
    wait_until(lambda: _final(engine, ids), timeout=600, what=f"the {tag} corpus finished")
    rows = _rows(
        engine,
        "SELECT status, chunk_count, started_at, finished_at FROM job WHERE id = ANY(:ids)",
        ids=ids,
    )
    assert [r[0] for r in rows] == ["succeeded"] * documents, rows
    claimed = {r[0].split(":")[0] for r in _claims(engine, ids)}
    assert claimed == {h.name for h in hosts}, claimed  # every host of the run took jobs
    seconds = (max(r[3] for r in rows) - min(r[2] for r in rows)).total_seconds()
    return Run(len(hosts), documents, sum(r[1] for r in rows), seconds)


def _rows(engine, sql: str, **params) -> list:
    from sqlalchemy import text

    with engine.connect() as conn:
        return list(conn.execute(text(sql), params).all())


def _final(engine, ids: list[int]) -> bool:
    rows = _rows(engine, "SELECT status FROM job WHERE id = ANY(:ids)", ids=ids)
    return len(rows) == len(ids) and all(r[0] in ("succeeded", "failed", "cancelled") for r in rows)


def _claims(engine, ids: list[int]) -> list:
    sql = "SELECT actor FROM job_event WHERE kind = 'claimed' AND job_id = ANY(:ids)"
    return _rows(engine, sql, ids=ids)


def write_result(result: Throughput, path: Path) -> None:
    import json

    path.write_text(json.dumps(result.to_dict(), indent=2))
