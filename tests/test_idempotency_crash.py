"""An API process that dies inside a POST does not lock its Idempotency-Key: the client's retry
is taken as the first request (its process is gone, or a bounded time passed) and never makes a
second job."""

from __future__ import annotations

import os
from datetime import timedelta

import httpx
import pytest
from sqlmodel import Session, func, select

from sluice.storage import idempotency_records
from sluice.storage.clock import db_now
from sluice.storage.db import get_engine
from sluice.storage.models import IdempotencyRecord, Job
from tests.support.api_server import ApiServer, auth, make_key


def _upload(url: str, token: str, key: str) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/datasets/default/documents",
        json={"filename": "plan.txt", "text": "the harbour crane maintenance plan " * 40},
        headers={**auth(token), "Idempotency-Key": key},
        timeout=30,
    )


@pytest.mark.timeout(180)
def test_a_retry_after_the_api_died_inside_the_post_succeeds_once(
    database_url, sluice_env, tmp_path
):
    token = make_key("app", datasets=None, scope="ingest")
    dying = ApiServer(
        {**os.environ, "SLUICE_FAULTS": "before_document_insert=exit"}, tmp_path / "api-1.log"
    )
    dying.start()
    try:
        with pytest.raises(httpx.HTTPError):  # the process exits inside the request
            _upload(dying.url, token, "retry-me-1")
        dying.proc.wait(30)
    finally:
        dying.stop()
    api = ApiServer(dict(os.environ), tmp_path / "api-2.log")
    api.start()
    try:
        again = _upload(api.url, token, "retry-me-1")
        assert again.status_code == 202, again.text  # before: 409 idempotency_in_flight for 24 h
        replay = _upload(api.url, token, "retry-me-1")
        assert replay.status_code == 202 and replay.json() == again.json()
    finally:
        api.stop()
    with Session(get_engine(database_url)) as session:
        assert session.exec(select(func.count()).select_from(Job)).one() == 1


def test_a_first_request_of_another_host_is_taken_over_only_after_the_limit(
    database_url, sluice_env
):
    with Session(get_engine(database_url)) as session:
        now = db_now(session)
        session.add(
            IdempotencyRecord(
                key_id=7,
                idempotency_key="k",
                fingerprint="f",
                created_at=now,
                owner="elsewhere:1:1",
            )
        )
        session.commit()
        claim = idempotency_records.claim(
            session=session, key_id=7, idempotency_key="k", fingerprint="f"
        )
        assert claim.verdict == "in_flight"  # it may still be answering on its host
        row = session.exec(select(IdempotencyRecord)).one()
        row.created_at = now - idempotency_records.IN_FLIGHT_LIMIT - timedelta(seconds=1)
        session.add(row)
        session.commit()
        claim = idempotency_records.claim(
            session=session, key_id=7, idempotency_key="k", fingerprint="f"
        )
        assert claim.verdict == "first"
        again = idempotency_records.claim(
            session=session, key_id=7, idempotency_key="k", fingerprint="f"
        )
        assert again.verdict == "in_flight"  # the new first request is this process's, alive
