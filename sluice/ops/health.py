"""Reachability of the queue Redis, the cache Redis and Chroma, and what the queue holds; and the
warm-up of a front end's process (``warm_up``: what its first request would otherwise pay for).

Every probe returns a result instead of raising: a service that is down is something the console
shows, not a crash. Probes use short timeouts so that a dead service costs the page little.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from importlib import metadata

import redis

from sluice import faults
from sluice.errors import WaitingError
from sluice.pipeline.queueing import broker
from sluice.settings import Settings, redact_url
from sluice.storage.s3_blobs import S3BlobStore

PROBE_TIMEOUT = 1.5
VERSIONED = (
    "streamlit",
    "huey",
    "chromadb",
    "sentence-transformers",
    "torch",
    "sqlmodel",
    "redis",
    "pymupdf",
)


@dataclass
class QueueState:
    reachable: bool
    error: str = ""
    queued: int = 0
    scheduled: int = 0
    workers: list[dict] = field(default_factory=list)

    @property
    def depth(self) -> int:
        return self.queued + self.scheduled


def queue_state() -> QueueState:
    try:
        depth = broker.queue_depth()
        workers = broker.workers_alive()
    except Exception as exc:  # redis.RedisError, or a bad URL
        return QueueState(False, error=f"{type(exc).__name__}: {exc}")
    now = time.time()
    for w in workers:
        w["seen_seconds_ago"] = round(now - float(w.get("seen", now)), 1)
    return QueueState(
        True, queued=depth.get("queued", 0), scheduled=depth.get("scheduled", 0), workers=workers
    )


@dataclass
class QueuePosition:
    reachable: bool
    position: int | None = None  # 1 = runs next
    length: int = 0
    error: str = ""
    scanned: int = 0  # how many queue entries were looked at (the first QUEUE_SCAN at most)

    @property
    def beyond_scan(self) -> bool:
        return self.position is None and self.length > self.scanned


QUEUE_SCAN = 10_000


def queue_position(job_id: int) -> QueuePosition:
    """Where a job's message sits among the next QUEUE_SCAN queue entries (one Redis read)."""
    try:
        ids = broker.queue_order(QUEUE_SCAN)
        length = broker.get_huey().pending_count()
    except Exception as exc:
        return QueuePosition(False, error=f"{type(exc).__name__}: {exc}")
    position = ids.index(job_id) + 1 if job_id in ids else None
    return QueuePosition(True, position=position, length=max(length, len(ids)), scanned=len(ids))


@dataclass
class Probe:
    name: str
    address: str
    reachable: bool
    detail: str


def _redis_probe(name: str, url: str, password: str) -> Probe:
    client = redis.Redis.from_url(
        url, password=password, socket_timeout=PROBE_TIMEOUT, socket_connect_timeout=PROBE_TIMEOUT
    )
    try:
        client.ping()
        info = client.info("server")
        mem = client.info("memory")
        detail = (
            f"server redis {info.get('redis_version', '?')}, maxmemory-policy "
            f"{mem.get('maxmemory_policy', '?')}, used {mem.get('used_memory_human', '?')}"
        )
        return Probe(name, redact_url(url), True, detail)
    except redis.RedisError as exc:
        return Probe(name, redact_url(url), False, f"{type(exc).__name__}: {exc}")
    finally:
        client.close()


def _chroma_detail(version: object) -> str:
    """What the server says of itself, apart from the client package: the server inside the
    chromadb 1.5.9 wheel reports its API as 1.0.0, which read as an old server beside 1.5.9."""
    try:
        package = metadata.version("chromadb")
    except metadata.PackageNotFoundError:
        package = "not installed"
    said = f"the server reports API version {version}" if version else "the server answers"
    return f"{said}; the chromadb package here is {package}"


def _chroma_probe(settings: Settings) -> Probe:
    import httpx

    headers = {}
    if settings.chroma_token is not None:
        token = settings.chroma_token.get_secret_value()
        header = settings.chroma_auth_header
        headers[header] = f"Bearer {token}" if header.lower() == "authorization" else token
    try:
        r = httpx.get(
            f"{settings.chroma_url}/api/v2/heartbeat", headers=headers, timeout=PROBE_TIMEOUT
        )
        r.raise_for_status()
        version = ""
        try:
            version = httpx.get(
                f"{settings.chroma_url}/api/v2/version", headers=headers, timeout=PROBE_TIMEOUT
            ).json()
        except Exception:
            pass
        return Probe("chroma", redact_url(settings.chroma_url), True, _chroma_detail(version))
    except Exception as exc:
        return Probe(
            "chroma", redact_url(settings.chroma_url), False, f"{type(exc).__name__}: {exc}"
        )


def blob_store_probe(settings: Settings) -> Probe:
    """The object store's bucket (SLUICE_BLOB_STORE=s3); the local directory needs no probe."""
    store = S3BlobStore.from_settings(settings, timeout=PROBE_TIMEOUT)
    try:
        detail = store.ping()
    except WaitingError as exc:
        return Probe("object store", store.describe(), False, exc.message)
    return Probe("object store", store.describe(), True, detail)


def probes(settings: Settings) -> list[Probe]:
    found = [
        _redis_probe("queue Redis", settings.queue_redis_url, settings.redis_password("queue")),
        _redis_probe("cache Redis", settings.cache_redis_url, settings.redis_password("cache")),
        _chroma_probe(settings),
    ]
    if settings.blob_store == "s3":
        found.append(blob_store_probe(settings))
    return found


def versions() -> dict[str, str]:
    import platform

    out = {"python": platform.python_version()}
    for name in VERSIONED:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


# What the first upload of a fresh API process paid for, measured (a real ``sluice serve api``,
# SQLite, a local blob store): the job database's engine and schema check (0.3 s), the task
# modules an upload's publish imports (0.9 s), the queue's client, the blob store; the first upload
# took 1.4 s and more, the next ones 0.25 s.


def warm_up() -> None:
    """Do now, once, what the first request of a fresh process would pay for: the job database
    (engine, schema check, a read), the modules an upload imports, the blob store and the queue's
    client. Raises what fails (the caller logs it and tries again)."""
    from sqlmodel import Session, text

    # the modules the first upload imports: the task its publish registers, the type sniff
    import sluice.pipeline.parsing.parse  # noqa: F401
    import sluice.pipeline.queueing.tasks  # noqa: F401
    from sluice.ops import ingest  # noqa: F401
    from sluice.ops.reads import ctx

    context = ctx()
    with Session(context.engine) as session:
        session.exec(text("SELECT 1"))  # type: ignore[call-overload]
    _ = context.instance_id, context.pipeline_version, context.blobs
    broker.get_huey()
    faults.hit("api_warm_up")  # all warm, not yet said so: a test looks at the health here
