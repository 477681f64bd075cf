"""What the console's pages and the CLI say, as the person reads it (issue 27, items 5-14): every
format Sluice indexes named, which datasets a search spanned, dead letters linked to their jobs,
prompts and pause notes said once and unescaped, the Chroma server's version, the New-dataset
popover closed after Create, and where a chunk is (section, OCR) said as search says it."""

from __future__ import annotations

import re
import shutil

import pytest

from tests.support.apptest import assert_ok, open_console, texts
from tests.support.helpers import run_file
from tests.support.seed import seed_every_state


@pytest.fixture
def seeded(ctx):
    return seed_every_state(ctx)


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


def test_cli_search_spans_every_dataset_as_the_console_does_and_says_which(ctx, capsys):
    from sluice.cli.main import main

    run_file(ctx, b"The lighthouse keeper lit the lamp at dusk. " * 30, "keeper.txt", "default")
    run_file(ctx, b"A lighthouse stands on the northern cape. " * 30, "cape.txt", "coast")
    assert main(["search", "lighthouse"]) == 0
    out = capsys.readouterr().out
    assert "searched 2 dataset(s): coast, default" in out
    assert "keeper.txt" in out and "cape.txt" in out
    assert main(["search", "lighthouse", "--dataset", "coast"]) == 0
    out = capsys.readouterr().out
    assert "searched 1 dataset(s): coast" in out and "keeper.txt" not in out


def test_dead_letters_link_every_row_to_its_job_and_a_locked_file_to_its_password_form(ctx, seeded):
    locked = seeded["failed:password_protected"]
    at = open_console("dead_letters")
    page = texts(at)
    # The password group says one thing to do, not also "upload a corrected file".
    assert "give each file's password on its job" in page
    links = {(p.proto.label, p.proto.page) for p in at.get("page_link")}
    for job_id in locked:
        assert any(f"(job {job_id})" in label and "password" in label for label, _ in links)
    table = next(df.value for df in at.dataframe if "open" in df.value.columns)
    assert all(url == f"jobs?job={j}" for url, j in zip(table["open"], table["job"], strict=True))


def test_the_retry_anyway_prompt_is_one_sentence_with_one_full_stop(ctx, seeded):
    job_id = seeded["failed:password_protected"][0]
    at = open_console("jobs", query={"job": str(job_id)})
    at.button(key=f"retry_{job_id}").click().run()
    prompt = next(t for t in texts(at).split("\n") if "Retry anyway?" in t)
    assert ".." not in prompt and ". . " not in prompt, prompt


def test_pause_and_resume_say_it_once_unescaped_and_a_pause_is_not_paused_paused(ctx):
    from sluice.ops.ingest import ingest_bytes

    ingest_bytes(ctx, b"Rigging of tall ships. " * 30, dataset="rag-demo", filename="ships.txt")
    at = open_console("overview", query={"dataset": "rag-demo"})
    at.button(key="pause_scope").click().run()
    at.button(key="pause_scope:yes").click().run()
    page = texts(at)
    assert "\\" not in page, page  # escaped once: the person reads no backslash
    assert "Paused: paused" not in page and "Paused (dataset rag-demo" in page
    resume = next(b for b in at.button if b.key and b.key.startswith("resume_"))
    resume.click().run()
    assert "\\" not in texts(at)


def test_the_system_page_tells_the_chroma_servers_api_version_from_the_package(ctx):
    from importlib import metadata

    from sluice.ops import health

    [chroma] = [p for p in health.probes(ctx.settings) if p.name == "chroma"]
    assert chroma.reachable and "server chroma" not in chroma.detail
    assert f"the chromadb package here is {metadata.version('chromadb')}" in chroma.detail
    assert "API version" in chroma.detail


def test_the_new_dataset_popover_closes_after_create(ctx):
    from sluice.ops import reads

    at = open_console()
    at.session_state["new_dataset_popover"] = True  # the operator opened it
    at.run()
    at.text_input(key="new_dataset_name").set_value("contracts-2024")
    at.button(key="create_dataset").click().run()
    assert not at.exception
    assert "contracts-2024" in [d.name for d in reads.datasets()]
    assert at.session_state["new_dataset_popover"] is False  # closed (it stayed open)


# --- the Document view says where a chunk is as search does (item 13) -----------------------------


def test_the_document_view_labels_office_chunks_by_section_as_search_does(ctx):
    from tests.test_formats import make_docx

    done = run_file(ctx, make_docx(), "report.docx")
    at = open_console("document", query={"doc": f"doc:{done.document_id}"})
    options = at.radio(key="document_chunk").options
    assert any("section 2: Tariffs" in o for o in options), options
    assert not any("page 1" in o or "page 2" in o for o in options)
    assert "section 2: Tariffs" in texts(at)


@pytest.mark.skipif(shutil.which("tesseract") is None, reason="needs Debian's tesseract-ocr")
def test_an_ocr_page_is_not_said_to_lack_the_chunks_words_as_if_in_error(ctx):
    from tests.support import pdfmaker

    done = run_file(ctx, pdfmaker.scanned(), "scan.pdf")
    at = open_console("document", query={"doc": f"doc:{done.document_id}"})
    assert "chunk 0 · page 1 · text read by OCR" in texts(at)
    [caption] = [img.caption for e in at.get("image") for img in e.proto.imgs]
    # It said "the chunk's words were not found on it as written", which reads as an error.
    assert caption == (
        "page 1, the chunk was recognised by OCR; the page image has no text layer to compare with"
    )


# --- a console button is never explained by a CLI flag ------------------------------------------

FLAG = re.compile(r"(?<![\w-])--[a-z][\w.-]*")
COMMAND = re.compile(r"`sluice [^`]*`")  # a whole command for a shell, quoted as code: allowed


def _flags(text: str) -> list[str]:
    """The CLI flags ``text`` names outside a quoted ``sluice ...`` command."""
    return FLAG.findall(COMMAND.sub("", text))


def _said_and_labelled(at) -> str:
    """What the page shows: its text, and its widgets' labels and help."""
    widgets = [*at.button, *at.text_input, *at.selectbox, *at.toggle, *at.number_input]
    return "\n".join([texts(at), *(f"{w.label} {w.help or ''}" for w in widgets)])


def test_the_sources_page_says_what_its_buttons_do_and_names_no_cli_flag(ctx, tmp_path):
    from sluice.ops.sources import syncing

    share = tmp_path / "share"
    share.mkdir()
    for i in range(4):
        (share / f"f{i}.txt").write_bytes(f"File {i} of the share. ".encode() * 20)
    syncing.add_source(ctx, name="src", dataset="docs", folder=str(share))
    at = open_console("sources")
    seen = [_said_and_labelled(at)]
    at.button(key="source_sync").click().run()  # a new source's first sync waits for its button
    seen.append(_said_and_labelled(at))
    assert "waits for confirmation" in seen[-1]
    at.button(key="source_preview").click().run()
    seen.append(_said_and_labelled(at))
    at.button(key="source_first").click().run()
    seen.append(_said_and_labelled(at))
    at.button(key="source_first:yes").click().run()
    assert syncing.get_source(ctx, "src").documents == 4
    for f in share.iterdir():
        f.unlink()
    at.button(key="source_sync").click().run()  # the emptied share: its removals are held
    seen.append(_said_and_labelled(at))
    assert "Removals held" in seen[-1]
    at.button(key="source_confirm").click().run()
    seen.append(_said_and_labelled(at))
    assert_ok(at)
    for page in seen:  # before: "confirm (--yes)" beside the page's own confirm button
        assert not _flags(page), page
    assert "confirm if the source really is empty now" in seen[-1]
