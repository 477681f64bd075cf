"""Test fixtures: the suite starts its own Redis servers (queue and cache) and Chroma server on free
ports, gives every test its own data directory and database, and cleans only what it made.

Set SLUICE_TEST_DATABASE_URL (e.g. postgresql://postgres@127.0.0.1:5432/test) to run the job-store
tests on PostgreSQL as well; each such test creates and drops its own database.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support.servers import ChromaServer, Consumer, RedisServer

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "tests" / "data" / "pdf-samples"  # real-world PDFs: their source and licence there
QUEUE_NAME = f"test{uuid.uuid4().hex[:8]}"

# Never let the developer's environment or .env leak into a test.
for _key in [k for k in os.environ if k.startswith("SLUICE_") and k != "SLUICE_TEST_DATABASE_URL"]:
    del os.environ[_key]
os.environ.update(
    {
        "SLUICE_ENV_FILE": "",
        # Tests that publish and then look at the queue expect every job published at once; the
        # dispatch window (priority and fairness) is tested where it is the point
        # (tests/test_fairness.py).
        "SLUICE_DISPATCH_PER_THREAD": "0",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
)


@pytest.fixture(scope="session")
def services():
    """Queue Redis, cache Redis and a Chroma server for the whole session."""
    workdir = Path(tempfile.mkdtemp(prefix="sluice-services-"))
    queue = RedisServer("queue", workdir)
    cache = RedisServer("cache", workdir)
    chroma = ChromaServer(workdir)
    for server in (queue, cache, chroma):
        server.start()
    os.environ.update(
        {
            "SLUICE_QUEUE_REDIS_URL": queue.url,
            "SLUICE_CACHE_REDIS_URL": cache.url,
            "SLUICE_CHROMA_URL": chroma.url,
            "SLUICE_QUEUE_NAME": QUEUE_NAME,
        }
    )
    yield SimpleNamespace(queue=queue, cache=cache, chroma=chroma, workdir=workdir)
    for server in (queue, cache, chroma):
        server.stop()
    shutil.rmtree(workdir, ignore_errors=True)


FAST_RECOVERY = {
    "SLUICE_EMBEDDER": "hash",
    "SLUICE_LEASE_SECONDS": "4",
    "SLUICE_HEARTBEAT_SECONDS": "0.5",
    "SLUICE_RECOVERY_INTERVAL_SECONDS": "0.5",
    "SLUICE_REDELIVER_AFTER_SECONDS": "3",
    "SLUICE_RETRY_BASE_SECONDS": "0.2",
    "SLUICE_RETRY_MAX_SECONDS": "2",
    "SLUICE_OUTAGE_POLL_SECONDS": "0.5",
}


def _reset_process_state() -> None:
    from sluice.pipeline.running.context import set_context
    from sluice.settings import reset_settings_cache
    from sluice.storage.db import dispose_engines

    reset_settings_cache()
    set_context(None)
    dispose_engines()
    if "streamlit" in sys.modules:
        # The console's caches live as long as the process: a page drawn by AppTest in one test
        # (the Integrity page's reconcile thread and its last report, say) would speak in the next
        # test that the same process runs.
        import streamlit as st

        st.cache_data.clear()
        st.cache_resource.clear()


def pytest_collection_modifyitems(config, items):
    """Tests that need the session's Redis and Chroma servers are marked ``servers``: ``-m "not
    servers"`` runs the rest (job store, queries, pure stages) without starting any.

    The slow and browser tests go first (in their own order otherwise): in a parallel run
    (``make test``, pytest-xdist) a long test handed out last would leave the other process idle
    while it runs. Every process sorts the same collection the same way, as xdist requires."""
    for item in items:
        if "services" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.servers)
    long_first = [
        i for i in items if i.get_closest_marker("slow") or i.get_closest_marker("browser")
    ]
    if long_first:
        chosen = {id(i) for i in long_first}
        items[:] = long_first + [i for i in items if id(i) not in chosen]


@pytest.fixture
def store_env(tmp_path, monkeypatch):
    """Per-test settings for tests that need no server: their own data directory (and SQLite
    file)."""
    values = {"SLUICE_DATA_DIR": str(tmp_path / "data"), **FAST_RECOVERY}
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    _reset_process_state()
    yield dict(os.environ)
    _reset_process_state()


@pytest.fixture
def sluice_env(store_env, services):
    """Per-test settings in the environment (inherited by subprocesses), with the session's servers
    emptied for this test; returns that env."""
    if not services.queue.alive():
        services.queue.start()
    services.queue.client().flushdb()
    services.cache.client().flushdb()
    _reset_process_state()
    yield dict(os.environ)


@pytest.fixture
def ctx(sluice_env):
    from sluice.pipeline.running.context import Context, set_context
    from sluice.settings import get_settings

    context = Context(get_settings())
    set_context(context)
    return context


@pytest.fixture
def make_ctx(sluice_env, monkeypatch):
    """Build a context after changing settings: make_ctx(SLUICE_CHUNK_SIZE="400")."""
    from sluice.pipeline.running.context import Context, set_context
    from sluice.settings import get_settings, reset_settings_cache

    def build(embedder=None, **env):
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        reset_settings_cache()
        context = Context(get_settings(), embedder_override=embedder)
        set_context(context)
        return context

    return build


@pytest.fixture
def start_worker(sluice_env, services, tmp_path):
    """Start real huey_consumer processes with this test's settings; all stopped at teardown."""
    started: list[Consumer] = []

    def start(
        *, workers: int = 2, kind: str = "thread", env: dict | None = None, name: str = "worker"
    ) -> Consumer:
        consumer = Consumer(
            {**os.environ, **(env or {})},
            tmp_path / f"{name}-{len(started)}.log",
            workers=workers,
            kind=kind,
        )
        consumer.start()
        started.append(consumer)
        consumer.wait_ready(services.queue.client(), QUEUE_NAME)
        return consumer

    yield start
    for consumer in started:
        consumer.stop()


@pytest.fixture
def api_process(database_url, sluice_env, tmp_path):
    """A real ``sluice serve api`` process (uvicorn) on this test's database, stopped after it."""
    from tests.support.api_server import ApiServer

    server = ApiServer(dict(os.environ), tmp_path / "api.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def samples() -> Path:
    """The real-world PDFs carried in the repository (tests/data/pdf-samples/README.md)."""
    return SAMPLES


def _postgres_database(base_url: str):
    """Create a throwaway database on the server of ``base_url``; returns (url, drop)."""
    import psycopg
    from sqlalchemy.engine import make_url

    url = make_url(
        base_url.replace("postgresql://", "postgresql+psycopg://", 1)
        if base_url.startswith("postgresql://")
        else base_url
    )
    name = f"sluice_test_{uuid.uuid4().hex[:10]}"
    admin = url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        from sluice.storage.db import dispose_engines

        dispose_engines()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return url.set(database=name).render_as_string(hide_password=False), drop


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request, store_env, monkeypatch, tmp_path):
    """The job-store tests run on SQLite, and on PostgreSQL when SLUICE_TEST_DATABASE_URL is set."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'jobs.db'}"
        drop = None
    else:
        base = os.environ.get("SLUICE_TEST_DATABASE_URL")
        if not base:
            pytest.skip("SLUICE_TEST_DATABASE_URL is not set")
        url, drop = _postgres_database(base)
    monkeypatch.setenv("SLUICE_DATABASE_URL", url)
    _reset_process_state()
    yield url
    _reset_process_state()
    if drop:
        drop()
