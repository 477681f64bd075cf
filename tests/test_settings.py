"""Settings: validated at the start of every process, errors name the variable, secrets never
logged, and .env.example lists exactly the variables the settings object reads."""

from __future__ import annotations

import logging
import os
import re
import subprocess
from pathlib import Path

import pytest

from sluice.settings import (
    Settings,
    SettingsError,
    get_settings,
    load_settings,
    reset_settings_cache,
)
from tests.support.servers import Consumer

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / ".env.example"
KEY_LINE = re.compile(r"^#?\s*(SLUICE_[A-Z0-9_]+)=")

SECRET = "pa55-Secret-do-not-log"


@pytest.fixture
def clean_env(monkeypatch):
    """No SLUICE_ variable from the session (the suite's servers) leaks into these tests."""
    for key in [k for k in os.environ if k.startswith("SLUICE_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("SLUICE_ENV_FILE", "")
    reset_settings_cache()
    yield monkeypatch
    reset_settings_cache()


def _example_keys() -> list[tuple[int, str]]:
    lines = EXAMPLE.read_text().splitlines()
    return [(i, m.group(1)) for i, line in enumerate(lines) if (m := KEY_LINE.match(line))]


def test_env_example_lists_every_setting_once_with_a_comment():
    lines = EXAMPLE.read_text().splitlines()
    keys = [k for _, k in _example_keys()]
    expected = {f"SLUICE_{name.upper()}" for name in Settings.model_fields}
    assert len(keys) == len(set(keys)), "a variable is listed twice"
    assert set(keys) == expected, (
        f"missing from .env.example: {sorted(expected - set(keys))}; "
        f"not a setting: {sorted(set(keys) - expected)}"
    )
    for i, key in _example_keys():
        above = lines[i - 1] if i else ""
        assert above.startswith("#") and not KEY_LINE.match(above), (
            f"{key} has no comment line above it"
        )


def test_env_example_is_a_valid_configuration(clean_env, tmp_path):
    """Copying .env.example to .env gives a configuration that passes validation as it is."""
    settings = load_settings(_env_file=str(EXAMPLE))
    assert settings.queue_name == "sluice"
    assert settings.max_upload_bytes == 100 * 1024 * 1024
    assert settings.max_pages == 5000 and settings.max_chunks == 50000
    # Secrets are commented out there: nothing is set, nothing is a placeholder.
    assert not any(settings.secrets_status().values())
    # And on loopback by default.
    for url in (settings.queue_redis_url, settings.cache_redis_url, settings.chroma_url):
        assert "127.0.0.1" in url
    assert settings.console_is_loopback


def test_dotenv_is_ignored_by_git():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    done = subprocess.run(["git", "check-ignore", "-q", ".env"], cwd=ROOT)
    assert done.returncode == 0, ".env must be listed in .gitignore"
    assert subprocess.run(["git", "check-ignore", "-q", ".env.example"], cwd=ROOT).returncode == 1


def test_dotenv_file_is_read(clean_env, tmp_path):
    env_file = tmp_path / ".env"
    env_file.write_text("SLUICE_MAX_PAGES=12\nSLUICE_QUEUE_NAME=from-file\n")
    clean_env.setenv("SLUICE_MAX_PAGES", "34")  # the environment wins over the file
    settings = load_settings(_env_file=str(env_file))
    assert (settings.max_pages, settings.queue_name) == (34, "from-file")


BAD_VALUES = [
    ("SLUICE_MAX_PAGES", "lots", "SLUICE_MAX_PAGES"),
    ("SLUICE_MAX_PAGES", "0", "SLUICE_MAX_PAGES"),
    ("SLUICE_MAX_UPLOAD_BYTES", "-5", "SLUICE_MAX_UPLOAD_BYTES"),
    ("SLUICE_STAGE_TIMEOUT_SECONDS", "0", "SLUICE_STAGE_TIMEOUT_SECONDS"),
    ("SLUICE_QUEUE_REDIS_URL", "http://127.0.0.1:6390/0", "SLUICE_QUEUE_REDIS_URL"),
    ("SLUICE_CACHE_REDIS_URL", "redis://127.0.0.1:6390/0", "SLUICE_CACHE_REDIS_URL"),
    ("SLUICE_CHROMA_URL", "127.0.0.1:8100", "SLUICE_CHROMA_URL"),
    ("SLUICE_CHROMA_URL", "https://proxy.example/chroma", "SLUICE_CHROMA_URL"),
    ("SLUICE_EMBEDDER", "bogus", "SLUICE_EMBEDDER"),
    ("SLUICE_EMBED_PRECISION", "fp8", "SLUICE_EMBED_PRECISION"),
    ("SLUICE_CHUNK_OVERLAP", "900", "SLUICE_CHUNK_OVERLAP"),
    ("SLUICE_CONSOLE_PASSWORD", "changeme", "SLUICE_CONSOLE_PASSWORD"),
    ("SLUICE_CHROMA_TOKEN", "", "SLUICE_CHROMA_TOKEN"),
    ("SLUICE_CONSOLE_PORT", "eighty", "SLUICE_CONSOLE_PORT"),
]


@pytest.mark.parametrize(
    ("var", "value", "named"), BAD_VALUES, ids=[f"{v}={x!r}" for v, x, _ in BAD_VALUES]
)
def test_a_bad_value_is_refused_naming_the_variable(clean_env, var, value, named):
    clean_env.setenv(var, value)
    with pytest.raises(SettingsError) as info:
        get_settings()
    assert named in str(info.value)
    assert str(info.value).startswith("invalid configuration")


def _set_every_secret(env) -> None:
    env.setenv("SLUICE_CONSOLE_PASSWORD", SECRET + "-console")
    env.setenv("SLUICE_CONSOLE_READONLY_PASSWORD", SECRET + "-readonly")
    env.setenv("SLUICE_CHROMA_TOKEN", SECRET + "-chroma")
    env.setenv("SLUICE_QUEUE_REDIS_URL", f"redis://:{SECRET}-queue@127.0.0.1:6390/0")
    env.setenv("SLUICE_CACHE_REDIS_URL", f"redis://:{SECRET}-cache@127.0.0.1:6391/0")
    env.setenv("SLUICE_DATABASE_URL", f"postgresql://sluice:{SECRET}-db@127.0.0.1:5432/sluice")
    env.setenv("SLUICE_WEBHOOK_SECRET", SECRET + "-webhook-signing-key")
    env.setenv("SLUICE_METRICS_TOKEN", SECRET + "-metrics")
    env.setenv("SLUICE_WEBHOOK_URLS", f"https://hooks:{SECRET}-hook@hooks.example/in")


def test_logs_name_the_secrets_that_are_set_never_their_values(clean_env, caplog):
    _set_every_secret(clean_env)
    with caplog.at_level(logging.DEBUG):
        settings = get_settings()
        logging.getLogger("test").info(
            "config: %s / %r / %s", settings.public_view(), settings, settings
        )
    assert "secrets set:" in caplog.text
    for name in (
        "SLUICE_CONSOLE_PASSWORD",
        "SLUICE_CONSOLE_READONLY_PASSWORD",
        "SLUICE_CHROMA_TOKEN",
        "SLUICE_METRICS_TOKEN",
        "queue Redis password",
        "cache Redis password",
        "database password",
    ):
        assert name in caplog.text
    assert all(settings.secrets_status().values())
    assert SECRET not in caplog.text
    view = settings.public_view()
    assert view["SLUICE_CONSOLE_PASSWORD"] == "set"
    assert view["SLUICE_QUEUE_REDIS_URL"] == "redis://:***@127.0.0.1:6390/0"
    assert SECRET not in repr(view)


def test_no_secret_is_logged_when_none_is_set(clean_env, caplog):
    with caplog.at_level(logging.INFO):
        get_settings()
    assert "secrets set: none" in caplog.text


@pytest.mark.parametrize(
    "bad",
    [
        {"SLUICE_QUEUE_REDIS_URL": f"http://:{SECRET}@127.0.0.1:6390/0"},
        {"SLUICE_CHROMA_URL": f"ftp://user:{SECRET}@chroma.example"},
        {"SLUICE_MAX_PAGES": "0"},
        {"SLUICE_CONSOLE_PASSWORD": "changeme"},
    ],
    ids=["bad-redis-url", "bad-chroma-url", "bad-other-value", "placeholder-password"],
)
def test_a_refused_configuration_never_echoes_a_secret(clean_env, caplog, bad):
    _set_every_secret(clean_env)
    for key, value in bad.items():
        clean_env.setenv(key, value)
    with caplog.at_level(logging.DEBUG), pytest.raises(SettingsError) as info:
        get_settings()
    assert list(bad)[0] in str(info.value)
    assert SECRET not in str(info.value)
    assert SECRET not in caplog.text


# --- every process validates at its start -------------------------------------------------------


def test_cli_refuses_to_start_naming_the_variable(clean_env, capsys):
    from sluice.cli.main import main

    clean_env.setenv("SLUICE_MAX_CHUNKS", "none")
    assert main(["jobs"]) == 2
    err = capsys.readouterr().err
    assert "SLUICE_MAX_CHUNKS" in err and "invalid configuration" in err


def test_console_refuses_to_start_naming_the_variable(clean_env, capsys):
    """`sluice serve console` validates the settings before anything else (no exec happens)."""
    from sluice.cli.main import main

    clean_env.setenv("SLUICE_CONSOLE_PORT", "eighty")
    assert main(["serve", "console"]) == 2
    assert "SLUICE_CONSOLE_PORT" in capsys.readouterr().err


def test_worker_refuses_to_start_naming_the_variable(clean_env, tmp_path):
    """huey_consumer imports sluice.worker.hooks, which validates the settings: a bad
    value stops it."""
    env = {**os.environ, "SLUICE_CHUNK_SIZE": "7", "SLUICE_CONSOLE_PASSWORD": SECRET}
    consumer = Consumer(env, tmp_path / "worker.log", workers=1)
    consumer.start()
    try:
        code = consumer.proc.wait(120)
    finally:
        consumer.stop()
    out = consumer.output()
    assert code != 0
    assert "SLUICE_CHUNK_SIZE" in out and "invalid configuration" in out
    assert SECRET not in out
