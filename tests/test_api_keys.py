"""``sluice keys create|list|revoke``: the token is printed once and kept only as a hash."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from sqlmodel import Session, select

from sluice.api.authentication import authenticate
from sluice.ops.reads import ctx
from sluice.storage.models import ApiKey


def sluice(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sluice.cli.main", *args],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_key_is_shown_once_kept_as_a_hash_and_revoked(database_url):
    made = sluice("keys", "create", "app", "--dataset", "default", "--scope", "ingest")
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert token.startswith("sluice_") and "shown only now" in made.stderr
    listed = sluice("keys", "list", "--json")
    assert token not in listed.stdout and token.split("_", 2)[2] not in listed.stdout
    [row] = json.loads(listed.stdout)
    assert (row["name"], row["scope"], row["datasets"], row["revoked_at"]) == (
        "app",
        "ingest",
        ["default"],
        None,
    )
    with Session(ctx().engine) as session:
        stored = session.exec(select(ApiKey)).one()
    assert token not in stored.model_dump_json()
    key = authenticate(token)
    assert key is not None and key.reaches(1) and not key.reaches(2) and key.allows("ingest")
    assert authenticate(token[:-1] + ("A" if token[-1] != "A" else "B")) is None
    assert sluice("keys", "create", "app", "--all-datasets").returncode == 1  # the name is taken
    assert sluice("keys", "create", "x", "--dataset", "nope").returncode == 1
    assert sluice("keys", "revoke", "app").returncode == 0
    assert authenticate(token) is None
    assert json.loads(sluice("keys", "list", "--json").stdout)[0]["revoked_at"] is not None
