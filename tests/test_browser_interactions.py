"""In a real browser (Debian's Chromium through Playwright, the console as ``sluice serve console``
starts it): what only a browser shows of issue 27's items 12-14. Integrity's Check now shows its
report when the check ends, with no reload; the Document view scrolls the chosen chunk into view;
the New-dataset popover closes after Create. Every wait is bounded."""

from __future__ import annotations

import pytest

from tests.support.helpers import run_file
from tests.test_browser import TIMEOUT_MS, browser, console  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

WAIT_MS = 30_000  # a check of a few chunks ends in about a second; the page follows within 2 s


def _page(browser):  # noqa: F811
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(TIMEOUT_MS)
    return page


def _heading(page, url: str, name: str) -> None:
    page.goto(url)
    page.get_by_role("heading", name=name, exact=True).wait_for(timeout=TIMEOUT_MS)


def test_check_now_shows_its_report_when_the_check_ends_without_a_reload(
    ctx,
    console,  # noqa: F811
    browser,  # noqa: F811
):
    run_file(ctx, b"Sluice gates hold the water of the upper canal. " * 40, "gates.txt")
    page = _page(browser)
    _heading(page, f"{console}/integrity", "Integrity")
    page.get_by_text("No reconcile has run on this machine yet").wait_for()
    page.get_by_role("button", name="Check now").click()
    # The report replaces the note and the "running" box goes, with no reload by hand.
    page.get_by_text("Last check of all datasets").wait_for(timeout=WAIT_MS)
    page.get_by_text("is running").wait_for(state="detached", timeout=WAIT_MS)
    assert page.get_by_text("Clean: the index holds exactly").count() == 1


def test_the_document_view_scrolls_the_chosen_chunk_into_view(
    ctx,
    console,  # noqa: F811
    browser,  # noqa: F811
):
    lines = [f"Paragraph {i} of the lock keeper's manual on gates and weirs." for i in range(400)]
    done = run_file(ctx, "\n".join(lines).encode(), "manual.txt")
    assert done.chunk_count > 15
    page = _page(browser)
    _heading(page, f"{console}/document?doc=doc:{done.document_id}&chunk=15", "Document")
    anchor = page.locator("#chunk-15")
    anchor.wait_for(state="attached", timeout=WAIT_MS)
    page.wait_for_function(
        "() => { const r = document.getElementById('chunk-15').getBoundingClientRect();"
        " return r.top >= 0 && r.bottom <= window.innerHeight; }",
        timeout=WAIT_MS,
    )


def test_the_new_dataset_popover_closes_after_create(
    ctx,
    console,  # noqa: F811
    browser,  # noqa: F811
):
    from sluice.ops import reads

    page = _page(browser)
    _heading(page, console, "Overview")
    page.get_by_role("button", name="New dataset").click()
    name = page.get_by_label("Name")
    name.fill("contracts-2024")
    page.locator(".st-key-create_dataset button").click()
    name.wait_for(state="hidden", timeout=WAIT_MS)  # the popover closed (it stayed open)
    assert "contracts-2024" in [d.name for d in reads.datasets()]
