"""The `sluice` command: the console's operations from a shell, with --json for scripts."""

import json

from sluice.cli.main import main
from sluice.pipeline.running.runner import run_job
from tests.support.helpers import events, job


def run(capsys, *args):
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_ingest_jobs_dead_retry_cancel(ctx, capsys, tmp_path, samples):
    good = tmp_path / "good.txt"
    good.write_text("Lighthouses guide ships along rocky coasts at night. " * 40)
    bad = samples / "005-libreoffice-writer-password.pdf"
    fake = tmp_path / "picture.pdf"
    fake.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 200)

    code, out, err = run(capsys, "ingest", str(good), str(bad), str(fake), "--dataset", "docs")
    assert code == 1  # one file was refused up front
    lines = out.strip().splitlines()
    assert len(lines) == 3
    good_id, bad_id = int(lines[0].split("\t")[0]), int(lines[1].split("\t")[0])
    assert "refused: unsupported file type: the bytes are image/png" in lines[2]

    for job_id in (good_id, bad_id):
        run_job(job_id, ctx=ctx)

    code, out, _ = run(capsys, "jobs", "--dataset", "docs", "--json")
    rows = {r["id"]: r for r in json.loads(out)}
    assert rows[good_id]["status"] == "succeeded" and rows[good_id]["dataset"] == "docs"
    assert rows[bad_id]["error_kind"] == "user_action_required"

    code, out, _ = run(capsys, "dead", "--json")
    [group] = json.loads(out)
    assert (group["kind"], group["code"], group["count"]) == (
        "user_action_required",
        "password_protected",
        1,
    )
    assert "--password-stdin" in group["fix_hint"] and "remove the password" in group["fix_hint"]
    assert [j["id"] for j in group["jobs"]] == [bad_id]

    code, _, err = run(capsys, "retry", str(good_id))
    assert code == 1 and "already succeeded; retry refused" in err and "reindex" in err

    code, out, err = run(capsys, "retry", "--dead", "--kind", "user_action_required")
    assert code == 0 and f"job {bad_id} queued again" in out
    # said plainly: the same bytes fail the same way, and what helps instead
    assert "warning:" in err and "fails the same way" in err and "remove the password" in err
    assert job(ctx, bad_id).status.value == "pending" and job(ctx, bad_id).attempt == 0
    retried = [e for e in events(ctx, bad_id) if e.kind == "retried"]
    assert retried and retried[0].actor.startswith("cli:")

    code, out, _ = run(capsys, "cancel", str(bad_id))
    assert code == 0 and "cancelled before it ran" in out
    assert job(ctx, bad_id).status.value == "cancelled"

    code, out, _ = run(capsys, "datasets", "--json")
    docs = next(d for d in json.loads(out) if d["name"] == "docs")
    assert docs["documents"] == 2 and docs["chunks"] == job(ctx, good_id).chunk_count

    code, out, _ = run(capsys, "search", "lighthouse ships", "--dataset", "docs", "--json")
    assert json.loads(out)[0]["filename"] == "good.txt"

    code, out, _ = run(capsys, "show", str(bad_id), "--json")
    shown = json.loads(out)
    assert [e["kind"] for e in shown["events"]][:3] == ["created", "claimed", "failed"]


def test_ingest_wait_fails_when_a_job_fails(ctx, capsys, samples, start_worker):
    start_worker()
    code, out, _ = run(
        capsys,
        "ingest",
        str(samples / "001-minimal-document.pdf"),
        str(samples / "017-unreadablemetadata.pdf"),
        "--wait",
        "--timeout",
        "120",
    )
    assert code == 1
    assert "1/2 succeeded" in out
    assert "permanent: unreadable PDF" in out


def test_bad_setting_is_named(capsys, monkeypatch, sluice_env):
    from sluice.settings import reset_settings_cache

    monkeypatch.setenv("SLUICE_MAX_ATTEMPTS", "zero")
    reset_settings_cache()
    code, _, err = run(capsys, "jobs")
    assert code == 2 and "SLUICE_MAX_ATTEMPTS" in err


def test_ingest_wait_on_a_terminal_draws_one_live_line_with_totals(
    ctx, sluice_env, tmp_path, start_worker
):
    import os
    import pty
    import select
    import subprocess
    import sys
    import time

    start_worker()
    files = []
    for i in range(3):
        f = tmp_path / f"note-{i}.txt"
        f.write_text(f"Harbour pilots board ships number {i} at dawn. " * 60)
        files.append(str(f))
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sluice.cli", "ingest", *files, "--wait", "--timeout", "120"],
        stdout=slave,
        stderr=subprocess.PIPE,
        env=sluice_env,
    )
    os.close(slave)
    out, deadline = b"", time.monotonic() + 150
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(master, 4096)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
        assert proc.wait(timeout=10) == 0, proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    text = out.decode(errors="replace")
    assert "\r\x1b[K[" in text  # the line is redrawn in place, not printed once per batch
    assert "3/3 done (3 succeeded, 0 failed)" in text and "3/3 succeeded" in text
    assert "\tsucceeded\t" not in text  # no per-job log lines on a terminal


def test_an_id_beyond_the_integer_columns_is_not_found_not_a_crash(database_url, capsys):
    """On PostgreSQL an id past 2**31-1 cannot even be compared with an INTEGER column; the
    commands answer for it as for any job that does not exist."""
    huge = str(99_999_999_999)
    assert main(["show", huge]) == 1
    assert f"no job {huge}" in capsys.readouterr().err
    for command in (["retry", huge], ["cancel", huge]):
        assert main(command) == 1
        assert f"job {huge} does not exist" in capsys.readouterr().err, command
    assert main(["retry", huge, "--dry-run"]) == 0
    assert "0 job(s)" in capsys.readouterr().out
