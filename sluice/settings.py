"""The one settings object. Every process builds it at start and asks it for everything.

Variables are prefixed ``SLUICE_`` and may also come from a file: the one ``SLUICE_ENV_FILE``
names, else ``./.env`` when it is the user's own (a ``.env`` that others may write is ignored with
a warning: a hostile directory must not redirect the queue). Every entry point reads it the same
way. ``.env.example`` lists them all with safe examples.
"""

from __future__ import annotations

import ipaddress
import logging
import os
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import parse_qsl, unquote, urlsplit

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from sluice.errors import SettingsError
from sluice.files import shared_secret

log = logging.getLogger(__name__)

LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1", "[::1]"}
SECRET_QUERY_KEYS = {"password", "passwd", "token"}


def is_loopback(host: str | None) -> bool:
    """True for localhost and any address of 127.0.0.0/8 or ::1; False for 0.0.0.0 and every
    other."""
    if not host:
        return False
    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def url_password(url: str) -> str | None:
    """The password of a Redis or database URL, from ``user:password@`` or a ``?password=``
    query."""
    parts = urlsplit(url)
    if parts.password:
        return unquote(parts.password)
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key.lower() in ("password", "passwd") and value:
            return value
    return None


RedisRole = Literal["queue", "cache"]


def redis_password_path(data_dir: Path, role: str) -> Path:
    """Where the password of the queue or cache Redis is kept when its URL carries none (0600)."""
    return Path(data_dir) / f"redis-{role}" / "password"


def resolve_redis_password(url: str, data_dir: Path, role: str) -> str:
    """The password of a Sluice Redis, the same for its server and every client: the URL's when
    it carries one, else the one in the data directory (made on first use by whoever asks first)."""
    return url_password(url) or shared_secret(redis_password_path(data_dir, role))


def chroma_token_path(data_dir: Path) -> Path:
    """Where the token of the local Chroma gate is kept when SLUICE_CHROMA_TOKEN is unset (0600)."""
    return Path(data_dir) / "chroma-gate" / "token"


class MadeSecret(SecretStr):
    """A secret no variable sets: the one in ``path``, made on first use by whoever asks first
    (``shared_secret``), as the Redis passwords are. Read when first asked for, so that building the
    settings writes nothing."""

    def __init__(self, path: Path) -> None:
        super().__init__("")
        self.path = Path(path)

    def get_secret_value(self) -> str:
        if not self._secret_value:
            self._secret_value = shared_secret(self.path)
        return self._secret_value

    def __bool__(self) -> bool:
        return True

    def __len__(self) -> int:
        return len(self.get_secret_value())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MadeSecret) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    def _display(self) -> str:
        return "**********"


def _check_s3(s: Settings) -> None:
    if not s.s3_bucket:
        raise ValueError(
            "SLUICE_BLOB_STORE is s3 but SLUICE_S3_BUCKET is not set: name the bucket uploads go to"
        )
    if s.s3_endpoint_url:
        parts = urlsplit(s.s3_endpoint_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                f"SLUICE_S3_ENDPOINT_URL {redact_url(s.s3_endpoint_url)!r} is not an http(s):// "
                "URL (e.g. https://objects.internal:9000)"
            )
        if parts.username or parts.password:
            raise ValueError(
                "SLUICE_S3_ENDPOINT_URL carries credentials: give them as AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY instead"
            )
        if parts.scheme == "http" and not is_loopback(parts.hostname):
            raise ValueError(
                f"SLUICE_S3_ENDPOINT_URL is plain http:// to {parts.hostname}: the uploads and the "
                "request signatures would travel in clear; use https://"
            )


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="SLUICE_", env_file=None, extra="ignore", validate_default=True
    )

    # Where every piece of local state lives: job database, blobs, Chroma directory, Redis files.
    data_dir: Path = Path("var")
    # SQLAlchemy URL of the job database; empty means SQLite at $SLUICE_DATA_DIR/sluice.db.
    database_url: str = ""
    queue_redis_url: str = "redis://127.0.0.1:6390/0"
    cache_redis_url: str = "redis://127.0.0.1:6391/0"
    # Name of the Huey queue (its Redis keys are huey.redis.<name> etc.).
    queue_name: str = "sluice"
    chroma_url: str = "http://127.0.0.1:8100"
    # Unset with a loopback URL: the token made on first start into <data dir>/chroma-gate/token.
    chroma_token: SecretStr | None = None
    chroma_auth_header: str = "Authorization"
    # Where uploaded bytes live: "local" ($SLUICE_DATA_DIR/blobs, one host) or "s3" (any
    # S3-compatible object store; every host then reads the same bucket, no shared disk).
    blob_store: Literal["local", "s3"] = "local"
    # The object store (SLUICE_BLOB_STORE=s3): its endpoint (empty = AWS itself), bucket, key prefix
    # and region. Credentials come from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, never from here.
    s3_endpoint_url: str = ""
    s3_bucket: str = ""
    s3_prefix: str = Field("", pattern=r"^[A-Za-z0-9!_.*'()/-]*$", max_length=200)
    s3_region: str = "us-east-1"

    # Embedding
    embedder: Literal["sentence-transformers", "hash"] = "sentence-transformers"
    embed_model: str = "all-MiniLM-L6-v2"
    embed_precision: Literal["auto", "fp32", "bf16"] = "auto"
    embed_batch_size: int = Field(32, ge=1, le=1024)
    torch_threads: int = Field(0, ge=0, description="0 = one per CPU core")
    embed_cache_ttl_seconds: int = Field(7 * 24 * 3600, ge=60)
    # A reranker: a cross-encoder read from a local folder rescores a search's best candidates
    # ("" = off; "overlap" = a deterministic word-overlap stand-in for tests and benchmarks).
    rerank_model: str = Field("", max_length=500)
    rerank_depth: int = Field(30, ge=1, le=200, description="candidates a reranker rescores")

    # Chunking (part of the pipeline version)
    chunk_size: int = Field(800, ge=100, le=8000)
    chunk_overlap: int = Field(100, ge=0)
    # A hit's parent section: its section's text around it, up to this many characters, returned
    # as its context (0 = none). Read at search time: not part of the pipeline version.
    context_size: int = Field(0, ge=0, le=20_000)

    # Retries and recovery
    max_attempts: int = Field(5, ge=1, le=50)
    retry_base_seconds: float = Field(2.0, gt=0)
    retry_max_seconds: float = Field(300.0, gt=0)
    lease_seconds: float = Field(
        60.0, gt=0, description="a running job silent for longer is taken back"
    )
    heartbeat_seconds: float = Field(
        5.0, gt=0, description="how often a running job says it is alive"
    )
    recovery_interval_seconds: float = Field(5.0, gt=0)
    redeliver_after_seconds: float = Field(60.0, gt=0)
    # Messages the dispatcher keeps on the queue (published, not yet claimed) per worker thread
    # alive. What waits beyond stays in the outbox, where priority and fairness across datasets
    # choose what goes next. 0 = no window: every due job is published at once (first in, first
    # out).
    dispatch_per_thread: int = Field(2, ge=0, description="0 = publish everything at once")
    reconcile_interval_minutes: int = Field(0, ge=0, description="0 = periodic reconcile off")
    # The periodic reconcile reads only what changed since its last pass; a dataset whose last full
    # pass (the whole collection walked) is older than this gets a full one instead.
    reconcile_full_hours: float = Field(24.0, ge=0, description="0 = every periodic pass is full")
    retention_days: int = Field(30, ge=0, description="0 = keep everything")
    audit_retention_days: int = Field(365, ge=0, description="0 = keep every audit row")
    # Sources (sluice.ops.sources): a sync that would remove more than this share of a source's
    # documents removes nothing until confirmed; removed documents stay tombstoned this long.
    sync_max_remove_fraction: float = Field(0.3, ge=0, le=1)
    sync_tombstone_hours: float = Field(24.0, ge=0)
    # A dependency outage (Chroma, the database) is not the job's failure: the job waits, looking
    # again every OUTAGE_POLL seconds (jittered), attempts unspent, for at most MAX_OUTAGE seconds.
    outage_poll_seconds: float = Field(15.0, gt=0)
    max_outage_seconds: float = Field(6 * 3600.0, gt=0)

    # Limits against oversized input and PDF bombs
    max_upload_bytes: int = Field(100 * 1024 * 1024, ge=1)
    max_pages: int = Field(5000, ge=1)
    max_chunks: int = Field(50000, ge=1)
    stage_timeout_seconds: float = Field(900.0, gt=0)
    parse_max_page_chars: int = Field(200_000, ge=1000)
    parse_max_document_chars: int = Field(20_000_000, ge=1000)
    parse_max_memory_mb: int = Field(
        1024, ge=0, description="0 = no address-space limit on the parser"
    )

    # ZIP-based uploads (.docx, .pptx, .epub): refused beyond these (zip bombs)
    archive_max_entries: int = Field(10_000, ge=1)
    archive_max_uncompressed_mb: int = Field(500, ge=1)

    # OCR of pages without a usable text layer (Debian's tesseract-ocr; ``make ocr``)
    ocr_mode: Literal["auto", "always", "off"] = "auto"
    ocr_dpi: int = Field(200, ge=72, le=600)
    ocr_language: str = Field("eng", pattern=r"^[A-Za-z_]{3,20}(\+[A-Za-z_]{3,20})*$")

    # Console
    console_address: str = "127.0.0.1"
    console_port: int = 8501

    # Prometheus metrics (``sluice serve metrics``)
    metrics_address: str = "127.0.0.1"
    metrics_port: int = Field(9464, ge=1, le=65535)
    # A scraper sends it as "Authorization: Bearer <token>"; required beyond loopback.
    metrics_token: SecretStr | None = None
    # Host names /metrics is reached by besides loopback and SLUICE_METRICS_ADDRESS
    # (comma-separated; "*" accepts any, and gives up the DNS-rebinding protection).
    metrics_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)

    # The HTTP API (``sluice serve api``): where it listens, the names it answers at besides
    # loopback and SLUICE_API_ADDRESS (comma-separated; "*" accepts any), and each key's requests
    # per minute.
    api_address: str = "127.0.0.1"
    api_port: int = Field(8700, ge=1, le=65535)
    api_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    api_rate_per_minute: int = Field(600, ge=0, description="0 = no limit")
    # A comment on a quiet event stream this often, so that proxies do not close it.
    api_keepalive_seconds: float = Field(15.0, gt=0, le=3600)
    # Event streams one key may hold open at once in one API process (the next is 429).
    api_max_streams_per_key: int = Field(5, ge=1, le=1000)
    # The largest JSON body a route other than an upload reads (413 beyond it, before reading it).
    api_max_json_bytes: int = Field(1024 * 1024, ge=1024, le=64 * 1024 * 1024)
    # Where an API key may add an S3 source: buckets, or bucket/prefix/ entries (comma-separated);
    # empty: nowhere (the deployment's credentials may reach buckets no key should read).
    api_source_s3_allowed: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # A connection must send a whole request head within this many seconds (of its start, or of
    # the last answer on it); slower ones are closed (slowloris).
    api_header_timeout_seconds: float = Field(10.0, gt=0, le=600)
    # Connections one client address may hold open at once (the next is refused); the trusted
    # proxies below are not counted per address.
    api_connections_per_address: int = Field(64, ge=1, le=100_000)
    # Proxies whose X-Forwarded-For is believed (comma-separated addresses or networks): from them
    # the client's address is the last one they forwarded that is not a proxy's. Empty: none.
    api_trusted_proxies: Annotated[list[str], NoDecode] = Field(default_factory=list)

    # Webhooks: a signed JSON event per endpoint when a job succeeds, fails (dead letter) or is
    # cancelled.
    webhook_urls: Annotated[list[str], NoDecode] = Field(default_factory=list)
    webhook_secret: SecretStr | None = None
    webhook_timeout_seconds: float = Field(5.0, gt=0, le=60)
    webhook_max_age_seconds: float = Field(24 * 3600.0, gt=0)
    webhook_allow_http: bool = False  # plain http:// to a host beyond loopback: refused unless set
    console_password: SecretStr | None = None
    console_readonly_password: SecretStr | None = None
    login_max_failures: int = Field(5, ge=1)
    login_lockout_seconds: float = Field(30.0, ge=0)
    # Host names the console is reached by besides loopback and SLUICE_CONSOLE_ADDRESS
    # (comma-separated; "*" accepts any, and gives up the DNS-rebinding protection).
    console_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # Proxies whose X-Forwarded-For is believed (comma-separated addresses or networks).
    console_trusted_proxies: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # auto: sign-in unless the connection comes straight from this machine and no password is set;
    # always: sign-in for every connection; off: nobody signs in (an authenticating proxy in front).
    console_sign_in: Literal["auto", "always", "off"] = "auto"

    @field_validator(
        "console_hosts",
        "console_trusted_proxies",
        "webhook_urls",
        "metrics_hosts",
        "api_hosts",
        "api_source_s3_allowed",
        "api_trusted_proxies",
        mode="before",
    )
    @classmethod
    def _comma_list(cls, v):
        if isinstance(v, str):
            return [item.strip() for item in v.split(",") if item.strip()]
        return v

    @field_validator("console_trusted_proxies", "api_trusted_proxies")
    @classmethod
    def _networks(cls, v: list[str]) -> list[str]:
        for item in v:
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(
                    f"{item!r} is not an address or network (e.g. 127.0.0.1 or 10.0.0.0/24)"
                ) from None
        return v

    @field_validator("webhook_urls")
    @classmethod
    def _webhook_urls(cls, v: list[str]) -> list[str]:
        for url in v:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(
                    f"{redact_url(url)!r} is not an http(s):// URL (e.g. "
                    "https://hooks.example/sluice)"
                )
        return list(dict.fromkeys(v))

    @field_validator("queue_redis_url", "cache_redis_url")
    @classmethod
    def _redis_url(cls, v: str) -> str:
        if urlsplit(v).scheme not in ("redis", "rediss", "unix"):
            raise ValueError(
                f"{redact_url(v)!r} is not a redis:// URL (e.g. redis://:password@127.0.0.1:6390/0)"
            )
        return v

    @field_validator("chroma_url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                f"{redact_url(v)!r} is not an http(s):// URL (e.g. http://127.0.0.1:8100)"
            )
        if parts.path.strip("/") or parts.query:
            raise ValueError(
                f"{redact_url(v)!r} has a path; the Chroma client ignores it: serve Chroma at "
                "the root of its host and port (e.g. https://chroma.internal:8443)"
            )
        return v.rstrip("/")

    @field_validator("rerank_model")
    @classmethod
    def _rerank_model(cls, value: str) -> str:
        value = value.strip()
        if value in ("", "overlap") or Path(value).is_dir():
            return value
        raise ValueError(
            f"SLUICE_RERANK_MODEL={value!r} is no folder: name a cross-encoder's local folder "
            "(nothing is downloaded), 'overlap', or leave it empty for none"
        )

    @model_validator(mode="after")
    def _check(self) -> Settings:
        if self.chunk_overlap >= self.chunk_size:
            raise ValueError("SLUICE_CHUNK_OVERLAP must be smaller than SLUICE_CHUNK_SIZE")
        if self.queue_redis_url == self.cache_redis_url:
            raise ValueError(
                "SLUICE_QUEUE_REDIS_URL and SLUICE_CACHE_REDIS_URL must differ: the queue needs "
                "noeviction and persistence, the cache evicts"
            )
        chroma = urlsplit(self.chroma_url)
        if not is_loopback(chroma.hostname):
            if self.chroma_token is None:
                raise ValueError(
                    f"SLUICE_CHROMA_URL points at {chroma.hostname}, beyond this machine, but "
                    "SLUICE_CHROMA_TOKEN is not set: a Chroma server off loopback must require a "
                    "token (docs/security.md)"
                )
            if chroma.scheme != "https":
                raise ValueError(
                    f"SLUICE_CHROMA_URL is plain http:// to {chroma.hostname}: SLUICE_CHROMA_TOKEN "
                    "would travel in clear; use https:// (a TLS proxy in front of Chroma)"
                )
        if self.blob_store == "s3":
            _check_s3(self)
        if self.webhook_urls and self.webhook_secret is None:
            raise ValueError(
                "SLUICE_WEBHOOK_URLS is set but SLUICE_WEBHOOK_SECRET is not: every event is "
                "signed with it (set a long random value and give it to the receivers)"
            )
        for name in (
            "console_password",
            "console_readonly_password",
            "chroma_token",
            "webhook_secret",
            "metrics_token",
        ):
            secret = getattr(self, name)
            if secret is not None and secret.get_secret_value() in ("", "changeme", "change-me"):
                raise ValueError(
                    f"SLUICE_{name.upper()} is a placeholder; set a real secret or unset it"
                )
        _check_webhooks(self)
        if self.chroma_token is None:  # on loopback (beyond it a token is required above)
            self.chroma_token = MadeSecret(chroma_token_path(self.data_dir))
        return self

    def __repr_args__(self):
        """repr() and str() show URLs with their passwords masked (SecretStr fields mask
        themselves)."""
        for name, value in super().__repr_args__():
            if name and name.endswith("_urls") and isinstance(value, list):
                value = [redact_url(url) for url in value]
            yield (
                name,
                redact_url(value)
                if name and name.endswith("_url") and isinstance(value, str)
                else value,
            )

    # Derived values -------------------------------------------------------------------------

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{(self.data_dir / 'sluice.db').resolve()}"

    @property
    def blob_dir(self) -> Path:
        return self.data_dir / "blobs"

    @property
    def chroma_dir(self) -> Path:
        return self.data_dir / "chroma"

    @property
    def console_is_loopback(self) -> bool:
        return is_loopback(self.console_address)

    @property
    def login_required(self) -> bool:
        """Whether even a connection straight from this machine signs in (sluice.ops.gate
        decides)."""
        return self.console_sign_in == "always" or (
            self.console_sign_in == "auto" and self.console_password is not None
        )

    def redis_password(self, role: RedisRole) -> str:
        """The password every client of the queue or cache Redis sends (see
        resolve_redis_password)."""
        url = self.queue_redis_url if role == "queue" else self.cache_redis_url
        return resolve_redis_password(url, self.data_dir, role)

    def secrets_status(self) -> dict[str, bool]:
        """Which secrets are set, never their values (for logs and the System page)."""
        return {
            "SLUICE_CONSOLE_PASSWORD": self.console_password is not None,
            "SLUICE_CONSOLE_READONLY_PASSWORD": self.console_readonly_password is not None,
            "SLUICE_CHROMA_TOKEN": self.chroma_token is not None
            and not isinstance(self.chroma_token, MadeSecret),
            "SLUICE_WEBHOOK_SECRET": self.webhook_secret is not None,
            "SLUICE_METRICS_TOKEN": self.metrics_token is not None,
            "queue Redis password": bool(url_password(self.queue_redis_url)),
            "cache Redis password": bool(url_password(self.cache_redis_url)),
            "database password": bool(url_password(self.database_url))
            if self.database_url
            else False,
            **(
                {"AWS_SECRET_ACCESS_KEY": bool(os.environ.get("AWS_SECRET_ACCESS_KEY"))}
                if self.blob_store == "s3"
                else {}
            ),
        }

    def public_view(self, *, full: bool = True) -> dict[str, str]:
        """Configuration in force, with secrets shown only as set / not set; without ``full`` (a
        read-only operator) endpoint lists show only scheme and host (``endpoint_origin``)."""
        out: dict[str, str] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            key = f"SLUICE_{name.upper()}"
            if isinstance(value, MadeSecret):
                out[key] = "made in the data directory"
            elif isinstance(value, SecretStr) or name.endswith(("password", "token", "secret")):
                out[key] = "set" if value else "not set"
            elif name.endswith("_url"):
                out[key] = redact_url(str(value)) if value else ""
            elif name.endswith("_urls"):
                shown = redact_url if full else endpoint_origin
                out[key] = ", ".join(shown(url) for url in value)
            else:
                out[key] = str(value)
        return out


def redact_url(url: str) -> str:
    """The URL with its password masked, in the user part and in a ``?password=`` query alike."""
    parts = urlsplit(url)
    netloc, query = parts.netloc, parts.query
    if parts.password is not None:
        userinfo, _, hostport = netloc.rpartition("@")
        netloc = f"{userinfo.split(':', 1)[0]}:***@{hostport}"
    if query:
        pieces = []
        for piece in query.split("&"):
            key = unquote(piece.split("=", 1)[0]).lower()
            pieces.append(f"{piece.split('=', 1)[0]}=***" if key in SECRET_QUERY_KEYS else piece)
        query = "&".join(pieces)
    if (netloc, query) == (parts.netloc, parts.query):
        return url
    return parts._replace(netloc=netloc, query=query).geturl()


WEBHOOK_SECRET_MIN_BYTES = 32


def _check_webhooks(s: Settings) -> None:
    """Events are signed with the secret and carry job names: a guessable secret or plain HTTP
    across a network lets anyone forge or read them."""
    secret = s.webhook_secret.get_secret_value() if s.webhook_secret is not None else None
    if secret is not None and len(secret.encode("utf-8")) < WEBHOOK_SECRET_MIN_BYTES:
        raise ValueError(
            f"SLUICE_WEBHOOK_SECRET is {len(secret.encode('utf-8'))} bytes; it needs at least "
            f"{WEBHOOK_SECRET_MIN_BYTES} (e.g. python -c 'import secrets; "
            "print(secrets.token_hex(32))')"
        )
    for url in s.webhook_urls:
        parts = urlsplit(url)
        if parts.scheme == "http" and not is_loopback(parts.hostname) and not s.webhook_allow_http:
            raise ValueError(
                f"SLUICE_WEBHOOK_URLS has plain http:// to {parts.hostname}, beyond this machine: "
                "events and their signatures would travel in clear; use https://, or set "
                "SLUICE_WEBHOOK_ALLOW_HTTP=true for a private network you trust"
            )


def endpoint_origin(url: str) -> str:
    """Only the scheme, host and port of ``url``: what a read-only operator sees of an endpoint
    whose path or query may be its own secret (``https://hooks.slack.com/***``)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    try:
        netloc += f":{parts.port}" if parts.port else ""
    except ValueError:
        pass
    rest = "/***" if parts.path.strip("/") or parts.query or parts.fragment else ""
    return f"{parts.scheme}://{netloc}{rest}"


def own_file(path: Path) -> bool:
    """Whether a configuration file is this user's and nobody else may change it."""
    try:
        st = path.stat()
    except OSError:
        return False
    return path.is_file() and st.st_uid == os.getuid() and not st.st_mode & 0o022


def env_file(cwd: Path | None = None) -> Path | None:
    """The configuration file every entry point reads: ``SLUICE_ENV_FILE`` (empty: none), else
    ``.env`` in the working directory (or ``cwd``) when it is the user's own; None when none."""
    if "SLUICE_ENV_FILE" in os.environ:  # set but empty: no file at all
        named = os.environ["SLUICE_ENV_FILE"]
        return Path(named) if named else None
    local = (cwd or Path.cwd()) / ".env"
    if not local.exists():
        return None
    if not own_file(local):
        log.warning(
            "ignoring %s: it is not yours alone (its owner or its write bits): "
            "chmod go-w it, or name a file with SLUICE_ENV_FILE",
            local.resolve(),
        )
        return None
    return local


def load_settings(**overrides) -> Settings:
    """Build and validate settings; turn validation errors into one clear message.

    Values come from the environment, then from ``env_file()``."""
    overrides.setdefault("_env_file", env_file())
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"]) if err["loc"] else ""
            var = f"SLUICE_{loc.upper()}" if loc else "settings"
            lines.append(f"{var}: {err['msg']}")
        raise SettingsError("invalid configuration:\n  " + "\n  ".join(lines)) from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    settings = load_settings()
    log.info(
        "settings loaded; secrets set: %s",
        ", ".join(k for k, v in settings.secrets_status().items() if v) or "none",
    )
    return settings


def reset_settings_cache() -> None:
    get_settings.cache_clear()
