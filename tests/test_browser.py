"""End to end in a real browser: Debian's Chromium, driven by Playwright, against the running
system.

The console starts as the Procfile starts it (``sluice serve console``) on a free port; the queue
and cache Redis and Chroma are the test session's; the worker is a real ``huey_consumer``. Through
the pages only: upload a text PDF and an encrypted one, see the first succeed and the second land in
dead letters with its fix hint, retry it from there (it fails again, as it must), cancel a running
job, search for a phrase of the first, and open the hit's document with its page image.

Screenshots of every page go to ``test-output/screenshots/``. With ``README_SCREENSHOTS=1``
the jobs and dead-letter pages are also written to ``docs/screenshots/`` for the README.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
import zipfile
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from sqlmodel import Session, select

from sluice.storage.models import Job, JobStatus
from tests.support.helpers import events, job, wait_for
from tests.support.servers import ManagedProcess, free_port, wait_port

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
SHOTS = ROOT / "test-output" / "screenshots"
DOCS_SHOTS = ROOT / "docs" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
TIMEOUT_MS = 90_000
FIRST = "004-pdflatex-4-pages.pdf"
LOCKED = "005-libreoffice-writer-password.pdf"
OTHERS = (
    "007-imagemagick-images.pdf",
    "011-google-doc-document.pdf",
    "021-crazyones-pdfa.pdf",
)  # for fuller pages
PHRASE = "Huardest gefburn"  # a phrase from 004-pdflatex-4-pages.pdf


def _sluice_argv(*args: str) -> list[str]:
    exe = Path(sys.executable).with_name("sluice")
    return [str(exe), *args] if exe.exists() else [sys.executable, "-m", "sluice.cli.main", *args]


@pytest.fixture
def console(sluice_env, tmp_path):
    """``sluice serve console`` on a free port, with this test's settings; its base URL."""
    port = free_port()
    env = {**os.environ, "SLUICE_CONSOLE_PORT": str(port), "SLUICE_CONSOLE_ADDRESS": "127.0.0.1"}
    env["SLUICE_CONSOLE_SIGN_IN"] = "off"  # the pages under test, not the local link (its own test)
    proc = ManagedProcess(_sluice_argv("serve", "console"), log=tmp_path / "console.log", env=env)
    proc.start()
    try:
        wait_port(port, 90)
    except TimeoutError:
        proc.stop()
        raise AssertionError(f"console did not start:\n{proc.output()[-3000:]}") from None
    yield f"http://127.0.0.1:{port}"
    proc.stop()


@pytest.fixture
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing: `make browser` installs Debian's chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def _shoot(page, name: str) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.wait_for_timeout(800)  # let the last rerun's elements settle before the picture
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def _open(page, url: str, heading: str) -> None:
    page.goto(url)
    page.get_by_role("heading", name=heading, exact=True).wait_for(timeout=TIMEOUT_MS)
    _idle(page)


def _idle(page) -> None:
    """Until the page's script run is over. A click during a rerun can land on an element that the
    rerun replaces, and a text field's value reaches the script only when it is committed."""
    page.locator('[data-testid="stApp"][data-test-script-state="notRunning"]').wait_for(
        timeout=TIMEOUT_MS
    )


def _click_until(page, selector: str, shown: str, tries: int = 4) -> None:
    """Click ``selector`` until ``shown`` appears (at most ``tries`` clicks, each waited for a
    quarter of TIMEOUT_MS): a click that lands while a rerun the test cannot see has begun is
    dropped by Streamlit, and ``_idle`` may look before that rerun starts."""
    for attempt in range(tries):
        page.locator(selector).click()
        _idle(page)
        try:
            page.locator(shown).wait_for(timeout=TIMEOUT_MS // 4)
            return
        except Exception:  # playwright's TimeoutError: the click was lost; the last one raises
            if attempt == tries - 1:
                raise


def _text(page, text: str):
    try:
        page.get_by_text(text).first.wait_for(timeout=TIMEOUT_MS)
    except Exception as exc:  # playwright's TimeoutError: say what the page showed instead
        shot = _shoot(page, "missing-text")
        shown = page.locator("body").inner_text(timeout=5_000)[-3000:]
        raise AssertionError(
            f"{text!r} never showed ({exc}); see {shot}; the page:\n{shown}"
        ) from exc


def _job_id(ctx, filename: str) -> int:
    with Session(ctx.engine) as session:
        return session.exec(select(Job.id).where(Job.filename == filename)).one()


def _slow_text(path: Path) -> Path:
    """Enough text for a dozen embedding batches at batch size 4 (about a second each, see env)."""
    lines = [
        f"Line {i} of the long handbook, about sluice gates, weirs and locks number {i}."
        for i in range(700)
    ]
    path.write_text("\n".join(lines))
    return path


def _wait_progress(ctx, job_id: int, done: int, timeout: float = 60) -> None:
    """Until the running job has written at least ``done`` of its stage counts."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        j = job(ctx, job_id)
        if j.status == JobStatus.running and j.stage.value == "embedding" and j.done >= done:
            return
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not get to embedding {done}: {job(ctx, job_id)}")


def test_upload_watch_dead_letter_retry_cancel_and_search_in_a_browser(
    ctx, console, browser, start_worker, samples, tmp_path
):
    start_worker(env={"SLUICE_FAULTS": "embed_batch=sleep:1", "SLUICE_EMBED_BATCH_SIZE": "4"})
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    page.set_default_timeout(TIMEOUT_MS)

    # A first visit: the empty Overview says what to do first and leads to the upload page.
    _open(page, console, "Overview")
    _text(page, "Nothing here yet. Start by uploading documents")
    _shoot(page, "overview-empty")
    page.get_by_role("link", name="Upload documents").click()
    page.get_by_role("heading", name="Upload", exact=True).wait_for()

    # Upload a text PDF, an encrypted PDF, three more, and a file Sluice cannot read: the browser
    # lets every file through, and each one gets a line; the result follows its jobs live.
    files = [samples / name for name in (FIRST, LOCKED, *OTHERS)]
    slides = tmp_path / "slides.docx"
    with zipfile.ZipFile(slides, "w") as archive:  # a ZIP archive, but no Word document in it
        archive.writestr("notes.txt", "not a slide deck")
    chosen = [*files, slides]
    page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(
        [str(f) for f in chosen]
    )
    page.locator('[data-testid="stFileChip"]').nth(len(chosen) - 1).wait_for()
    page.get_by_role("button", name="Upload and index").click()
    _text(
        page,
        f"{len(chosen)} file(s) chosen: {len(files)} new job(s), 0 already uploaded, 1 refused.",
    )
    _text(page, "slides.docx — refused: unsupported file type")
    _text(page, "following them live")
    _shoot(page, "upload")
    good, locked = _job_id(ctx, FIRST), _job_id(ctx, LOCKED)
    wait_for(ctx, [_job_id(ctx, f.name) for f in files], timeout=90)
    _text(page, f"{len(files)} of {len(files)} job(s) finished.")  # the page moved on by itself

    # The first reaches succeeded; the page shows it (the jobs page refreshes by itself).
    # .first: while a live page reruns, Streamlit keeps the last run's elements beside the new ones
    # for a moment, so the same link may be there twice (seen once in three loaded runs).
    page.get_by_role("link", name=f"Open job {good}").first.click()
    page.get_by_role("heading", name=f"Job {good} · 004-pdflatex-4-pages.pdf").wait_for()
    _text(page, "Indexed:")
    assert wait_for(ctx, [good], timeout=60)[0].status == JobStatus.succeeded

    # The encrypted one lands in dead letters with its hint.
    assert wait_for(ctx, [locked], timeout=60)[0].status == JobStatus.failed
    _open(page, f"{console}/dead_letters", "Dead letters")
    _text(page, "needs your action · password protected")
    _text(page, "remove the password and upload the file again.")
    _text(page, "needs your action · no text even by ocr")  # 007: images only, OCR found no text
    _shoot(page, "dead-letters")

    # Retry it from the dead-letter page: it runs again and fails again, as it must.
    page.locator(".st-key-retry_all-user_action_required-password_protected button").click()
    _text(page, "Retry all 1 job(s) of this group?")
    page.locator(".st-key-retry_all-user_action_required-password_protected-yes button").click()
    _text(page, "Retry: 1 job(s)")
    [again] = wait_for(ctx, [locked], timeout=60)  # pending since the click, failed once more now
    kinds = [e.kind for e in events(ctx, locked)]
    assert again.status == JobStatus.failed
    assert "retried" in kinds and kinds.count("claimed") == 2 and kinds.count("failed") == 2, kinds
    assert next(e for e in events(ctx, locked) if e.kind == "retried").actor == "console:local"

    # Cancel a running job.
    _open(page, f"{console}/upload", "Upload")
    page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(
        str(_slow_text(tmp_path / "long-handbook.txt"))
    )
    page.locator('[data-testid="stFileChip"]').first.wait_for()
    page.get_by_role("button", name="Upload and index").click()
    _text(page, "1 new job(s)")
    slow = _job_id(ctx, "long-handbook.txt")
    _wait_progress(ctx, slow, 8)
    _open(page, f"{console}/jobs", "Jobs")
    _text(page, "live, every 2 s")
    _shoot(page, "jobs")
    page.goto(f"{console}/jobs?job={slow}")
    _text(page, "chunks")  # the running job's stage counts, e.g. "embedding 8/44 chunks"
    _shoot(page, "job-running")
    page.get_by_role("button", name="Cancel job").click()
    page.get_by_role("button", name="Confirm: Cancel job").click()
    [stopped] = wait_for(ctx, [slow], timeout=60)
    assert stopped.status == JobStatus.cancelled, (stopped.status, stopped.error_message)
    assert any(
        e.kind == "cancel_requested" and e.actor == "console:local" for e in events(ctx, slow)
    )
    _text(page, "cancelled at embedding")
    _shoot(page, "job-cancelled")

    # Search for a phrase of the first document.
    _open(page, f"{console}/search", "Search")
    page.get_by_label("Query").fill(PHRASE)
    page.get_by_role("button", name="Search", exact=True).click()
    _text(page, "1. 004-pdflatex-4-pages.pdf")
    _shoot(page, "search")

    # Open the first hit's document: its chunks, and its page rendered as an image.
    page.get_by_role("link", name="Open document").first.click()
    page.get_by_role("heading", name="Document", exact=True).wait_for(timeout=TIMEOUT_MS)
    _text(page, "Chunks, in order")
    image = page.locator('[data-testid="stImage"] img').first
    image.wait_for(state="visible", timeout=TIMEOUT_MS)
    assert page.evaluate("(img) => img.naturalWidth", image.element_handle()) > 100
    _text(page, "the chunk highlighted")
    _shoot(page, "document")

    _open(page, console, "Overview")
    _shoot(page, "overview")
    _open(page, f"{console}/system", "System")
    _text(page, "reachable")
    _shoot(page, "system")

    if os.environ.get("README_SCREENSHOTS") == "1":
        _to_docs(["overview", "jobs", "dead-letters", "search"])


def _to_docs(names: list[str]) -> None:
    """Copy screenshots for the README, shrunk to a palette image to keep the repository small."""
    from PIL import Image

    DOCS_SHOTS.mkdir(parents=True, exist_ok=True)
    for name in names:
        src, dst = SHOTS / f"{name}.png", DOCS_SHOTS / f"{name}.png"
        try:
            with Image.open(src) as im:
                im.convert("RGB").quantize(colors=128).save(dst, optimize=True)
        except OSError:
            shutil.copyfile(src, dst)


def test_a_locked_pdf_is_unlocked_from_its_job_page_in_a_browser(
    ctx, console, browser, start_worker, services, tmp_path
):
    import secrets

    from sluice.ops.ingest import ingest_bytes
    from sluice.pipeline.queueing.publishing import publish
    from tests.test_passwords import locked_pdf, traces

    password = "Pw-" + secrets.token_urlsafe(12)
    start_worker()
    r = ingest_bytes(
        ctx, locked_pdf(password), dataset="default", filename="ledger.pdf", publish=publish
    )
    assert wait_for(ctx, [r.job_id], timeout=60)[0].error_code == "password_protected"

    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    _open(page, f"{console}/jobs?job={r.job_id}", "Jobs")
    field = page.get_by_label("Password of the PDF", exact=True)
    field.fill("wrong-password")
    page.get_by_role("button", name="Unlock and retry").click()
    _text(page, "wrong password")
    assert job(ctx, r.job_id).error_code == "wrong_password"

    page.get_by_label("Password of the PDF", exact=True).fill(password)
    page.get_by_role("button", name="Unlock and retry").click()
    _text(page, "Unlock and retry: 1 job(s)")
    [done] = wait_for(ctx, [r.job_id], timeout=60)
    assert done.status == JobStatus.succeeded, (done.error_code, done.error_message)
    assert not traces(ctx, services, [tmp_path, services.workdir], password)  # console log included


def test_a_dataset_is_paused_and_resumed_from_the_overview_in_a_browser(
    ctx, console, browser, start_worker
):
    from sluice.ops.ingest import ingest_bytes
    from sluice.pipeline.queueing.publishing import publish
    from sluice.storage.db import ensure_dataset

    with Session(ctx.engine) as session:
        ensure_dataset(session=session, name="kb")
    start_worker()
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(TIMEOUT_MS)
    asked: list[str] = []  # every URL the page asked for: the console loads nothing from outside
    page.on("request", lambda request: asked.append(request.url))
    _open(page, f"{console}/?dataset=kb", "Overview")
    _assert_local_icon(page)
    page.get_by_text("Pause dataset kb").first.click()  # the expander
    reason = page.get_by_label("Reason (shown to other operators)")
    reason.fill("nightly index rebuild")
    reason.press("Enter")  # committed by its own rerun, not by the blur of the next click
    _idle(page)
    _click_until(page, ".st-key-pause_scope button", ".st-key-pause_scope-yes button")
    page.locator(".st-key-pause_scope-yes button").click()
    _idle(page)
    _text(page, "nightly index rebuild")  # the Overview says what is paused, by whom and why
    _shoot(page, "overview-paused")

    # Uploads are still taken; the paused dataset's job waits (it is not even published), and its
    # page says why.
    r = ingest_bytes(
        ctx,
        b"Lock keepers open the gates at high water. " * 40,
        dataset="kb",
        filename="locks.txt",
        publish=publish,
    )
    _open(page, f"{console}/jobs?job={r.job_id}&dataset=kb", "Jobs")
    _text(page, "Paused")
    assert job(ctx, r.job_id).status == JobStatus.pending
    assert "claimed" not in [e.kind for e in events(ctx, r.job_id)]

    _open(page, f"{console}/?dataset=kb", "Overview")
    page.get_by_role("button", name="Resume").click()
    [done] = wait_for(ctx, [r.job_id], timeout=90)  # resume publishes what waited
    assert done.status == JobStatus.succeeded
    page.reload()
    page.get_by_role("heading", name="Overview", exact=True).wait_for()
    assert page.get_by_text("nightly index rebuild").count() == 0
    outside = [u for u in asked if urlsplit(u).scheme not in ("data", "blob")]
    outside = [u for u in outside if urlsplit(u).hostname != "127.0.0.1"]
    assert not outside, f"the console asked hosts other than its own: {outside[:5]}"


def _assert_local_icon(page) -> None:
    """The tab's icon is served by the console itself (no favicon from fonts.gstatic.com)."""
    page.wait_for_function("document.querySelector('link[rel~=\"icon\"]') !== null")
    icons = page.eval_on_selector_all('link[rel~="icon"]', "links => links.map(l => l.href)")
    assert icons and all(urlsplit(href).hostname == "127.0.0.1" for href in icons), icons
