"""Search finds what an operator types, through the CLI: a reference code alone, an exact phrase, a
Chinese or Japanese sentence; filters by file, pages and media type; highlighted snippets; and the
lexical mode answers from a cold command line without loading the model."""

import json
import os
import random
import subprocess
import sys

import pymupdf

from sluice.cli.main import main
from sluice.pipeline.running.runner import run_job

WORDS = (
    "the report covers quarterly figures for the northern region and the team reviewed each line "
    "item with care before the meeting on budgets staffing travel and supplies was closed"
).split()
CHINESE = "仓库管理系统在夜间自动备份所有订单数据。"
JAPANESE = "東京の倉庫では毎朝八時に在庫の確認を行います。"


def prose(rng: random.Random, sentences: int) -> list[str]:
    return [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(10, 18))).capitalize() + "."
        for _ in range(sentences)
    ]


def run(capsys, *args):
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_codes_phrases_and_cjk_sentences_come_first_through_the_cli(ctx, capsys, tmp_path):
    rng = random.Random(13)
    files = {}
    for i in range(12):
        lines = prose(rng, 40)
        code = f"RX-{rng.randint(10000, 99999)}"
        phrase = f"the amber lantern {i} kept watch over harbour {i * 7}"
        lines.insert(rng.randint(5, 35), f"The reference {code} was filed today.")
        lines.insert(rng.randint(5, 35), f"{phrase.capitalize()}.")
        path = tmp_path / f"report-{i:02d}.txt"
        path.write_text(" ".join(lines))
        files[path.name] = (code, phrase)
    for name, sentence in (("cangku.txt", CHINESE), ("soko.txt", JAPANESE)):
        path = tmp_path / name
        path.write_text(" ".join(prose(rng, 20)) + sentence + " ".join(prose(rng, 20)))
    pdf = pymupdf.open()
    for n in range(1, 4):
        page = pdf.new_page()
        page.insert_text(
            (72, 72), f"Page {n} of the ledger. " + ("Invoice ZK-7731 is due." if n == 3 else "")
        )
    pdf.save(tmp_path / "ledger.pdf")

    code, out, _ = run(capsys, "ingest", str(tmp_path), "--dataset", "ops")
    assert code == 0
    for line in out.strip().splitlines():
        assert run_job(int(line.split("\t")[0]), ctx=ctx).result == "succeeded"

    def first(*args):
        code, out, err = run(capsys, "search", *args, "--dataset", "ops", "--json")
        assert code == 0, err
        return json.loads(out)

    for name, (code_, phrase) in files.items():
        hits = first(code_)
        assert hits[0]["filename"] == name, (code_, hits[:2])
        assert {
            "document_id",
            "chunk_id",
            "job_id",
            "matched",
            "filename",
            "page",
            "score",
            "text",
        } <= set(hits[0])
        assert (
            "lexical" in hits[0]["matched"] and f"**{code_.split('-')[1]}**" in hits[0]["snippet"]
        )
        quoted = first(f'"{phrase}"')
        assert {h["filename"] for h in quoted} == {name}, quoted[
            :2
        ]  # only chunks holding the phrase
    for name, sentence in (("cangku.txt", CHINESE), ("soko.txt", JAPANESE)):
        assert first(sentence)[0]["filename"] == name
        assert first(sentence[2:9], "--mode", "lexical")[0]["filename"] == name

    # Filters: pages, file name, media type.
    assert [h["page"] for h in first("ZK-7731")][:1] == [3]
    assert first("ZK-7731", "--pages", "1-2", "--mode", "lexical") == []
    assert first("ZK-7731", "--pages", "3", "--mode", "lexical")[0]["page"] == 3
    assert {h["filename"] for h in first("reference", "--file", "report-03", "--k", "10")} == {
        "report-03.txt"
    }
    assert {h["filename"] for h in first("ledger", "--media-type", "application/pdf")} == {
        "ledger.pdf"
    }
    code, _, err = run(capsys, "search", "x", "--dataset", "ops", "--pages", "5-2")
    assert code != 0 and "first page is after the last" in err

    # Plain output: the snippet with the match marked.
    code, out, _ = run(capsys, "search", "ZK-7731", "--dataset", "ops", "--k", "1")
    assert "ledger.pdf" in out and "**ZK**-**7731**" in out


def test_lexical_search_from_a_cold_command_line_does_not_load_the_model(ctx, capsys, tmp_path):
    doc = tmp_path / "note.txt"
    doc.write_text("A note about the blue heron seen at code HX-2231 near the pier. " * 5)
    code, out, _ = run(capsys, "ingest", str(doc))
    assert run_job(int(out.split("\t")[0]), ctx=ctx).result == "succeeded"
    env = {
        k: v for k, v in os.environ.items() if k != "SLUICE_EMBEDDER"
    }  # the real model, were it loaded
    probe = (
        "import sys, json; from sluice.cli.main import main; code = main(['search', 'HX-2231', "
        "'--mode', 'lexical', '--json']); print(json.dumps([code, sorted(m for m in ('torch', "
        "'sentence_transformers') if m in sys.modules)]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    *hits, last = done.stdout.strip().splitlines()
    assert json.loads(last) == [0, []]
    assert json.loads("\n".join(hits))[0]["filename"] == "note.txt"


def test_show_chunks_lists_a_jobs_chunks_in_order_with_pages(ctx, capsys, tmp_path):
    pdf = pymupdf.open()
    for n in range(1, 3):
        pdf.new_page().insert_text((72, 72), f"Ledger page {n}, entry LX-{n}{n}{n}.")
    pdf.save(tmp_path / "ledger.pdf")
    code, out, _ = run(capsys, "ingest", str(tmp_path / "ledger.pdf"))
    job_id = int(out.split("\t")[0])
    assert run_job(job_id, ctx=ctx).result == "succeeded"

    code, out, _ = run(capsys, "show", str(job_id), "--chunks", "--json")
    chunks = json.loads(out)["chunks"]
    assert [(c["position"], c["page"]) for c in chunks] == [(0, 1), (1, 2)] and "LX-222" in chunks[
        1
    ]["text"]
    code, out, _ = run(capsys, "show", str(job_id), "--chunks")
    assert code == 0 and "chunks:" in out and "LX-111" in out
