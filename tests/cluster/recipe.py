"""The deployment recipe the cluster run follows, one function per step (docs/deploy.md says the
same in prose): a certificate authority and host certificates made with openssl, a throwaway
PostgreSQL cluster, Debian's nginx as the TLS proxy, and the settings each host gets.
"""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.cluster.netns import Host, sh

ROOT = Path(__file__).resolve().parents[2]
PG_BIN = (
    Path(sorted(glob.glob("/usr/lib/postgresql/*/bin"))[-1])
    if glob.glob("/usr/lib/postgresql/*/bin")
    else Path("/nonexistent")
)
BUCKET = "sluice-blobs"


@dataclass
class Secrets:
    """Every secret of the installation, made here; docs/deploy.md says which host gets which."""

    db: str = secrets.token_urlsafe(18)
    queue: str = secrets.token_urlsafe(18)
    cache: str = secrets.token_urlsafe(18)
    chroma: str = secrets.token_urlsafe(24)
    console: str = secrets.token_urlsafe(18)
    aws_key: str = "sluice-cluster"
    aws_secret: str = secrets.token_urlsafe(24)


def base_env() -> dict[str, str]:
    """What every process inherits: nothing of the caller's SLUICE_ settings or credentials."""
    keep = ("PATH", "LANG", "LC_ALL", "HOME")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def sluice(*args: str) -> list[str]:
    return [sys.executable, "-m", "sluice.cli", *args]


# --- certificates ----------------------------------------------------------------------------


def make_certificates(folder: Path, hosts: list[Host]) -> Path:
    """A CA of this run and a certificate per TLS host (its address as subjectAltName); the CA's
    certificate path (what SSL_CERT_FILE and AWS_CA_BUNDLE point at on the clients)."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, ca = folder / "ca.key", folder / "ca.pem"
    sh(
        *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2"),
        *("-keyout", str(ca_key), "-out", str(ca), "-subj", "/CN=Sluice cluster test CA"),
    )
    for host in hosts:
        key, csr, crt = (folder / f"{host.name}.{ext}" for ext in ("key", "csr", "pem"))
        ext = folder / f"{host.name}.ext"
        ext.write_text(f"subjectAltName=IP:{host.ip}\nextendedKeyUsage=serverAuth\n")
        sh(
            "openssl",
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(csr),
            "-subj",
            f"/CN={host.ip}",
        )
        sh(
            "openssl",
            "x509",
            "-req",
            "-in",
            str(csr),
            "-CA",
            str(ca),
            "-CAkey",
            str(ca_key),
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            str(crt),
            "-extfile",
            str(ext),
        )
    return ca


# --- PostgreSQL ------------------------------------------------------------------------------


def start_postgres(host: Host, password: str) -> Path:
    """initdb and pg_ctl as the postgres user, listening on the host's address only; a role and
    database ``sluice`` reachable from the subnet with a password (scram-sha-256)."""
    pgdata = host.root / "pg"
    pgdata.mkdir()
    shutil.chown(pgdata, "postgres", "postgres")
    os.chmod(pgdata, 0o700)
    as_pg = ["runuser", "-u", "postgres", "--"]
    run = host.run(
        [
            *as_pg,
            str(PG_BIN / "initdb"),
            "-D",
            str(pgdata),
            "-U",
            "postgres",
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
        ],
        base_env(),
    )
    assert run.returncode == 0, run.stderr
    with open(pgdata / "postgresql.conf", "a") as conf:
        conf.write(
            f"listen_addresses = '{host.ip}'\nport = 5432\nunix_socket_directories = '{pgdata}'\n"
            "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
            # A host cut off in the middle of a transaction keeps its row locks until the server
            # gives up on it; every other worker (and the reaper) waits behind them meanwhile.
            # Sessions idle inside a transaction are ended, dead peers found by keepalives.
            "idle_in_transaction_session_timeout = '20s'\n"
            "tcp_keepalives_idle = 5\ntcp_keepalives_interval = 2\ntcp_keepalives_count = 3\n"
            "log_lock_waits = on\ndeadlock_timeout = '1s'\n"
        )
    with open(pgdata / "pg_hba.conf", "a") as hba:
        subnet = host.ip.rsplit(".", 1)[0] + ".0/24"
        hba.write(f"host sluice sluice {subnet} scram-sha-256\n")
    run = host.run(
        [
            *as_pg,
            str(PG_BIN / "pg_ctl"),
            "-D",
            str(pgdata),
            "-l",
            str(pgdata / "server.log"),
            "-w",
            "start",
        ],
        base_env(),
    )
    assert run.returncode == 0, run.stdout + run.stderr
    psql = [
        *as_pg,
        str(PG_BIN / "psql"),
        "-h",
        str(pgdata),
        "-U",
        "postgres",
        "-v",
        "ON_ERROR_STOP=1",
    ]
    for sql in (
        f"CREATE ROLE sluice LOGIN PASSWORD '{password}'",
        "CREATE DATABASE sluice OWNER sluice",
    ):
        run = host.run([*psql, "-c", sql], base_env())
        assert run.returncode == 0, run.stderr
    return pgdata


def stop_postgres(host: Host, pgdata: Path) -> None:
    host.run(
        [
            "runuser",
            "-u",
            "postgres",
            "--",
            str(PG_BIN / "pg_ctl"),
            "-D",
            str(pgdata),
            "-m",
            "immediate",
            "stop",
        ],
        base_env(),
    )


# --- nginx -----------------------------------------------------------------------------------


def nginx_conf(host: Host, certs: Path, servers: list[str]) -> Path:
    """A whole nginx configuration of its own (no system file is read or written)."""
    run = host.root / "nginx"
    run.mkdir(exist_ok=True)
    temp = "\n".join(
        f"  {kind}_temp_path {run}/{kind};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    conf = run / "nginx.conf"
    conf.write_text(
        f"""daemon off;
worker_processes 1;
pid {run}/nginx.pid;
error_log {host.root}/nginx-error.log warn;
events {{ worker_connections 512; }}
http {{
  access_log off;
{temp}
  ssl_certificate {certs}/{host.name}.pem;
  ssl_certificate_key {certs}/{host.name}.key;
  ssl_protocols TLSv1.2 TLSv1.3;
{"".join(servers)}
}}
"""
    )
    return conf


def services_proxy(host: Host, token: str) -> list[str]:
    """Chroma on 8443 (the token checked here and again by Sluice's gate behind it) and the object
    store on 9443 (bodies streamed both ways, the Host the client signed passed on)."""
    return [
        f"""
  server {{
    listen {host.ip}:8443 ssl;
    if ($http_authorization != "Bearer {token}") {{ return 401; }}
    location / {{
      proxy_pass http://127.0.0.1:8100;
      proxy_http_version 1.1;
      proxy_set_header Host 127.0.0.1:8100;
      proxy_read_timeout 120s;
      client_max_body_size 64m;
    }}
  }}""",
        f"""
  server {{
    listen {host.ip}:9443 ssl;
    client_max_body_size 0;
    proxy_request_buffering off;
    proxy_buffering off;
    location / {{
      proxy_pass http://127.0.0.1:9000;
      proxy_http_version 1.1;
      proxy_set_header Host $http_host;
    }}
  }}""",
    ]


def entry_proxy(host: Host) -> list[str]:
    """The HTTP API on 8443 (uploads streamed, the event stream unbuffered) and the console on 443
    (with the WebSocket Streamlit needs)."""
    return [
        f"""
  server {{
    listen {host.ip}:8443 ssl;
    client_max_body_size 200m;
    proxy_request_buffering off;
    proxy_buffering off;
    location / {{
      proxy_pass http://127.0.0.1:8700;
      proxy_http_version 1.1;
      proxy_set_header Host $http_host;
      proxy_set_header X-Forwarded-For $remote_addr;
    }}
  }}""",
        f"""
  server {{
    listen {host.ip}:443 ssl;
    location / {{
      proxy_pass http://127.0.0.1:8501;
      proxy_http_version 1.1;
      proxy_set_header Upgrade $http_upgrade;
      proxy_set_header Connection "upgrade";
      proxy_set_header Host $http_host;
      proxy_set_header X-Forwarded-For $remote_addr;
      proxy_read_timeout 3600s;
    }}
  }}""",
    ]


# --- settings --------------------------------------------------------------------------------


FAST = {  # leases and rounds short enough for a run of minutes (the defaults are 60 s and 5 s)
    "SLUICE_EMBEDDER": "hash",
    "SLUICE_LEASE_SECONDS": "6",
    "SLUICE_HEARTBEAT_SECONDS": "1",
    "SLUICE_RECOVERY_INTERVAL_SECONDS": "1",
    "SLUICE_REDELIVER_AFTER_SECONDS": "5",
    "SLUICE_RETRY_BASE_SECONDS": "0.5",
    "SLUICE_RETRY_MAX_SECONDS": "3",
    "SLUICE_OUTAGE_POLL_SECONDS": "1",
    "SLUICE_EMBED_BATCH_SIZE": "4",
}


def services_env(svc: Host, s: Secrets) -> dict[str, str]:
    return {
        **base_env(),
        "SLUICE_DATA_DIR": str(svc.root / "data"),
        "SLUICE_QUEUE_REDIS_URL": f"redis://:{s.queue}@{svc.ip}:6390/0",
        "SLUICE_CACHE_REDIS_URL": f"redis://:{s.cache}@{svc.ip}:6391/0",
        "SLUICE_CHROMA_URL": "http://127.0.0.1:8100",
        "SLUICE_CHROMA_TOKEN": s.chroma,
    }


def client_env(host: Host, svc: Host, s: Secrets, ca: Path) -> dict[str, str]:
    """A worker's or the entry host's settings: the shared ones, and its own data directory."""
    return {
        **base_env(),
        **FAST,
        "SLUICE_DATA_DIR": str(host.root / "data"),
        "SLUICE_DATABASE_URL": f"postgresql://sluice:{s.db}@{svc.ip}:5432/sluice",
        "SLUICE_QUEUE_REDIS_URL": f"redis://:{s.queue}@{svc.ip}:6390/0",
        "SLUICE_CACHE_REDIS_URL": f"redis://:{s.cache}@{svc.ip}:6391/0",
        "SLUICE_QUEUE_NAME": "sluice",
        "SLUICE_CHROMA_URL": f"https://{svc.ip}:8443",
        "SLUICE_CHROMA_TOKEN": s.chroma,
        "SLUICE_BLOB_STORE": "s3",
        "SLUICE_S3_ENDPOINT_URL": f"https://{svc.ip}:9443",
        "SLUICE_S3_BUCKET": BUCKET,
        "SLUICE_S3_PREFIX": "blobs/",
        "AWS_ACCESS_KEY_ID": s.aws_key,
        "AWS_SECRET_ACCESS_KEY": s.aws_secret,
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CA_BUNDLE": str(ca),  # boto3's trust of the private CA
        "SSL_CERT_FILE": str(ca),  # httpx's (Chroma)
    }


def wait_until(predicate, *, timeout: float, what: str, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting until {what}")
        time.sleep(interval)
