"""The audit log: every change by the console, the CLI or an API key leaves exactly one row with its
actor, in the change's own transaction; a refusal leaves a ``refused`` row; a rolled-back change
leaves none; no row holds a secret; retention prunes old rows."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from sqlalchemy import update
from sqlmodel import Session, select

from sluice import faults
from sluice.cli.main import main as sluice_main
from sluice.errors import TransientError
from sluice.ops import actions, audit_trail, keys, pausing
from sluice.ops.access import Operator, cli_operator
from sluice.pipeline.running.context import Context, set_context
from sluice.settings import get_settings
from sluice.storage import audit_log, retention
from sluice.storage.audit_log import AuditEntry, scrub
from sluice.storage.clock import db_now
from sluice.storage.models import Job, JobStatus, utcnow
from tests.support.seed import seed_every_state

ALICE = Operator("alice", "operator", channel="console", address="10.1.2.3")


@pytest.fixture
def db_ctx(database_url, sluice_env):
    """A context on SQLite or PostgreSQL, with the session's Redis and Chroma."""
    context = Context(get_settings())
    set_context(context)
    return context


def _rows(ctx, **where) -> list[AuditEntry]:
    with Session(ctx.engine) as session:
        found = session.exec(select(AuditEntry).order_by(AuditEntry.id)).all()
    return [r for r in found if all(getattr(r, k) == v for k, v in where.items())]


def _one(ctx, action: str, **where) -> AuditEntry:
    found = _rows(ctx, action=action, **where)
    assert len(found) == 1, (action, [(r.action, r.target_id, r.outcome) for r in _rows(ctx)])
    return found[0]


def test_scrub_masks_by_key_name_and_by_value_pattern():
    token = "sluice_0123456789ab_" + "x" * 43
    cleaned = scrub(
        {
            "password": "hunter2",
            "webhook_secret": "s3",
            "nested": {"Api-Key": "k", "list": [token, "plain"]},
            "url": "https://bob:pw@example.com/hook",
            "auth": "Bearer abc.def",
            "ok": 3,
        }
    )
    text = json.dumps(cleaned)
    for secret in ("hunter2", 's3"', token, "bob:pw", "abc.def"):
        assert secret not in text
    assert cleaned["nested"]["list"][1] == "plain" and cleaned["ok"] == 3


def test_job_actions_leave_one_row_each_with_the_actor(db_ctx):
    seeded = seed_every_state(db_ctx)
    failed = seeded["failed:chroma_unreachable"][0]
    pending = seeded["pending"][0]
    succeeded = seeded["succeeded"][0]
    assert actions.retry(ALICE, [failed]).all_ok
    assert actions.set_priority(ALICE, [pending], 7).all_ok
    assert actions.reindex(ALICE, [succeeded]).all_ok
    assert actions.cancel(ALICE, [pending]).all_ok
    for action, job_id in (
        ("job.retry", failed),
        ("job.priority", pending),
        ("job.reindex", succeeded),
        ("job.cancel", pending),
    ):
        row = _one(db_ctx, action)
        assert (row.actor_kind, row.actor_name, row.address) == ("console", "alice", "10.1.2.3")
        assert (row.target_kind, row.target_id, row.outcome) == ("job", str(job_id), "done")
        assert row.dataset == "default"
    # a refusal: cancel of a finished job
    finished = seeded["cancelled"][0]
    assert not actions.cancel(ALICE, [finished]).all_ok
    refused = _rows(db_ctx, action="job.cancel", outcome="refused")
    assert len(refused) == 1 and refused[0].target_id == str(finished)
    assert "only pending" in refused[0].reason
    # a read-only operator is refused before anything, and that is recorded too
    peek = Operator("peek", "readonly")
    assert not actions.retry(peek, [failed]).all_ok
    assert _one(db_ctx, "job.retry", actor_name="peek").outcome == "refused"


def test_the_row_is_written_by_the_database_clock(db_ctx):
    seeded = seed_every_state(db_ctx)
    with Session(db_ctx.engine) as session:
        before = db_now(session)
    actions.retry(ALICE, seeded["failed:chroma_unreachable"][:1])
    with Session(db_ctx.engine) as session:
        after = db_now(session)
    [row] = audit_trail.rows(action="job.retry")
    from datetime import datetime

    assert before <= datetime.fromisoformat(row["at"]) <= after


def test_a_change_that_rolls_back_writes_no_row(db_ctx):
    seeded = seed_every_state(db_ctx)
    failed = seeded["failed:chroma_unreachable"][0]

    def boom(**info):
        raise TransientError("injected_fault", "after the change, before its commit", "")

    with faults.hook("audit_recorded", boom), pytest.raises(TransientError):
        actions.retry(ALICE, [failed])
    with Session(db_ctx.engine) as session:
        assert session.get(Job, failed).status == JobStatus.failed  # the change rolled back
    assert _rows(db_ctx) == []  # and so did its row
    with faults.hook("audit_recorded", boom), pytest.raises(TransientError):
        pausing.pause(ALICE, reason="maintenance")
    assert pausing.active() == [] and _rows(db_ctx) == []


def test_other_actions_pause_keys_settings_delete_upload(db_ctx):
    actions.create_dataset(ALICE, "books")
    assert _one(db_ctx, "dataset.create").target_id == "books"
    assert pausing.pause(ALICE, reason="maintenance").ok
    assert pausing.resume(ALICE).ok
    assert not pausing.resume(ALICE).ok  # not paused: refused
    assert _one(db_ctx, "queue.pause").params == {"reason": "maintenance"}
    assert [r.outcome for r in _rows(db_ctx, action="queue.resume")] == ["done", "refused"]
    view, token = keys.create_key(ALICE, "app", datasets=None, scope="manage")
    assert keys.revoke_key(ALICE, "app")[0]
    assert _one(db_ctx, "key.create").params["scope"] == "manage"
    assert _one(db_ctx, "key.revoke").outcome == "done"
    with pytest.raises(keys.KeyRefused):
        keys.create_key(ALICE, "app", datasets=None, scope="read")  # the name is taken
    assert [r.outcome for r in _rows(db_ctx, action="key.create")] == ["done", "refused"]
    change = actions.set_dataset_settings(ALICE, "books", {"chunk_size": "500"})
    assert change.ok, change.message
    assert _one(db_ctx, "dataset.settings").params == {"settings": {"chunk_size": "500"}}
    import io

    made = actions.upload(
        ALICE, dataset="books", filename="a.txt", stream=io.BytesIO(b"hello audit " * 50)
    )
    assert made.accepted, made
    up = _one(db_ctx, "document.upload")
    assert (up.target_id, up.dataset, up.outcome) == (str(made.document_id), "books", "done")
    assert actions.delete_document(ALICE, f"doc:{made.document_id}").ok
    gone = _one(db_ctx, "document.delete")
    assert (gone.target_id, gone.dataset) == (str(made.document_id), "books")
    result = actions.reindex_all(ALICE, dataset="books")
    assert _one(db_ctx, "dataset.reindex").target_id == "books", result
    everything = json.dumps([r.model_dump(mode="json") for r in _rows(db_ctx)])
    assert token not in everything and token.split("_", 2)[2] not in everything


def test_retention_prunes_old_rows(db_ctx):
    actions.create_dataset(ALICE, "books")
    actions.create_dataset(ALICE, "films")
    with Session(db_ctx.engine) as session:
        old_id = session.exec(select(AuditEntry.id).order_by(AuditEntry.id)).first()
        session.execute(
            update(AuditEntry)
            .where(AuditEntry.id == old_id)
            .values(at=db_now(session) - timedelta(days=400))
        )
        session.commit()
        report = retention.prune(session=session, cutoff=utcnow(), dry_run=True)
        assert report.audit == 1
        assert audit_log.prune(session=session, days=0, dry_run=False) == 0  # 0: keep everything
        report = retention.prune(session=session, cutoff=utcnow(), dry_run=False)
    assert report.audit == 1
    assert [r.target_id for r in _rows(db_ctx)] == ["films"]


def test_the_cli_records_its_os_user_and_lists_the_log(db_ctx, capsys):
    seeded = seed_every_state(db_ctx)
    failed, pending = seeded["failed:chroma_unreachable"][0], seeded["pending"][0]
    assert sluice_main(["retry", str(failed)]) == 0
    assert sluice_main(["cancel", str(pending)]) == 0
    assert sluice_main(["cancel", str(pending)]) == 1  # cancelled already: refused
    assert sluice_main(["keys", "create", "cli-app", "--all-datasets"]) == 0
    assert sluice_main(["keys", "revoke", "cli-app"]) == 0
    assert sluice_main(["pause", "--reason", "cli pause"]) == 0
    me = cli_operator().name
    for action in ("job.retry", "key.create", "key.revoke", "queue.pause"):
        row = _one(db_ctx, action)
        assert (row.actor_kind, row.actor_name, row.outcome) == ("cli", me, "done"), action
    assert [r.outcome for r in _rows(db_ctx, action="job.cancel")] == ["done", "refused"]
    capsys.readouterr()
    assert sluice_main(["audit", "--since", "2h", "--action", "queue", "--json"]) == 0
    [shown] = json.loads(capsys.readouterr().out)
    assert shown["action"] == "queue.pause" and shown["actor_kind"] == "cli"
    assert sluice_main(["audit", "--actor", me, "--outcome", "refused"]) == 0
    assert "job.cancel" in capsys.readouterr().out
    assert sluice_main(["audit", "--since", "yesterday"]) == 2
    assert "2h, 30m or 7d" in capsys.readouterr().err


def test_api_calls_are_recorded_with_the_key_and_the_address(db_ctx):
    import httpx

    from sluice.client import ApiError, Client
    from tests.support.api_server import InProcessApi, auth, make_key

    ops_token = make_key("ops", datasets=None, scope="manage")
    app_token = make_key("app", datasets=["default"], scope="ingest")
    reader = make_key("reader", datasets=None, scope="read")
    with InProcessApi() as api:
        made = httpx.post(
            f"{api.url}/v1/datasets/default/documents",
            json={"filename": "a.txt", "text": "audited words " * 40},
            headers=auth(app_token),
            timeout=30,
        )
        assert made.status_code == 202, made.text
        job_id = made.json()["jobs"][0]["job_id"]
        cancel = f"{api.url}/v1/jobs/{job_id}/cancel"
        assert httpx.post(cancel, headers=auth(app_token), timeout=30).status_code == 200
        assert httpx.post(cancel, headers=auth(app_token), timeout=30).status_code == 409
        assert keys.revoke_key(ALICE, "app")[0]
        dead = httpx.get(f"{api.url}/v1/jobs/{job_id}", headers=auth(app_token), timeout=30)
        assert dead.status_code == 401
        refused = httpx.get(f"{api.url}/v1/audit", headers=auth(reader), timeout=30)
        assert refused.status_code == 403
        assert refused.headers["content-type"].startswith("application/problem+json")
        assert refused.json()["code"] == "scope_missing"
        bad = httpx.get(f"{api.url}/v1/audit?since=soon", headers=auth(ops_token), timeout=30)
        assert bad.status_code == 422 and "2h, 30m or 7d" in bad.json()["detail"]
        first = httpx.get(f"{api.url}/v1/audit?limit=2", headers=auth(ops_token), timeout=30)
        assert first.status_code == 200 and first.json()["next_cursor"]
        with Client(api.url, ops_token) as client:
            every = client.audit(since="1h")
            assert client.audit(action="job", outcome="refused")[0]["action"] == "job.cancel"
        with Client(api.url, reader) as client, pytest.raises(ApiError):
            client.audit()
    lookup = app_token.split("_")[1]
    up = _one(db_ctx, "document.upload")
    assert (up.actor_kind, up.actor_name, up.actor_key, up.address) == (
        "api",
        "app",
        lookup,
        "127.0.0.1",
    )
    done, no = _rows(db_ctx, action="job.cancel")
    assert (done.outcome, no.outcome, done.actor_name, no.target_id) == (
        "done",
        "refused",
        "app",
        str(job_id),
    )
    dead_row = _one(db_ctx, "auth.refused")
    assert (dead_row.actor_name, dead_row.actor_key, dead_row.reason) == (
        "app",
        lookup,
        "revoked key",
    )
    assert [r["id"] for r in every] == sorted((r["id"] for r in every), reverse=True)
    assert first.json()["entries"] == every[:2]
    stored = json.dumps([r.model_dump(mode="json") for r in _rows(db_ctx)])
    for token in (ops_token, app_token, reader):
        assert token.split("_", 2)[2] not in stored


def test_the_console_records_its_operator_and_a_bad_password(make_ctx):
    from sluice.console import auth as console_auth
    from tests.support.apptest import assert_ok, open_console, texts

    context = make_ctx(SLUICE_CONSOLE_PASSWORD="correct horse 7391")
    console_auth.THROTTLE.reset()
    seeded = seed_every_state(context)
    failed = seeded["failed:chroma_unreachable"][0]
    at = open_console()
    at.text_input(key="login_password").set_value("wrong horse")
    at.button[0].click().run()
    at.text_input(key="login_password").set_value("correct horse 7391")
    at.button[0].click().run()
    assert_ok(at)
    at.switch_page("views/jobs_page.py")
    at.query_params["job"] = str(failed)
    at.run()
    at.button(key=f"retry_{failed}").click().run()
    assert_ok(at)
    bad = _one(context, "login.failed")
    assert (bad.actor_kind, bad.outcome, bad.code) == ("console", "refused", "bad_password")
    assert "wrong horse" not in json.dumps(bad.model_dump(mode="json"))
    row = _one(context, "job.retry")
    assert (row.actor_kind, row.actor_name, row.target_id) == ("console", "operator", str(failed))
    assert row.address == bad.address and row.address
    at.switch_page("views/audit_page.py").run()
    assert_ok(at)
    shown = at.dataframe[0].value
    assert shown["Action"].tolist() == ["job.retry", "login.failed"]
    at.selectbox(key="audit_outcome").set_value("refused").run()
    assert at.dataframe[0].value["Action"].tolist() == ["login.failed"]
    at.text_input(key="audit_since").set_value("tomorrow").run()
    assert "2h, 30m or 7d" in texts(at)


def test_dataset_rename_and_delete_are_recorded_and_outlive_the_dataset(db_ctx):
    from sluice.ops import dataset_admin

    actions.create_dataset(ALICE, "drafts")
    assert dataset_admin.rename(db_ctx, ALICE, "drafts", "notes").ok
    assert not dataset_admin.rename(db_ctx, ALICE, "nothing", "other").ok
    done = dataset_admin.delete(db_ctx, ALICE, "notes")
    assert done.ok, done.message
    renamed, unknown = _rows(db_ctx, action="dataset.rename")
    assert (renamed.outcome, renamed.target_id, renamed.params) == (
        "done",
        "drafts",
        {"name": "notes"},
    )
    assert (unknown.outcome, unknown.code) == ("refused", "unknown_dataset")
    gone = _one(db_ctx, "dataset.delete")
    assert (gone.actor_name, gone.target_id, gone.outcome) == ("alice", "notes", "done")
    assert len(_rows(db_ctx)) == 4  # with dataset.create: the rows outlive the dataset


def test_a_new_version_under_an_external_id_is_recorded_as_a_replace(db_ctx):
    import io

    first = actions.upload(
        ALICE,
        dataset="default",
        filename="v.txt",
        stream=io.BytesIO(b"first " * 80),
        external_id="doc-7",
    )
    second = actions.upload(
        ALICE,
        dataset="default",
        filename="v.txt",
        stream=io.BytesIO(b"second " * 80),
        external_id="doc-7",
    )
    assert first.accepted and second.accepted and second.replaces_document_id, second
    up, replace = _one(db_ctx, "document.upload"), _one(db_ctx, "document.replace")
    assert (up.target_id, up.params["external_id"]) == (str(first.document_id), "doc-7")
    assert (replace.target_id, replace.actor_name) == (str(second.document_id), "alice")


def test_metadata_and_chunk_switches_are_recorded(db_ctx):
    from sluice.ops import chunks, metadata
    from tests.support.helpers import ids_of_job

    seeded = seed_every_state(db_ctx)
    with Session(db_ctx.engine) as session:
        job = session.get(Job, seeded["succeeded"][0])
    chunk_id = ids_of_job(db_ctx, job.id)[0]
    actions.set_document_metadata(ALICE, job.document_id, {"lang": "de", "api_key": "k-1"})
    with pytest.raises(metadata.MetadataError):
        actions.set_document_metadata(ALICE, job.document_id, {"_reserved": 1})
    actions.set_chunk_enabled(ALICE, chunk_id, False)
    actions.set_chunk_enabled(ALICE, chunk_id, True)
    with pytest.raises(chunks.UnknownChunk):
        actions.set_chunk_enabled(ALICE, "no-such-chunk", False)
    done, bad = _rows(db_ctx, action="document.metadata")
    assert (done.outcome, done.target_id, bad.outcome) == ("done", str(job.document_id), "refused")
    assert done.params == {"metadata": {"lang": "de", "api_key": "[redacted]"}}
    off = _one(db_ctx, "chunk.disable", outcome="done")
    assert (off.target_id, off.actor_name) == (chunk_id, "alice")
    assert _one(db_ctx, "chunk.enable").outcome == "done"
    assert _one(db_ctx, "chunk.disable", outcome="refused").target_id == "no-such-chunk"
