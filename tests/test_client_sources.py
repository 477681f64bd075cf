"""Sources through the Python client: an S3 prefix (moto's S3 server) added by a manage key of one
dataset, previewed, held until confirmed, synced, its files indexed by a real worker, and removed,
with a real ``sluice serve api``; for ``Client`` and ``AsyncClient``."""

from __future__ import annotations

import asyncio
import os

import pytest

from sluice.client import ApiError, Source, SyncResult
from sluice.ops import actions
from sluice.ops.access import cli_operator
from tests.support.api_server import ApiServer, make_key
from tests.support.either_client import collect, opened, v, words
from tests.support.object_store import CREDENTIALS, MotoServer, new_bucket, s3_client


@pytest.fixture(scope="module")
def moto(tmp_path_factory):
    server = MotoServer(tmp_path_factory.mktemp("moto"))
    server.start()
    yield server
    server.stop()


async def follow(kind: str, url: str, token: str, bucket: str, start_worker) -> None:
    async with opened(kind, url, token) as c:
        made = await v(c.add_source("team", s3=f"s3://{bucket}/team", every="1h"))
        assert isinstance(made, Source)
        assert (made.name, made.dataset, made.every_seconds) == ("team", "docs", 3600)
        assert made.confirmed is False
        with pytest.raises(ApiError) as twice:
            await v(c.add_source("team", s3=f"s3://{bucket}/team"))
        assert twice.value.status == 409
        with pytest.raises(ApiError) as refused:
            await v(c.add_source("elsewhere", s3="s3://another-bucket/x"))
        assert refused.value.status == 422
        assert [s.name for s in await v(c.sources())] == ["team"]

        look = await v(c.sync_source("team", preview=True))
        assert isinstance(look, SyncResult) and not look.ran and look.counts["added"] == 3
        held = await v(c.sync_source("team"))
        assert held.status == "unconfirmed" and not held.ran
        assert (await v(c.source("team"))).documents == 0
        ran = await v(c.sync_source("team", confirm=True))
        assert ran.status == "done" and ran.counts["added"] == 3 and ran.run_id

        start_worker()
        jobs = await collect(c.iter_jobs(dataset="docs"))
        assert len(jobs) == 3
        for job in jobs:
            assert (await v(c.wait(job.id, timeout=120))).status == "succeeded"
        hits = await v(c.search("orchard section", k=3, mode="lexical"))
        assert hits and hits[0].filename == "f1.txt"
        assert (await v(c.source("team"))).documents == 3

        gone = await v(c.remove_source("team"))
        assert gone.ok and gone.deleted == 3 and gone.kept == 0
        with pytest.raises(ApiError) as missing:
            await v(c.source("team"))
        assert missing.value.status == 404


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_the_client_adds_previews_confirms_syncs_and_removes_an_s3_source(
    kind, moto, sluice_env, start_worker, tmp_path, monkeypatch
):
    bucket = new_bucket(moto.url)
    for i, subject in enumerate(["harbour", "orchard", "meadow"]):
        s3_client(moto.url).put_object(
            Bucket=bucket, Key=f"team/f{i}.txt", Body=words(subject).encode()
        )
    env = {
        **CREDENTIALS,
        "SLUICE_S3_ENDPOINT_URL": moto.url,
        "SLUICE_API_SOURCE_S3_ALLOWED": f"{bucket}/team",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)  # the worker's and the API's environment
    assert actions.create_dataset(cli_operator(), "docs")[0]
    token = make_key("m", datasets=["docs"], scope="manage")
    api = ApiServer(dict(os.environ), tmp_path / "api.log")
    api.start()
    try:
        asyncio.run(follow(kind, api.url, token, bucket, start_worker))
    finally:
        api.stop()
