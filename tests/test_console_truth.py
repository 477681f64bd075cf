"""What the console and the CLI say is true (issue 27, items 5-14): the formats named, the datasets
searched, counts and labels that match what happened."""

from __future__ import annotations

from tests.support.apptest import open_console, texts


def test_first_visit_and_the_search_filter_name_every_format_sluice_indexes(ctx):
    page = texts(open_console())
    for name in ("PDF", "Word (.docx)", "PowerPoint (.pptx)", "EPUB", "HTML", "CSV"):
        assert name in page
    at = open_console("search")
    box = at.selectbox(key="search_media_type")  # AppTest lists the labels the page shows
    assert {"PDF", "Word (.docx)", "PowerPoint (.pptx)", "EPUB", "HTML", "CSV"} <= set(box.options)
    box.set_value("text/html")
    at.run()
    assert not at.exception
