"""Sluice on four hosts with no shared disk, as docs/deploy.md describes, with one host killed and
one cut off (``make cluster-test``, as root; about two minutes).

    services  10.231.77.10  PostgreSQL, queue and cache Redis (passwords), Chroma behind its gate,
                            the object store (moto's S3 server), nginx: TLS for Chroma and S3
    worker1   10.231.77.21  sluice serve worker
    worker2   10.231.77.22  sluice serve worker
    entry     10.231.77.30  sluice serve api and console, nginx: TLS for both

The run: 60 documents uploaded through the entry host's API over TLS; both workers take jobs;
worker2's link is cut for longer than a lease while it holds a job (worker1 takes the job back and
finishes it; what worker2 writes after the cut is refused by the lease); the queue Redis restarts;
worker1 is killed (every process, SIGKILL) while it holds a job (worker2 takes it back). At the
end: 60 of 60 succeeded, reconcile clean, no chunk twice, every blob in the object store and none
on any host's disk. Then the throughput with one worker host and with two, each on one core, the
real model (tests/cluster/throughput.py): the ratio in the closing lines.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.cluster import recipe, throughput
from tests.cluster.netns import Host, Network
from tests.cluster.recipe import Secrets, sluice, wait_until

pytestmark = [
    pytest.mark.skipif(
        os.environ.get("RUN_CLUSTER_TEST") != "1" or os.geteuid() != 0,
        reason="the cluster run needs root and runs by `make cluster-test`",
    ),
    pytest.mark.timeout(900),
]

N = 60
SLOW_BATCHES = "embed_batch=sleep:0.4"  # a job lasts a few seconds: there is one to kill or cut


def document(i: int) -> bytes:
    """About 14 chunks, every one of its own words (no two chunks alike)."""
    parts = [
        f"Cluster document {i}, part {p}. " + " ".join(f"t{i}-p{p}-w{j}" for j in range(45))
        for p in range(14)
    ]
    return "\n\n".join(parts).encode()


def reachable(ip: str, port: int) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=1):
            return True
    except OSError:
        return False


def test_sixty_documents_across_hosts_with_one_killed_and_one_cut_off():
    base = Path(tempfile.mkdtemp(prefix="sluice-cluster-"))
    os.chmod(base, 0o755)  # the postgres user walks into its data directory
    try:
        with Network(base) as net:
            hosts = {
                "services": net.add("services", 10),
                "worker1": net.add("worker1", 21),
                "worker2": net.add("worker2", 22),
                "entry": net.add("entry", 30),
            }
            for host in hosts.values():
                os.chmod(host.root, 0o755)
            _run(base, **hosts)
    except BaseException:
        print(f"cluster: the hosts' logs are kept in {base}")
        raise
    shutil.rmtree(base, ignore_errors=True)


def _run(base: Path, services: Host, worker1: Host, worker2: Host, entry: Host) -> None:
    s = Secrets()
    ca = recipe.make_certificates(base / "tls", [services, entry])
    pgdata = recipe.start_postgres(services, s.db)
    try:
        queue = _start_services(services, s, base / "tls")
        envs = {h.name: recipe.client_env(h, services, s, ca) for h in (worker1, worker2, entry)}
        token = _start_entry(entry, envs["entry"], s, base / "tls")
        for w in (worker1, worker2):
            w.start(
                "worker", sluice("serve", "worker"), {**envs[w.name], "SLUICE_FAULTS": SLOW_BATCHES}
            )
        story = _ingest_through_faults(services, worker1, worker2, entry, s, ca, token, queue)
        _check_the_end(services, worker1, worker2, entry, s, ca, envs["entry"], story)
        # the killed host runs a worker again, alone (it removes what the kill left)
        worker2.kill_all()
        worker1.start("worker-again", sluice("serve", "worker"), envs["worker1"])
        _settle(story["engine"], entry, ca, token)
        _no_blob_on_any_disk(services, worker1, worker2, entry)
        _throughput(story["engine"], entry, [worker1, worker2], envs, ca, token)
    finally:
        recipe.stop_postgres(services, pgdata)


def _start_services(svc: Host, s: Secrets, tls: Path):
    env = recipe.services_env(svc, s)
    queue = svc.start("queue", sluice("serve", "queue"), env)
    svc.start("cache", sluice("serve", "cache"), env)
    svc.start("chroma", sluice("serve", "chroma"), env)
    moto_env = {
        **recipe.base_env(),
        "AWS_ACCESS_KEY_ID": s.aws_key,
        "AWS_SECRET_ACCESS_KEY": s.aws_secret,
    }
    svc.start(
        "objects",
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", "9000"],
        moto_env,
    )
    conf = recipe.nginx_conf(svc, tls, recipe.services_proxy(svc, s.chroma))
    _nginx(svc, conf, env)
    for port in (5432, 6390, 6391, 8443, 9443):
        wait_until(lambda p=port: reachable(svc.ip, p), timeout=60, what=f"services:{port} listens")
    wait_until(lambda: _chroma_answers(svc, s, tls / "ca.pem"), timeout=60, what="Chroma answers")
    _s3(svc, s, tls / "ca.pem").create_bucket(Bucket=recipe.BUCKET)
    return queue


def _chroma_answers(svc: Host, s: Secrets, ca: Path) -> bool:
    import httpx

    try:
        r = httpx.get(
            f"https://{svc.ip}:8443/api/v2/heartbeat",
            verify=str(ca),
            timeout=2,
            headers={"Authorization": f"Bearer {s.chroma}"},
        )
        refused = httpx.get(f"https://{svc.ip}:8443/api/v2/heartbeat", verify=str(ca), timeout=2)
    except httpx.HTTPError:
        return False
    return r.status_code == 200 and refused.status_code == 401


def _s3(svc: Host, s: Secrets, ca: Path):
    import boto3

    return boto3.session.Session().client(
        "s3",
        endpoint_url=f"https://{svc.ip}:9443",
        region_name="us-east-1",
        verify=str(ca),
        aws_access_key_id=s.aws_key,
        aws_secret_access_key=s.aws_secret,
    )


def _start_entry(entry: Host, env: dict[str, str], s: Secrets, tls: Path) -> str:
    api_env = {**env, "SLUICE_API_HOSTS": entry.ip}
    console_env = {
        **env,
        "SLUICE_CONSOLE_HOSTS": entry.ip,
        "SLUICE_CONSOLE_TRUSTED_PROXIES": "127.0.0.1",
        "SLUICE_CONSOLE_PASSWORD": s.console,
    }
    made = entry.run(sluice("datasets"), env)  # creates the schema on the empty database
    assert made.returncode == 0, made.stderr
    key = entry.run(
        sluice("keys", "create", "cluster", "--dataset", "default", "--scope", "ingest"), env
    )
    assert key.returncode == 0, key.stderr
    entry.start("api", sluice("serve", "api"), api_env)
    entry.start("console", sluice("serve", "console"), console_env)
    conf = recipe.nginx_conf(entry, tls, recipe.entry_proxy(entry))
    _nginx(entry, conf, env)
    ca = tls / "ca.pem"
    wait_until(
        lambda: _answers(f"https://{entry.ip}:8443/v1/health", ca),
        timeout=90,
        what="the API answers",
    )
    wait_until(
        lambda: _answers(f"https://{entry.ip}/_stcore/health", ca),
        timeout=90,
        what="the console answers",
    )
    return key.stdout.strip()


def _answers(url: str, ca: Path) -> bool:
    import httpx

    try:
        return httpx.get(url, verify=str(ca), timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


# --- the run ---------------------------------------------------------------------------------


def _engine(svc: Host, s: Secrets):
    from sqlalchemy import create_engine

    url = f"postgresql+psycopg://sluice:{s.db}@{svc.ip}:5432/sluice"
    return create_engine(url, pool_pre_ping=True)


def _rows(engine, sql: str, **params) -> list:
    from sqlalchemy import text

    with engine.connect() as conn:
        return list(conn.execute(text(sql), params).all())


def _running_on(engine, host: Host) -> list[int]:
    sql = "SELECT id FROM job WHERE status = 'running' AND worker_id LIKE :w ORDER BY id"
    return [r[0] for r in _rows(engine, sql, w=f"{host.name}:%")]


def _ingest_through_faults(svc, worker1, worker2, entry, s, ca, token, queue) -> dict:
    from sluice.client import Client

    engine = _engine(svc, s)
    lease = float(recipe.FAST["SLUICE_LEASE_SECONDS"])
    story: dict = {"engine": engine}
    started = time.monotonic()
    with Client(f"https://{entry.ip}:8443", token, verify=str(ca)) as api:
        uploads = [api.upload(document(i), filename=f"doc-{i:02d}.txt") for i in range(N)]
    story["upload_seconds"] = time.monotonic() - started
    story["job_ids"] = sorted(u["job_id"] for u in uploads)
    assert len(set(story["job_ids"])) == N

    # worker2 cut off while it holds a job, for longer than a lease: worker1 takes the job back.
    held = wait_until(lambda: _running_on(engine, worker2), timeout=60, what="worker2 runs a job")
    wait_until(lambda: _claimed_by(engine, worker1), timeout=60, what="worker1 took a job")
    cut_at = time.monotonic()
    worker2.cut()
    wait_until(
        lambda: (
            time.monotonic() - cut_at > lease
            and not set(held) & set(_running_on_any(engine, "worker2"))
        ),
        timeout=90,
        what="worker2's jobs were taken back after the lease",
    )
    story["cut_seconds"] = time.monotonic() - cut_at
    worker2.join()
    story["cut_jobs"] = held

    # the queue Redis restarts (its append-only file brings the queue back)
    queue.terminate()
    queue.wait(30)
    svc.start("queue", sluice("serve", "queue"), recipe.services_env(svc, s))
    wait_until(lambda: reachable(svc.ip, 6390), timeout=30, what="the queue Redis is back")

    # worker1 killed (every process of the host) while it holds a job: worker2 takes it back.
    wait_until(lambda: _running_on(engine, worker1), timeout=90, what="worker1 runs a job")
    story["killed_processes"] = worker1.kill_all()
    # Which jobs the kill interrupted is read after it: one that succeeded between the read above
    # and the kill was finished by worker1's only claim, not interrupted.
    story["killed_jobs"] = _running_on_any(engine, "worker1")
    wait_until(lambda: _all_final(engine, story["job_ids"]), timeout=240, what="every job finished")
    story["run_seconds"] = time.monotonic() - started
    return story


def _running_on_any(engine, name: str) -> list[int]:
    sql = "SELECT id FROM job WHERE status = 'running' AND worker_id LIKE :w"
    return [r[0] for r in _rows(engine, sql, w=f"{name}:%")]


def _claimed_by(engine, host: Host) -> int:
    sql = "SELECT count(*) FROM job_event WHERE kind = 'claimed' AND actor LIKE :w"
    return _rows(engine, sql, w=f"{host.name}:%")[0][0]


def _all_final(engine, ids: list[int]) -> bool:
    rows = _rows(engine, "SELECT status FROM job WHERE id = ANY(:ids)", ids=ids)
    return all(r[0] in ("succeeded", "failed", "cancelled") for r in rows)


# --- the end ---------------------------------------------------------------------------------


def _check_the_end(svc, worker1, worker2, entry, s, ca, env, story) -> None:
    import hashlib
    import json

    engine, ids = story["engine"], story["job_ids"]
    jobs = _rows(
        engine,
        "SELECT id, status, attempt, worker_id, chunk_count FROM job WHERE id = ANY(:ids) "
        "ORDER BY id",
        ids=ids,
    )
    claims = _rows(
        engine,
        "SELECT job_id, actor FROM job_event WHERE kind = 'claimed' AND job_id = ANY(:ids) "
        "ORDER BY id",
        ids=ids,
    )
    by_job: dict[int, list[str]] = {}
    for job_id, actor in claims:
        by_job.setdefault(job_id, []).append(actor.split(":")[0])
    _closing_lines(jobs, by_job, story)

    assert [j[1] for j in jobs] == ["succeeded"] * N, Counter(j[1] for j in jobs)
    assert {h for hosts in by_job.values() for h in hosts} == {"worker1", "worker2"}
    for job_id in story["cut_jobs"]:  # taken from the cut-off worker2, finished by another claim
        assert by_job[job_id][0] == "worker2" and len(by_job[job_id]) >= 2
    for job_id in story["killed_jobs"]:  # taken from the killed worker1, finished by worker2
        assert "worker1" in by_job[job_id] and by_job[job_id][-1] == "worker2"

    report = entry.run(sluice("reconcile", "--json"), env)
    result = json.loads(report.stdout)
    assert report.returncode == 0 and result["clean"], report.stdout[-3000:] + report.stderr[-2000:]
    assert result["blobs_checked"] == N and result["blobs_missing_count"] == 0
    # no chunk twice: the index holds exactly the chunks the 60 active jobs promise
    assert result["chunks"] == sum(j[4] for j in jobs) and result["orphans"] == 0

    stored = {
        o["Key"]
        for page in _s3(svc, s, ca).get_paginator("list_objects_v2").paginate(Bucket=recipe.BUCKET)
        for o in page.get("Contents", ())
    }
    expected = {"blobs/" + hashlib.sha256(document(i)).hexdigest() for i in range(N)}
    assert stored == expected  # every blob in the object store, no staging copy left over
    lost = worker2.log("worker").count("no longer owned by lease")
    print(
        f"cluster: worker2's writes after the cut refused by the lease: {lost} time(s) in its log"
    )


def _no_blob_on_any_disk(*hosts: Host) -> None:
    """No upload on any host's disk (a worker killed in the middle of a job leaves its scratch
    copy, which the next worker of that host removes: checked after the hosts ran again)."""
    for host in hosts:
        data = host.root / "data"
        leftovers = [
            p
            for d in ("blobs", "blob-scratch")
            if (data / d).exists()
            for p in (data / d).rglob("*")
            if p.is_file()
        ]
        assert leftovers == [], f"{host.name} keeps blob files on its disk: {leftovers[:5]}"


def _closing_lines(jobs, by_job, story) -> None:
    """What happened to each of the 60 jobs, then the run in numbers."""
    paths = Counter(" -> ".join(by_job.get(j[0], ["?"])) for j in jobs)
    print("\ncluster: what happened to each of the 60 jobs (claims in order):")
    for path, n in paths.most_common():
        print(f"cluster:   {n:2d} job(s)  {path}")
    print(
        f"cluster: {sum(j[1] == 'succeeded' for j in jobs)}/{N} succeeded; worker2 cut off for "
        f"{story['cut_seconds']:.1f} s holding job(s) {story['cut_jobs']}; worker1 killed "
        f"({story['killed_processes']} processes) holding job(s) {story['killed_jobs']}; queue "
        f"Redis restarted once; uploads {story['upload_seconds']:.1f} s, whole run "
        f"{story['run_seconds']:.1f} s"
    )


# --- after the run ------------------------------------------------------------------------


def _settle(engine, entry: Host, ca: Path, token: str) -> None:
    """One more document through the API, so the restarted host fetches from the object store."""
    from sluice.client import Client

    with Client(f"https://{entry.ip}:8443", token, verify=str(ca)) as api:
        job = api.upload(b"one more document " * 300, filename="one-more.txt")["job_id"]
    wait_until(lambda: _all_final(engine, [job]), timeout=120, what="one more document")
    assert _claimed_by_job(engine, job).startswith("worker1")


def _throughput(engine, entry: Host, workers: list[Host], envs, ca: Path, token: str) -> None:
    """One worker host, then two, each on one core, the real model: the ratio in the closing
    lines (a measurement, not asserted: the machine is shared). CLUSTER_THROUGHPUT_DOCS
    sets the corpus (``python -m bench.cluster_throughput`` runs a larger one) and
    CLUSTER_RESULT a file for the figures."""
    from sluice.client import Client

    docs = int(os.environ.get("CLUSTER_THROUGHPUT_DOCS", "12"))
    with Client(f"https://{entry.ip}:8443", token, verify=str(ca)) as api:
        result = throughput.measure(
            engine=engine,
            entry=entry,
            entry_env=envs["entry"],
            workers=workers,
            envs=envs,
            upload=lambda data, name: api.upload(data, filename=name)["job_id"],
            documents=docs,
        )
    if os.environ.get("CLUSTER_RESULT"):
        throughput.write_result(result, Path(os.environ["CLUSTER_RESULT"]))
    print("\n".join(result.lines()))


def _nginx(host: Host, conf: Path, env: dict[str, str]) -> None:
    log = str(host.root / "nginx-start.log")
    host.start("nginx", ["nginx", "-p", str(host.root), "-e", log, "-c", str(conf)], env)


def _claimed_by_job(engine, job_id: int) -> str:
    sql = (
        "SELECT actor FROM job_event WHERE kind = 'claimed' AND job_id = :j "
        "ORDER BY id DESC LIMIT 1"
    )
    rows = _rows(engine, sql, j=job_id)
    return rows[0][0] if rows else ""
