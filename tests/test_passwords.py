"""A locked PDF continues once the operator gives its password; the password is kept nowhere."""

import hashlib
import io
import secrets
from pathlib import Path

import pymupdf
from sqlalchemy import MetaData, select

from sluice.cli.main import main
from sluice.ops.ingest import ingest_bytes
from sluice.ops.search import search
from sluice.pipeline.running.runner import run_job
from sluice.storage.models import Document, JobStatus
from tests.support.helpers import events, job, wait_for

TEXT = "The locked ledger lists every barrel of herring landed at the north quay in March."


def locked_pdf(password: str) -> bytes:
    doc = pymupdf.open()
    doc.new_page().insert_textbox(pymupdf.Rect(72, 72, 540, 760), TEXT, fontsize=11)
    return doc.tobytes(
        encryption=pymupdf.PDF_ENCRYPT_AES_256,
        user_pw=password,
        owner_pw=password + "-owner",
        permissions=-1,
    )


def cli(capsys, monkeypatch, stdin: str, *args) -> tuple[int, str, str]:
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def traces(ctx, services, roots: list[Path], needle: str) -> list[str]:
    """Every place among the stores and logs of this test that holds ``needle``."""
    found = []
    raw = needle.encode()
    forms = {raw, needle.encode("utf-16-le"), needle.encode("utf-16-be")}
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file():
                data = path.read_bytes()
                if any(form in data for form in forms):
                    found.append(str(path))
    with ctx.engine.connect() as conn:  # the job database, row by row, whatever the engine
        meta = MetaData()
        meta.reflect(conn)
        for table in meta.sorted_tables:
            for row in conn.execute(select(table)):
                if needle in repr(tuple(row)):
                    found.append(f"database table {table.name}")
    for name, server in (("queue", services.queue), ("cache", services.cache)):
        client = server.client()
        for key in client.scan_iter(count=1000):
            value = client.dump(key) or b""
            if raw in key or raw in value:
                found.append(f"{name} redis key {key!r}")
    return found


def test_a_locked_pdf_succeeds_after_its_password_is_given_on_stdin(
    ctx, services, tmp_path, capsys, monkeypatch, caplog, start_worker
):
    from sluice.pipeline.queueing.publishing import publish

    password = "Pw-" + secrets.token_urlsafe(12)
    start_worker()
    data = locked_pdf(password)
    r = ingest_bytes(ctx, data, dataset="default", filename="ledger.pdf", publish=publish)
    [locked] = wait_for(ctx, [r.job_id])
    assert (locked.status, locked.error_code) == (JobStatus.failed, "password_protected")

    code, _, err = cli(
        capsys, monkeypatch, "not-the-password\n", "retry", str(r.job_id), "--password-stdin"
    )
    wrong = job(ctx, r.job_id)
    assert code == 1 and "wrong password" in err
    assert (wrong.status, wrong.error_kind.value, wrong.error_code) == (
        JobStatus.failed,
        "user_action_required",
        "wrong_password",
    )
    assert "wrong password" in wrong.error_message

    code, out, err = cli(
        capsys, monkeypatch, password + "\n", "retry", str(r.job_id), "--password-stdin"
    )
    assert code == 0, err
    [done] = wait_for(ctx, [r.job_id])
    assert done.status == JobStatus.succeeded, (done.error_code, done.error_message)
    hits = search(ctx, query="barrels of herring landed at the north quay", dataset="default", k=1)
    assert hits and hits[0].filename == "ledger.pdf"
    with ctx.engine.connect() as conn:
        document = conn.execute(select(Document).where(Document.id == done.document_id)).one()
    assert document.sha256 == hashlib.sha256(data).hexdigest()  # identity stays the uploaded file's
    assert [e.kind for e in events(ctx, r.job_id)].count("unlocked") == 1
    again = ingest_bytes(
        ctx, data, dataset="default", filename="ledger.pdf"
    )  # the locked file again
    assert again.duplicate and again.job_id == r.job_id

    # The search reaches the stores: the document's own words are found where they are kept.
    assert any("database" in t for t in traces(ctx, services, [], "ledger.pdf"))
    assert traces(ctx, services, [services.workdir], "herring landed")  # the Chroma server's files
    leaks = traces(ctx, services, [tmp_path, services.workdir], password)
    leaks += traces(ctx, services, [tmp_path, services.workdir], "not-the-password")
    leaks += ["test output"] if password in out + err + caplog.text else []
    assert not leaks, leaks


def test_a_wrong_password_keeps_nothing_and_the_job_stays_failed(ctx):
    r = ingest_bytes(ctx, locked_pdf("right-one"), dataset="default", filename="a.pdf")
    run_job(r.job_id, ctx=ctx)
    from sluice.ops.unlock import unlock_and_retry

    before = sorted(p.name for p in ctx.blobs.root.rglob("*") if p.is_file())
    result = unlock_and_retry(ctx, r.job_id, "wrong-one", actor="test")
    assert not result.ok and "wrong password" in result.message
    assert sorted(p.name for p in ctx.blobs.root.rglob("*") if p.is_file()) == before
    assert job(ctx, r.job_id).error_code == "wrong_password"
    assert not unlock_and_retry(ctx, r.job_id, "", actor="test").ok


def test_the_console_job_page_takes_the_password_and_forgets_it(ctx, services, tmp_path):
    from tests.support.apptest import assert_ok, open_console, texts

    password = "Pw-" + secrets.token_urlsafe(12)
    r = ingest_bytes(ctx, locked_pdf(password), dataset="default", filename="ledger.pdf")
    run_job(r.job_id, ctx=ctx)
    at = open_console("jobs", query={"job": str(r.job_id)})
    at.text_input(key=f"password_{r.job_id}").input("wrong")
    at.button(key=f"FormSubmitter:unlock_{r.job_id}-Unlock and retry").click().run()
    assert_ok(at)
    assert job(ctx, r.job_id).error_code == "wrong_password" and "wrong password" in texts(at)

    at.text_input(key=f"password_{r.job_id}").input(password)
    at.button(key=f"FormSubmitter:unlock_{r.job_id}-Unlock and retry").click().run()
    assert_ok(at)
    assert job(ctx, r.job_id).status == JobStatus.pending
    assert at.session_state[f"password_{r.job_id}"] == ""  # not kept in the session after use
    run_job(r.job_id, ctx=ctx)
    assert job(ctx, r.job_id).status == JobStatus.succeeded
    assert not traces(ctx, services, [tmp_path, services.workdir], password)
