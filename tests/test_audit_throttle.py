"""A client hammering the API with a bad token writes one audit row a minute per token and
address, counting the rest in it (``params["repeats"]``), by the database's clock; every call
still answers 401 problem+json."""

from __future__ import annotations

import time
from datetime import timedelta

import httpx
import pytest
from sqlalchemy import update
from sqlmodel import Session, col, select

from sluice.ops import audit_trail, keys
from sluice.ops.access import cli_operator
from sluice.pipeline.running.context import Context, set_context
from sluice.settings import get_settings
from sluice.storage.audit_log import AuditEntry
from sluice.storage.clock import db_now
from tests.support.api_server import InProcessApi, auth, make_key

pytestmark = pytest.mark.timeout(120)


def _refusals(context: Context) -> list[AuditEntry]:
    with Session(context.engine) as session:
        query = select(AuditEntry).where(AuditEntry.action == "auth.refused")
        return list(session.exec(query.order_by(col(AuditEntry.id))).all())


def _hammer(client: httpx.Client, url: str, token: str, times: int) -> None:
    for _ in range(times):
        answer = client.get(f"{url}/v1/datasets", headers=auth(token), timeout=30)
        assert answer.status_code == 401, answer.text
        assert answer.headers["content-type"].startswith("application/problem+json")
        assert answer.json()["code"] == "unauthorized"


def test_fifty_bad_calls_write_one_row_that_counts_them(database_url):
    context = Context(get_settings())
    set_context(context)
    dead = make_key("dead", datasets=None, scope="read")
    lookup = dead.split("_")[1]
    assert keys.revoke_key(cli_operator(), "dead")[0]
    unknown = "sluice_0123456789ab_" + "x" * 43
    elsewhere = httpx.HTTPTransport(local_address="127.0.0.2")  # another client address
    with InProcessApi() as api, httpx.Client() as client, httpx.Client(transport=elsewhere) as far:
        _hammer(client, api.url, dead, 50)
        audit_trail.flush_refusals()  # what this process counted and had not written yet
        [row] = _refusals(context)
        assert (row.actor_key, row.address, row.reason, row.params.get("repeats")) == (
            lookup,
            "127.0.0.1",
            "revoked key (and 49 more within 60 s)",
            49,
        )
        _hammer(client, api.url, unknown, 3)  # another token: its own row
        _hammer(client, api.url, "not a token", 2)  # no token prefix at all: "unknown"
        _hammer(far, api.url, dead, 2)  # the same token from another address: its own row
        audit_trail.flush_refusals()
        rows = _refusals(context)
        assert [(r.actor_key, r.address, r.params.get("repeats", 0)) for r in rows] == [
            (lookup, "127.0.0.1", 49),
            ("0123456789ab", "127.0.0.1", 2),
            (None, "127.0.0.1", 1),
            (lookup, "127.0.0.2", 1),
        ]
        with Session(context.engine) as session:  # a minute on, by the database's clock
            minute_ago = db_now(session) - timedelta(seconds=61)
            session.execute(update(AuditEntry).values(at=minute_ago))
            session.commit()
        _hammer(client, api.url, dead, 1)
        later = _refusals(context)
        assert len(later) == 5 and later[-1].actor_key == lookup
        assert later[-1].params.get("repeats", 0) == 0 and later[0].params["repeats"] == 49


def _audit_writes(engine, seen: list[str]):
    def count(conn, cursor, statement, parameters, context, executemany) -> None:
        head = statement.lstrip().upper()
        if head.startswith(("INSERT INTO AUDIT", "UPDATE AUDIT")):
            seen.append(head[:40])

    return count


def test_a_flood_of_refusals_costs_the_job_database_one_write_a_second(database_url):
    """200 refusals of one bad token in a burst: before, each wrote the row again (a SELECT FOR
    UPDATE and an UPDATE per bad call, in the database every worker writes its jobs to); now the
    first writes, the rest are counted in the process, and the background flush writes their count
    within a second or two, all of it."""
    from sqlalchemy import event

    from sluice.ops.access import Operator

    context = Context(get_settings())
    set_context(context)
    who = Operator("unknown", "readonly", channel="api", address="203.0.113.9", key="feedfacecafe")
    seen: list[str] = []
    listener = _audit_writes(context.engine, seen)
    event.listen(context.engine, "before_cursor_execute", listener)
    try:
        for _ in range(200):
            audit_trail.refused_once_per(
                audit_trail.FLOOD_SPAN, who, "auth.refused", "unknown key", code="unauthorized"
            )
        burst = len(seen)
        assert burst <= 3, seen  # before: 200
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # the flush thread's round, bounded
            rows = _refusals(context)
            if rows and rows[-1].params.get("repeats") == 199:
                break
            time.sleep(0.1)
    finally:
        event.remove(context.engine, "before_cursor_execute", listener)
    [row] = _refusals(context)
    assert (row.actor_key, row.params.get("repeats")) == ("feedfacecafe", 199)
    assert row.reason == "unknown key (and 199 more within 60 s)"
    assert len(seen) <= burst + 2, seen


def test_an_api_process_that_stops_writes_the_count_it_still_held(database_url, monkeypatch):
    """The background round is an hour away here: only the API's shutdown can write the count
    (before: the 29 refusals after the first were lost with the process)."""
    monkeypatch.setattr(audit_trail, "FLOOD_FLUSH_SECONDS", 3600.0)
    context = Context(get_settings())
    set_context(context)
    unknown = "sluice_00aa11bb22cc_" + "y" * 43
    with InProcessApi() as api, httpx.Client() as client:
        _hammer(client, api.url, unknown, 30)
        [row] = _refusals(context)
        assert row.params.get("repeats", 0) == 0  # the first only, so far
    [row] = _refusals(context)
    assert (row.actor_key, row.params.get("repeats")) == ("00aa11bb22cc", 29)


def test_varying_the_lookup_id_buys_no_rows_and_the_map_stays_bounded(database_url, monkeypatch):
    """2,000 refused tokens with 2,000 lookup ids from one address: before, 2,000 rows and 2,000
    commits, and 2,000 floods remembered; now the address's first few tokens get a row each, the
    rest share one (lookup id ``*``), all counted. Then 2,000 addresses: the floods remembered
    stay at the map's size, the oldest written and forgotten."""
    from sqlalchemy import event

    from sluice.api.authentication import record_refusal

    # the once-a-second writes of a flood's count (the test above) wait here: the burst's writes
    # are then exactly the rows it makes
    monkeypatch.setattr(audit_trail, "FLOOD_FLUSH_SECONDS", 3600.0)
    context = Context(get_settings())
    set_context(context)
    seen: list[str] = []
    listener = _audit_writes(context.engine, seen)
    event.listen(context.engine, "before_cursor_execute", listener)
    try:
        for i in range(2000):
            record_refusal(f"sluice_{i:012x}_" + "z" * 43, "198.51.100.7")
        burst = len(seen)
        most = audit_trail.flood_count()
        audit_trail.flush_refusals()
        flushed = len(seen) - burst
    finally:
        event.remove(context.engine, "before_cursor_execute", listener)
    per_address = audit_trail.FLOOD_KEYS_PER_ADDRESS
    # a row for each of the address's own few tokens and one they share (before: 2,000 rows)
    assert burst == per_address + 1, seen
    assert flushed == 1, seen  # the shared row's count, once
    assert most <= per_address + 1  # before: 2,000
    rows = _refusals(context)
    assert len(rows) == per_address + 1, [(r.actor_key, r.reason) for r in rows]
    shared = rows[-1]
    assert (shared.actor_key, shared.address) == ("*", "198.51.100.7")
    assert 1 + shared.params["repeats"] + per_address == 2000  # every refusal counted once
    assert shared.reason.startswith("tokens of many keys from one address (and ")

    monkeypatch.setattr(audit_trail, "FLOOD_MAP_SIZE", 100)
    for i in range(2000):  # many addresses: the map keeps its size
        record_refusal("sluice_00000000beef_" + "z" * 43, f"10.0.{i // 250}.{i % 250}")
        assert audit_trail.flood_count() <= 100
    audit_trail.flush_refusals()
