"""An open event stream (``GET /v1/events``) is only as good as its key, against a real
``sluice serve api``: revoking the key ends the stream at once with a last comment and nothing
after it; a stream whose dataset is deleted ends too, and never gets the events of the next dataset
(which may be given the deleted one's id: a stream checks that each dataset is still the one it
started with); and one key may hold only so many streams open at once."""

from __future__ import annotations

import io
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from sqlmodel import Session, select

from sluice.ops import actions, dataset_admin, keys
from sluice.ops.access import cli_operator
from sluice.ops.reads import ctx
from sluice.storage.models import Dataset
from tests.support.api_server import ApiServer, auth, make_key

pytestmark = pytest.mark.timeout(180)
END_WITHIN = 5.0  # a stream's end after its key or its dataset went: well within this


@contextmanager
def _stream(api: ApiServer, token: str, **params) -> Iterator[httpx.Response]:
    # ``seconds`` bounds a stream that would never end by itself (the code before the change)
    query = {"seconds": "20", **params}
    timeout = httpx.Timeout(30, read=25)
    with (
        httpx.Client(timeout=timeout) as client,
        client.stream("GET", f"{api.url}/v1/events", headers=auth(token), params=query) as r,
    ):
        yield r


def _frames(lines: Iterator[str]) -> Iterator[list[str]]:
    """The stream's frames (blocks of lines ending in a blank one)."""
    frame: list[str] = []
    for line in lines:
        if line == "":
            if frame:
                yield frame
            frame = []
        else:
            frame.append(line)
    if frame:
        yield frame


def _upload(dataset: str, name: str) -> None:
    data = io.BytesIO(f"the file {name} of {dataset} ".encode() * 40)
    result = actions.upload(cli_operator(), dataset=dataset, filename=name, stream=data)
    assert result.accepted, result.message


def _reuse_id(gone: str, name: str) -> None:
    """A new dataset with the id of the deleted one, as a database that hands a freed id out
    again makes it (SQLite without AUTOINCREMENT reuses the highest id once its row is gone)."""
    with Session(ctx().engine) as session:
        assert session.exec(select(Dataset).where(Dataset.name == gone)).first() is None
        session.add(Dataset(id=_ids[gone], name=name, collection=f"reused-{name}"))
        session.commit()


_ids: dict[str, int] = {}


def test_revoking_the_key_ends_its_open_stream_with_nothing_after(sluice_env, tmp_path):
    token = make_key("watcher", datasets=None, scope="read")
    api = ApiServer(dict(os.environ), tmp_path / "api.log")
    api.start()
    try:
        with _stream(api, token) as r:
            assert r.status_code == 200
            frames = _frames(r.iter_lines())
            assert next(frames) == ["retry: 2000"]
            _upload("default", "before.txt")  # an event the stream delivers while the key lives
            first = next(frames)
            assert any(line.startswith("event: job.queued") for line in first), first
            assert keys.revoke_key(cli_operator(), "watcher")[0]
            revoked = time.monotonic()
            _upload("default", "after.txt")  # after the revocation: must not reach the stream
            rest = list(frames)
            ended = time.monotonic() - revoked
    finally:
        api.stop()
    assert rest and rest[-1] == [": closed: the key was revoked"], rest
    assert not any(line.startswith(("id:", "event:", "data:")) for f in rest for line in f), rest
    assert ended < END_WITHIN, f"the stream ran on {ended:.1f} s after its key was revoked"


def test_a_deleted_datasets_stream_ends_and_gets_nothing_of_the_next_dataset(sluice_env, tmp_path):
    _upload("alpha", "a.txt")  # makes the dataset
    with Session(ctx().engine) as session:
        _ids["alpha"] = session.exec(select(Dataset.id).where(Dataset.name == "alpha")).one()
    token = make_key("alpha-reader", datasets=["alpha"], scope="read")
    api = ApiServer(dict(os.environ), tmp_path / "api.log")
    api.start()
    try:
        with _stream(api, token) as r:
            assert r.status_code == 200
            frames = _frames(r.iter_lines())
            assert next(frames) == ["retry: 2000"]
            result = dataset_admin.delete(ctx(), cli_operator(), "alpha", wait=10)
            assert result.ok, result.message
            deleted = time.monotonic()
            _reuse_id("alpha", "beta")
            _upload("beta", "b.txt")
            rest = list(frames)
            ended = time.monotonic() - deleted
    finally:
        api.stop()
    data = [line for f in rest for line in f if line.startswith("data:")]
    assert not any('"beta"' in line or "b.txt" in line for line in data), data
    assert rest and rest[-1] == [": closed: the dataset was deleted"], rest
    assert ended < END_WITHIN, f"the stream ran on {ended:.1f} s after its dataset went"


def test_one_key_may_hold_only_so_many_streams(sluice_env, tmp_path):
    greedy = make_key("greedy", datasets=None, scope="read")
    other = make_key("other", datasets=None, scope="read")
    env = {**os.environ, "SLUICE_API_MAX_STREAMS_PER_KEY": "2"}
    api = ApiServer(env, tmp_path / "api.log")
    api.start()
    try:
        with _stream(api, greedy) as one, _stream(api, greedy) as two:
            assert (one.status_code, two.status_code) == (200, 200)
            # both are open and streaming (an iterator dropped half-read closes its connection:
            # keep them)
            lines = [r.iter_lines() for r in (one, two)]
            assert [next(it) for it in lines] == ["retry: 2000"] * 2
            third = httpx.get(f"{api.url}/v1/events", headers=auth(greedy), timeout=10)
            assert third.status_code == 429, third.text
            assert third.headers["content-type"].startswith("application/problem+json")
            assert third.json()["code"] == "too_many_streams"
            assert third.headers["retry-after"].isdigit()
            with _stream(api, other, seconds="0.5") as theirs:  # another key is not held back
                assert theirs.status_code == 200
        # the two closed: the key's places come back (the server sees the client go at its next
        # poll, a fraction of a second)
        deadline = time.monotonic() + END_WITHIN
        while True:
            again = httpx.get(
                f"{api.url}/v1/events", headers=auth(greedy), params={"seconds": "0.2"}, timeout=10
            )
            if again.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert again.status_code == 200, again.text
    finally:
        api.stop()
