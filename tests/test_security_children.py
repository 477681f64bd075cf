"""What the children that parse hostile bytes or hold a PDF's password can give away.

The parse children (forked from a fork server), the decrypt child and Tesseract below them get none
of Sluice's secrets in their environment; the decrypt child shows no file name in its arguments,
cannot dump core, and no other process of the same user can read its memory. Each test holds the
real child at a fault point (``wait:``) and looks at it through /proc, as another process would.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pymupdf
import pytest
from sqlmodel import Session

from sluice.ops.ingest import ingest_bytes
from sluice.pipeline.running.runner import run_job
from sluice.storage.models import Document, Job, JobStatus
from tests.support import pdfmaker
from tests.support.helpers import job, wait_for

SECRETS = {
    "SLUICE_CONSOLE_PASSWORD": "console-Secret-" + secrets.token_hex(6),
    "SLUICE_CONSOLE_READONLY_PASSWORD": "readonly-Secret-" + secrets.token_hex(6),
    "SLUICE_WEBHOOK_SECRET": "webhook-Secret-" + secrets.token_hex(16),
    "SLUICE_CHROMA_TOKEN": "chroma-Token-" + secrets.token_hex(6),
}


def locked_pdf(password: str) -> bytes:
    doc = pymupdf.open()
    doc.new_page().insert_text((72, 72), "The board's salaries, in full.", fontsize=11)
    return doc.tobytes(
        encryption=pymupdf.PDF_ENCRYPT_AES_256,
        user_pw=password,
        owner_pw=password + "-owner",
        permissions=-1,
    )


def _blob_key(ctx, job_id: int) -> str:
    with Session(ctx.engine) as session:
        return session.get(Document, session.get(Job, job_id).document_id).blob_key


def _with_secrets(data_dir: Path) -> dict[str, str]:
    """The secrets a console or worker holds in its environment, and its database URL."""
    database = f"sqlite:///{(data_dir / 'sluice.db').resolve()}"
    return {**SECRETS, "SLUICE_DATABASE_URL": database}


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


def _leaked(pid: int, values: dict[str, str]) -> list[str]:
    """The names of ``values`` whose value shows in the process's environment, or in its name."""
    env = _environ(pid)
    return [key for key, value in values.items() if value in "\0".join(env.values()) or key in env]


def _held(release: Path, timeout: float = 60) -> int:
    """The pid of the process that reached the ``wait:`` fault point (it writes RELEASE.waiting)."""
    waiting = Path(f"{release}.waiting")
    deadline = time.monotonic() + timeout
    while not waiting.exists() or not waiting.read_text():
        assert time.monotonic() < deadline, "no child reached the fault point"
        time.sleep(0.05)
    return int(waiting.read_text())


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


# Run by another process of the same user, without CAP_SYS_PTRACE (what a root test must drop to
# be an ordinary process of that user): search a process's memory for the password, as a debugger
# or a core dump would see it (/proc/<pid>/mem asks the kernel's ptrace check, which a process
# that is not dumpable fails).
READER = r"""
import json, os, sys
pid, needle = int(sys.argv[1]), sys.argv[2].encode()
out = {}
try:
    found = False
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            span, perms = line.split()[:2]
            if not perms.startswith("rw"):
                continue
            start, end = (int(x, 16) for x in span.split("-"))
            try:
                mem.seek(start)
                found = found or needle in mem.read(end - start)
            except (OSError, OverflowError, ValueError):
                continue
    out["memory"] = "password found" if found else "read, no password"
except OSError as exc:
    out["memory"] = type(exc).__name__
print(json.dumps(out))
"""


def _setpriv() -> list[str] | None:
    """A prefix that runs a command as the same user without CAP_SYS_PTRACE, or None."""
    tool = shutil.which("setpriv")
    if os.geteuid() != 0 or tool is None:
        return None
    return [tool, "--bounding-set", "-sys_ptrace", "--"]


def _read_as_same_user(prefix: list[str], pid: int, needle: str) -> dict:
    done = subprocess.run(
        [*prefix, sys.executable, "-c", READER, str(pid), needle],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_decrypt_child_shows_no_name_dumps_no_core_and_lets_no_process_read_it(ctx, tmp_path):
    """`sluice retry --password-stdin`, the real receiving process, decrypts through a child held
    just after the password opened the file: its argv names no file, its core limit is 0, its
    environment holds none of the CLI's secrets, and a process of the same user (no
    CAP_SYS_PTRACE) cannot read its memory, while it can read the CLI's."""
    password = "Pw-" + secrets.token_urlsafe(12)
    name = "Salaries of the board 2025.pdf"
    r = ingest_bytes(ctx, locked_pdf(password), dataset="default", filename=name)
    run_job(r.job_id, ctx=ctx)
    assert job(ctx, r.job_id).error_code == "password_protected"

    release = tmp_path / "release-decrypt"
    extra = _with_secrets(Path(os.environ["SLUICE_DATA_DIR"]))
    env = {**os.environ, **extra, "SLUICE_FAULTS": f"decrypt_authenticated=wait:{release}"}
    prefix = _setpriv()
    stdin, typed = os.pipe()  # the password as piped in by whoever runs the command
    os.write(typed, password.encode() + b"\n")
    os.close(typed)
    cli = subprocess.Popen(
        [*(prefix or []), sys.executable, "-m", "sluice.cli.main", "retry", str(r.job_id)]
        + ["--password-stdin"],
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    os.close(stdin)
    try:
        child = _held(release)
        assert _parent(child) == cli.pid

        argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")[:-1]
        assert argv[1:] == [b"-m", b"sluice.pipeline.parsing.extract", b"--decrypt"], argv
        blob = ctx.blobs.path(_blob_key(ctx, r.job_id))
        for shown in (name.encode(), b"Salaries", str(blob).encode(), blob.name.encode()):
            assert shown not in b" ".join(argv), f"ps shows {shown!r}"

        limits = Path(f"/proc/{child}/limits").read_text().splitlines()
        [core] = [line for line in limits if line.startswith("Max core file size")]
        assert core.split()[4:6] == ["0", "0"], core

        assert not _leaked(child, extra), "the decrypt child holds the CLI's secrets"

        if prefix is not None:
            own = _read_as_same_user(prefix, cli.pid, password)
            assert own["memory"] != "PermissionError", own  # it reads a process of its user...
            seen = _read_as_same_user(prefix, child, password)
            # ... but not the undumpable child that holds the password
            assert seen["memory"] == "PermissionError", seen
    finally:
        release.touch()
        out, err = cli.communicate(timeout=120)
    assert cli.returncode == 0, err.decode()
    assert password.encode() not in out + err
    assert job(ctx, r.job_id).status in (JobStatus.pending, JobStatus.retrying)
    if prefix is None:
        pytest.skip("reading the child as another process of its user needs root and setpriv")


def test_parse_children_and_tesseract_get_none_of_the_workers_secrets(
    make_ctx, start_worker, tmp_path
):
    """A real worker with Sluice's secrets in its environment parses a scan: the extraction child
    (held at its first page), the fork server it was forked from, and the Tesseract it runs hold
    none of them."""
    from sluice.pipeline.queueing.publishing import publish

    real = shutil.which("tesseract")
    if real is None:
        pytest.skip("Tesseract is not installed (make ocr)")
    ctx = make_ctx()
    seen_by_tesseract = tmp_path / "tesseract-env.log"
    fake = tmp_path / "bin" / "tesseract"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\nenv >> "{seen_by_tesseract}"\nexec "{real}" "$@"\n')
    fake.chmod(0o755)

    release = tmp_path / "release-extract"
    extra = _with_secrets(Path(os.environ["SLUICE_DATA_DIR"]))
    start_worker(
        workers=1,
        env={
            **extra,
            "SLUICE_FAULTS": f"extract_page=wait:{release}",
            "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}",
        },
    )
    try:
        r = ingest_bytes(
            ctx, pdfmaker.scanned(), dataset="default", filename="scan.pdf", publish=publish
        )
        child = _held(release)
        server = _parent(child)
        assert b"forkserver" in Path(f"/proc/{server}/cmdline").read_bytes()
        assert not _leaked(child, extra), "the parse child holds the worker's secrets"
        assert not _leaked(server, extra), "the parse fork server holds the worker's secrets"
        child_env = _environ(child)
        assert not [k for k in child_env if k.startswith("SLUICE_") and k != "SLUICE_FAULTS"]
    finally:
        release.touch()
    [done] = wait_for(ctx, [r.job_id], timeout=120)
    assert done.status == JobStatus.succeeded, (done.error_code, done.error_message)
    env_of_tesseract = seen_by_tesseract.read_text()
    assert env_of_tesseract, "Tesseract never ran"
    assert not [k for k, v in extra.items() if v in env_of_tesseract or f"{k}=" in env_of_tesseract]
