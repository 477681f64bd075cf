"""Parsing is bounded: text per page and per document, memory, time, and a cancel stops it.

Extraction runs in a child process; a PDF text bomb (a small compressed stream that shows millions
of characters) or a MuPDF call that never returns costs the worker neither its memory nor its
thread, and the console's previews never parse in the console's own process.
"""

import os
import threading
import time
from pathlib import Path

from sqlmodel import Session

from sluice.ops.ingest import ingest_bytes
from sluice.ops.preview import preview_jobs
from sluice.pipeline.running.runner import run_job
from sluice.storage import jobs
from sluice.storage.models import JobStatus
from tests.support import pdfmaker
from tests.support.helpers import events, job

BOMB_CHARS = 6_000_000  # about 670 MB of MuPDF text structures when extracted without a limit


class RssWatch(threading.Thread):
    """Samples this process's resident memory while a block runs; the growth is ``grown_mb``."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.start_mb = self.peak_mb = self._rss_mb()
        self.error: BaseException | None = None

    @staticmethod
    def _rss_mb() -> float:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    def run(self) -> None:
        try:
            while not self.stop.wait(0.02):
                self.peak_mb = max(self.peak_mb, self._rss_mb())
        except BaseException as exc:  # surfaced by __exit__
            self.error = exc

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.join(timeout=5)
        if self.error:
            raise self.error

    @property
    def grown_mb(self) -> float:
        return self.peak_mb - self.start_mb


def run_in_thread(ctx, job_id):
    out = {}
    thread = threading.Thread(
        target=lambda: out.setdefault("outcome", run_job(job_id, ctx=ctx)), daemon=True
    )
    thread.start()
    return thread, out


def _extract_children() -> list[int]:
    """Extraction processes still alive under this process: its direct children that run the
    extractor, and the children of its parse fork server (which itself stays, ready to fork)."""
    me = str(os.getpid())
    parents, commands = {}, {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                parents[pid] = fh.read().rsplit(")", 1)[1].split()[1]
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                commands[pid] = fh.read()
        except OSError:
            continue
    servers = {
        pid
        for pid, parent in parents.items()
        if parent == me and b"forkserver" in commands.get(pid, b"")
    }
    return [
        int(pid)
        for pid, parent in parents.items()
        if (
            parent == me
            and pid not in servers
            and b"sluice.pipeline.parsing.extract" in commands.get(pid, b"")
        )
        or (parent in servers and pid in commands)
    ]


def test_text_bomb_fails_once_as_user_action_and_the_worker_keeps_its_memory(make_ctx):
    ctx = make_ctx(SLUICE_PARSE_MAX_MEMORY_MB="400")
    r = ingest_bytes(ctx, pdfmaker.text_bomb(BOMB_CHARS), dataset="default", filename="bomb.pdf")

    with RssWatch() as watch:
        run_job(r.job_id, ctx=ctx)

    j = job(ctx, r.job_id)
    assert (j.status, j.error_kind.value, j.error_code, j.attempt) == (
        JobStatus.failed,
        "user_action_required",
        "parse_memory_limit",
        1,
    ), j.error_message
    assert "SLUICE_PARSE_MAX_MEMORY_MB" in j.fix_hint and "bomb.pdf" in j.error_message
    assert watch.grown_mb < 150, f"the worker grew by {watch.grown_mb:.0f} MB"
    assert _extract_children() == []


def test_a_bomb_page_is_skipped_and_the_rest_of_the_document_indexed(make_ctx):
    ctx = make_ctx(SLUICE_PARSE_MAX_MEMORY_MB="400")
    data = pdfmaker.text_bomb(
        BOMB_CHARS, then=b"The second page describes the lighthouse in plain words."
    )
    r = ingest_bytes(ctx, data, dataset="default", filename="bomb-and-page.pdf")
    run_job(r.job_id, ctx=ctx)
    j = job(ctx, r.job_id)
    assert (j.status, j.chunk_count, j.page_count) == (JobStatus.succeeded, 1, 2), j.error_message
    warned = [e.message for e in events(ctx, j.id) if e.kind == "warning"]
    assert any("page 1" in w and "SLUICE_PARSE_MAX_MEMORY_MB" in w for w in warned), warned


def test_text_per_page_is_cut_with_a_warning_and_per_document_refused(make_ctx):
    ctx = make_ctx(SLUICE_PARSE_MAX_PAGE_CHARS="5000")
    r = ingest_bytes(ctx, pdfmaker.text_bomb(20_000), dataset="default", filename="dense.pdf")
    run_job(r.job_id, ctx=ctx)
    j = job(ctx, r.job_id)
    assert j.status == JobStatus.succeeded and j.chunk_count <= 10  # 5,000 characters, not 20,000
    assert any(
        "SLUICE_PARSE_MAX_PAGE_CHARS" in e.message for e in events(ctx, j.id) if e.kind == "warning"
    )

    ctx = make_ctx(SLUICE_PARSE_MAX_DOCUMENT_CHARS="10000")
    r = ingest_bytes(
        ctx,
        pdfmaker.text_pdf(["Many words about tides and currents. " * 100] * 4),
        dataset="default",
        filename="long.pdf",
    )
    run_job(r.job_id, ctx=ctx)
    j = job(ctx, r.job_id)
    assert (j.status, j.error_code, j.attempt) == (JobStatus.failed, "too_much_text", 1)
    assert "SLUICE_PARSE_MAX_DOCUMENT_CHARS" in j.fix_hint


def test_an_extraction_that_never_returns_is_stopped_by_the_stage_time_limit(make_ctx):
    # stage_timeout is transient (a starved host): one attempt, so the test sees it end
    ctx = make_ctx(
        SLUICE_STAGE_TIMEOUT_SECONDS="2",
        SLUICE_FAULTS="extract_page=sleep:120",
        SLUICE_MAX_ATTEMPTS="1",
    )
    r = ingest_bytes(
        ctx,
        pdfmaker.text_pdf(["The page that hangs the reader."]),
        dataset="default",
        filename="hang.pdf",
    )
    started = time.monotonic()
    thread, _ = run_in_thread(ctx, r.job_id)
    thread.join(timeout=30)
    assert not thread.is_alive(), "the job is still parsing"
    j = job(ctx, r.job_id)
    assert (j.status, j.error_code, j.attempt) == (JobStatus.failed, "stage_timeout", 1)
    assert time.monotonic() - started < 15
    assert _extract_children() == []


def test_cancel_stops_an_extraction_that_never_returns(make_ctx):
    ctx = make_ctx(SLUICE_FAULTS="extract_page=sleep:120")
    r = ingest_bytes(
        ctx,
        pdfmaker.text_pdf(["The page that hangs the reader."]),
        dataset="default",
        filename="hang.pdf",
    )
    thread, _ = run_in_thread(ctx, r.job_id)
    deadline = time.monotonic() + 20
    while job(ctx, r.job_id).status != JobStatus.running:
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.05)
    with Session(ctx.engine) as session:
        jobs.request_cancel(session=session, job_ids=[r.job_id], actor="test")
    thread.join(timeout=20)
    assert not thread.is_alive(), "cancel was ignored"
    assert job(ctx, r.job_id).status == JobStatus.cancelled
    assert _extract_children() == []


def test_a_preview_never_parses_in_the_calling_process(make_ctx):
    ctx = make_ctx(SLUICE_PARSE_MAX_MEMORY_MB="400")
    r = ingest_bytes(ctx, pdfmaker.text_bomb(BOMB_CHARS), dataset="default", filename="bomb.pdf")
    with RssWatch() as watch:
        preview = preview_jobs(ctx, [r.job_id])
    assert preview.unreadable == 1
    assert watch.grown_mb < 150, f"the console process grew by {watch.grown_mb:.0f} MB"


def test_a_preview_parses_within_its_time_budget_and_extrapolates(make_ctx):
    ctx = make_ctx()
    ids = [
        ingest_bytes(
            ctx,
            pdfmaker.text_pdf([f"Document {i} about the ferry timetable and its delays."]),
            dataset="default",
            filename=f"d{i}.pdf",
        ).job_id
        for i in range(3)
    ]
    preview = preview_jobs(ctx, ids, budget_seconds=0)
    assert preview.sampled == 1 and preview.estimated and preview.chunks == 3


def test_the_extraction_child_dies_with_a_worker_killed_mid_parse(tmp_path):
    """A worker killed with SIGKILL (OOM killer, kill -9) leaves no extraction running on."""
    import signal
    import subprocess
    import sys

    pdf = tmp_path / "hang.pdf"
    pdf.write_bytes(pdfmaker.text_pdf(["The page that hangs the reader."]))
    script = (
        "import sys, time\n"
        "from sluice.pipeline.parsing.parse import PDF, open_document\n"
        f"parsed = open_document({str(pdf)!r}, media_type=PDF, max_pages=5)\n"
        "print(parsed._child.proc.pid, flush=True)\n"
        "for _ in parsed.pages():\n"
        "    pass\n"
    )
    env = {**os.environ, "SLUICE_FAULTS": "extract_page=sleep:120"}
    worker = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, env=env, text=True
    )
    child = None
    try:
        child = int(worker.stdout.readline())
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(timeout=10)
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{child}") and _state(child) != "Z":
            assert time.monotonic() < deadline, "the extraction child outlived its worker"
            time.sleep(0.05)
    finally:
        worker.kill()
        worker.wait(timeout=10)
        if child and _state(child) not in ("gone", "Z"):
            os.kill(child, signal.SIGKILL)  # only when the test failed: leave nothing behind


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_extraction_children_fork_from_a_server_holding_pymupdf_and_never_rerun_the_main_script(
    tmp_path,
):
    """A child per document, without an interpreter start and a PyMuPDF import each time (about
    0.3 s of CPU, more than encoding a small document): it is forked from the parse fork server,
    which holds PyMuPDF without its optional layout modules (a fork of 144 MB cost 9.5 ms of CPU, of
    50 MB 4.7 ms).
    The calling program's main script (a worker's, the console's) is not run again there."""
    import subprocess
    import sys

    pdf = tmp_path / "page.pdf"
    pdf.write_bytes(pdfmaker.text_pdf(["A page about the ferry timetable."]))
    marker = tmp_path / "main-ran-again"
    script = tmp_path / "caller.py"
    script.write_text(
        f"import os, sys\nif __name__ != '__main__':\n    open({str(marker)!r}, "
        "'a').write(__name__)\nfrom sluice.pipeline.parsing.parse import PDF, open_document\nif "
        "__name__ == '__main__':\n    for _ in range(2):\n        parsed = "
        f"open_document({str(pdf)!r}, media_type=PDF, max_pages=5)\n        pid = "
        "parsed._child.proc.pid\n        with open(f'/proc/{pid}/stat') as fh:\n            "
        "parent = int(fh.read().rsplit(')', 1)[1].split()[1])\n        with "
        "open(f'/proc/{parent}/cmdline', 'rb') as fh:\n            server = fh.read()\n        "
        "with open(f'/proc/{parent}/maps', 'rb') as fh:\n            maps = fh.read()\n        "
        "text = ' '.join(t for _, t in parsed.pages())\n        print(parent != os.getpid(), "
        "b'forkserver' in server, b'parsing.preload' in server,\n              b'onnxruntime' in "
        "maps or b'numpy' in maps, text, flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # ... and the server holds no optional layout modules (onnxruntime, numpy: about 100 MB that
    # every fork would copy the page tables of)
    assert (
        done.stdout.splitlines() == ["True True True False A page about the ferry timetable."] * 2
    )
    assert not marker.exists(), marker.read_text()


def test_a_small_text_file_is_read_in_the_worker_with_the_answers_a_child_gives(
    tmp_path, monkeypatch
):
    """A fork per tiny .txt cost more CPU than the job's own work: files up to IN_WORKER_TEXT_BYTES
    are read in the worker by the same code. Same pages, same warnings, same refusals as a child;
    a larger file still goes to a child."""
    from sluice.errors import PipelineError
    from sluice.pipeline.parsing import parse

    files = {
        "note.txt": "Tides and currents. " * 400,
        "notes.md": "# Harbour\n\nThe tide table. " * 50,
        "blank.txt": " .. \n\n - ",
        "latin1.txt": "Caf\xe9 cr\xe8me, na\xefve. " * 20,
    }
    for name, text in files.items():
        (tmp_path / name).write_bytes(text.encode("latin-1" if name == "latin1.txt" else "utf-8"))
    big = tmp_path / "big.txt"
    big.write_text("Many words about the harbour. " * 10_000)

    def answer(path: Path, *, limits=None):
        media = parse.MARKDOWN if path.suffix == ".md" else parse.TEXT
        try:
            doc = parse.open_document(
                path, media_type=media, max_pages=100, limits=limits, name=path.name
            )
            return doc.page_count, list(doc.pages()), doc.warnings
        except PipelineError as exc:
            return type(exc).__name__, exc.code, str(exc)

    started = []
    real_child = parse._Child
    monkeypatch.setattr(
        parse, "_Child", lambda *a, **kw: started.append(a[0].name) or real_child(*a, **kw)
    )
    in_worker = {name: answer(tmp_path / name) for name in files}
    assert started == []  # no child for any of them
    assert in_worker["blank.txt"][:2] == ("UserActionError", "no_text")
    note = files["note.txt"]
    assert in_worker["note.txt"][0] == -(-len(note) // parse.TEXT_PAGE_CHARS)
    assert "".join(t for _, t in in_worker["note.txt"][1]).strip() == note.strip()
    too_long = answer(tmp_path / "note.txt", limits=parse.ParseLimits(max_document_chars=1000))
    assert too_long[:2] == ("UserActionError", "too_much_text") and started == []

    assert big.stat().st_size > parse.IN_WORKER_TEXT_BYTES
    assert answer(big)[0] == -(-big.stat().st_size // parse.TEXT_PAGE_CHARS) and started == [
        "big.txt"
    ]  # a large file is read by a child

    # A failure that is not a refusal says what a child's death says, with the file's name, not its
    # path.
    def broken(_request):
        raise PermissionError(13, "Permission denied", str(tmp_path / "note.txt"))
        yield

    with monkeypatch.context() as m:
        m.setattr(parse, "read", broken)
        failed = answer(tmp_path / "note.txt")
    assert failed[:2] == ("TransientError", "parser_failed") and str(tmp_path) not in failed[2], (
        failed
    )

    monkeypatch.setattr(
        parse, "IN_WORKER_TEXT_BYTES", -1
    )  # every file to a child: the same answers
    assert {name: answer(tmp_path / name) for name in files} == in_worker
    assert (
        answer(tmp_path / "note.txt", limits=parse.ParseLimits(max_document_chars=1000)) == too_long
    )
    assert len(started) == 1 + len(files) + 1
