"""PDFs from real producers, and the class Sluice gives each against what PyMuPDF alone says.

    python -m bench.wild_corpus [--dir DIR] [--before REF] [--keep]

Makes about 60 PDFs with the producers people actually use — Chromium's print to PDF, LibreOffice
in headless mode, Ghostscript (pdfwrite, and pdfimage24 for scan-like files), reportlab, PyMuPDF,
qpdf (encryption, linearisation, object streams) — covering reports, books, two-column pages,
Chinese, Japanese (horizontal and vertical), Korean, Arabic, Hebrew, forms, scans, blank and
drawing-only pages, and damaged copies (NUL padding, bytes after %%EOF, a cut at startxref, a lost
header, a file cut in half, a broken page tree). Then it prints, per class, how many files
PyMuPDF alone puts there, how many Sluice put there at REF (before; default the commit before
the issue-18 work) and now (after), and how many of each match the class the file was made to have.

Needs: chromium, soffice (libreoffice-writer-nogui), gs (ghostscript), qpdf, fonts-noto-cjk and
fonts-dejavu-core (`make wild-tools` installs them from Debian), and reportlab (`pip install
reportlab`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEFORE = "756a883"  # the main branch before files from the wild were handled

EN = [
    f"Paragraph {i}: the survey of the northern estuary recorded tides, sediment and the nesting "
    f"of {i + 3} species of wading birds, and the committee discussed how the harbour dredging of "
    f"season {i} changed the channels."
    for i in range(1, 400)
]
ZH = [
    f"第{i}段：研究小组在河口记录了潮汐、泥沙和候鸟的数量，并讨论了港口疏浚对航道的影响。"
    for i in range(1, 60)
]
JA = [
    f"第{i}節：調査団は河口で潮の満ち引きと土砂と渡り鳥の数を記録し、港の浚渫が水路に与えた影響を話し合った。"
    for i in range(1, 40)
]
KO = [
    f"제{i}절: 조사단은 하구에서 조수와 퇴적물과 철새의 수를 기록하고 "
    "항구 준설이 수로에 미친 영향을 논의했다."
    for i in range(1, 40)
]
AR = [
    f"الفقرة {i}: سجل فريق المسح المد والجزر والرواسب وأعداد الطيور المهاجرة في مصب النهر، وناقش "
    "أثر تجريف الميناء."
    for i in range(1, 30)
]
HE = [
    f"פסקה {i}: צוות הסקר רשם את הגאות והשפל, את המשקעים ואת מספר ציפורי הנדידה בשפך הנהר, ודן "
    "בהשפעת חפירת הנמל."
    for i in range(1, 30)
]
VERTICAL = [
    "吾輩は猫である。名前はまだ無い。",
    "どこで生れたかとんと見当がつかぬ。",
    "何でも薄暗いじめじめした所で泣いていた事だけは記憶している。",
    "吾輩はここで始めて人間というものを見た。",
]

# The class each made file deserves, by how it was made.
INDEXED, PASSWORD, SCAN, NOTHING, XFA, TRUNCATED, UNREADABLE = (
    "indexed",
    "password",
    "no text: scan (OCR)",
    "no text: blank or drawings",
    "XFA form (flatten)",
    "truncated",
    "unreadable",
)


def run(cmd: list[str], **kw) -> None:
    subprocess.run(
        cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=180, **kw
    )


def print_to_pdf(src: Path, dst: Path, tmp: Path) -> None:
    """Debian's Chromium prints the HTML file ``src`` to ``dst`` (headless, no header or footer),
    with a profile under ``tmp``."""
    run(
        [
            "chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-pdf-header-footer",
            f"--user-data-dir={tmp / 'chromium-profile'}",
            f"--print-to-pdf={dst}",
            src.as_uri(),
        ]
    )


def html(body: str, *, lang: str = "en", style: str = "", dir_: str = "ltr") -> str:
    return (
        f'<!doctype html><html lang="{lang}" dir="{dir_}"><head><meta charset="utf-8"><style>'
        'body{font-family:"DejaVu Serif","Noto Serif CJK JP","Noto Sans CJK SC",serif;'
        f"font-size:12pt}}{style}"
        f"</style></head><body>{body}</body></html>"
    )


def paras(items: list[str]) -> str:
    return "".join(f"<p>{p}</p>" for p in items)


# --- producers ------------------------------------------------------------------------------------


def chromium(out: Path, tmp: Path, made: dict[str, str]) -> None:
    pages = {
        "report": (html("<h1>Estuary survey</h1>" + paras(EN[:40])), INDEXED),
        "two-column": (
            html(
                "<h1>Two columns</h1>" + paras(EN[40:80]),
                style="body{column-count:2;column-gap:24pt}",
            ),
            INDEXED,
        ),
        "book": (
            html(
                "".join(f"<h2>Chapter {c}</h2>" + paras(EN[c * 5 : c * 5 + 60]) for c in range(12))
            ),
            INDEXED,
        ),
        "chinese": (html("<h1>河口调查</h1>" + paras(ZH), lang="zh"), INDEXED),
        "japanese": (html("<h1>河口調査</h1>" + paras(JA), lang="ja"), INDEXED),
        "japanese-vertical": (
            html(paras(VERTICAL * 3), lang="ja", style="body{writing-mode:vertical-rl}"),
            INDEXED,
        ),
        "korean": (html("<h1>하구 조사</h1>" + paras(KO), lang="ko"), INDEXED),
        "arabic": (html("<h1>مسح المصب</h1>" + paras(AR), lang="ar", dir_="rtl"), INDEXED),
        "hebrew": (html("<h1>סקר השפך</h1>" + paras(HE), lang="he", dir_="rtl"), INDEXED),
        "form": (
            html(
                "<h1>Permit application</h1>"
                + "".join(
                    f'<p><label>Field {i} of the harbour permit <input value="answer {i} for the '
                    'dredging permit"></label></p>'
                    for i in range(30)
                )
            ),
            INDEXED,
        ),
        "table": (
            html(
                "<table border=1>"
                + "".join(
                    f"<tr><td>Station {i}</td><td>{i * 3.5:.1f} metres</td><td>sediment sample {i} "
                    "was sandy</td></tr>"
                    for i in range(80)
                )
                + "</table>"
            ),
            INDEXED,
        ),
        "blank": (html(""), NOTHING),
    }
    for name, (doc, expect) in pages.items():
        src = tmp / f"chromium-{name}.html"
        src.write_text(doc, encoding="utf-8")
        dst = out / f"chromium-{name}.pdf"
        print_to_pdf(src, dst, tmp)
        made[dst.name] = expect


def libreoffice(out: Path, tmp: Path, made: dict[str, str]) -> None:
    sources = {
        "letter.txt": ("\n\n".join(EN[:12]), INDEXED),
        "manual.txt": ("\n\n".join(EN[:300]), INDEXED),
        "report.html": (html("<h1>Harbour report</h1>" + paras(EN[100:140])), INDEXED),
        "chinese.html": (html(paras(ZH), lang="zh"), INDEXED),
        "arabic.html": (html(paras(AR), lang="ar", dir_="rtl"), INDEXED),
        "table.html": (
            html(
                "<table border=1>"
                + "".join(
                    f"<tr><td>Buoy {i}</td><td>lit {i % 4 + 1} seconds</td></tr>" for i in range(60)
                )
                + "</table>"
            ),
            INDEXED,
        ),
        "two-column.fodt": (_fodt(EN[200:260], columns=2), INDEXED),
        "page-numbers.fodt": (_fodt(EN[:6], empty_pages=4), INDEXED),
    }
    files = []
    for name, (text, expect) in sources.items():
        src = tmp / f"libreoffice-{name}"
        src.write_text(text, encoding="utf-8")
        files.append(src)
        made[src.with_suffix(".pdf").name] = expect
    run(
        [
            "soffice",
            f"-env:UserInstallation={(tmp / 'lo-profile').as_uri()}",
            "--headless",
            "--convert-to",
            "pdf",
            "--outdir",
            str(out),
            *map(str, files),
        ]
    )


def _fodt(paragraphs: list[str], *, columns: int = 1, empty_pages: int = 0) -> str:
    body = "".join(f"<text:p>{p}</text:p>" for p in paragraphs)
    body += "".join('<text:p text:style-name="Break"/>' for _ in range(empty_pages))
    section = (
        f'<text:section text:style-name="Cols" text:name="S">{body}</text:section>'
        if columns > 1
        else body
    )
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<office:document xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0"
 xmlns:style="urn:oasis:names:tc:opendocument:xmlns:style:1.0"
 xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0"
 xmlns:fo="urn:oasis:names:tc:opendocument:xmlns:xsl-fo-compatible:1.0" office:version="1.2"
 office:mimetype="application/vnd.oasis.opendocument.text">
<office:automatic-styles>
 <style:style style:name="Cols" style:family="section"><style:section-properties>
  <style:columns fo:column-count="{columns}" fo:column-gap="0.5cm"/></style:section-properties>
 </style:style>
 <style:style style:name="Break" style:family="paragraph">
  <style:paragraph-properties fo:break-before="page"/></style:style>
 <style:page-layout style:name="PL">
  <style:page-layout-properties fo:page-width="21cm" fo:page-height="29.7cm"/>
  <style:footer-style/></style:page-layout>
</office:automatic-styles>
<office:master-styles><style:master-page style:name="Standard" style:page-layout-name="PL">
 <style:footer><text:p><text:page-number text:select-page="current"/></text:p></style:footer>
 </style:master-page>
</office:master-styles>
<office:body><office:text>{section}</office:text></office:body></office:document>"""


def ghostscript(out: Path, tmp: Path, made: dict[str, str]) -> None:
    lines = "".join(
        f"72 {740 - 14 * (i % 48)} moveto ({EN[i][:90]}) show\n"
        + ("showpage /Times-Roman 10 selectfont\n" if i % 48 == 47 else "")
        for i in range(96)
    )
    ps = tmp / "gs-text.ps"
    ps.write_text(f"%!PS\n/Times-Roman 10 selectfont\n{lines}showpage\n", encoding="latin-1")
    run(
        [
            "gs",
            "-q",
            "-dNOPAUSE",
            "-dBATCH",
            "-dSAFER",
            "-sDEVICE=pdfwrite",
            f"-sOutputFile={out / 'gs-text.pdf'}",
            str(ps),
        ]
    )
    made["gs-text.pdf"] = INDEXED
    drawing = tmp / "gs-drawing.ps"
    drawing.write_text(
        "%!PS\n"
        + "".join(
            f"newpath {50 + i * 20} 100 moveto {300 - i * 10} 600 lineto stroke\n"
            for i in range(20)
        )
        + "showpage\n"
    )
    run(
        [
            "gs",
            "-q",
            "-dNOPAUSE",
            "-dBATCH",
            "-dSAFER",
            "-sDEVICE=pdfwrite",
            f"-sOutputFile={out / 'gs-drawing.pdf'}",
            str(drawing),
        ]
    )
    made["gs-drawing.pdf"] = NOTHING
    for src, name, device, expect in (
        ("chromium-report.pdf", "gs-redistilled.pdf", "pdfwrite", INDEXED),
        ("chromium-report.pdf", "gs-scan.pdf", "pdfimage24", SCAN),
        ("chromium-japanese.pdf", "gs-scan-japanese.pdf", "pdfimage8", SCAN),
    ):
        run(
            [
                "gs",
                "-q",
                "-dNOPAUSE",
                "-dBATCH",
                "-dSAFER",
                f"-sDEVICE={device}",
                "-r100",
                f"-sOutputFile={out / name}",
                str(out / src),
            ]
        )
        made[name] = expect


def reportlab_files(out: Path, made: dict[str, str]) -> None:
    from reportlab.lib.pagesizes import A4
    from reportlab.lib.styles import getSampleStyleSheet
    from reportlab.pdfbase import pdfmetrics
    from reportlab.pdfbase.cidfonts import UnicodeCIDFont
    from reportlab.pdfgen import canvas
    from reportlab.platypus import (
        BaseDocTemplate,
        Frame,
        PageTemplate,
        Paragraph,
        SimpleDocTemplate,
    )

    styles = getSampleStyleSheet()
    SimpleDocTemplate(str(out / "reportlab-report.pdf"), pagesize=A4).build(
        [Paragraph(p, styles["Normal"]) for p in EN[:120]]
    )
    made["reportlab-report.pdf"] = INDEXED

    doc = BaseDocTemplate(str(out / "reportlab-two-column.pdf"), pagesize=A4)
    w, h = A4
    frames = [
        Frame(40, 40, (w - 100) / 2, h - 80, id="left"),
        Frame(60 + (w - 100) / 2, 40, (w - 100) / 2, h - 80, id="right"),
    ]
    doc.addPageTemplates([PageTemplate(frames=frames)])
    doc.build([Paragraph(p, styles["Normal"]) for p in EN[:90]])
    made["reportlab-two-column.pdf"] = INDEXED

    pdfmetrics.registerFont(UnicodeCIDFont("HeiseiMin-W3", isVertical=True))
    pdfmetrics.registerFont(UnicodeCIDFont("STSong-Light"))
    c = canvas.Canvas(str(out / "reportlab-vertical-japanese.pdf"), pagesize=A4)
    c.setFont("HeiseiMin-W3", 14)
    for i, column in enumerate(VERTICAL * 4):
        c.drawString(540 - 28 * i, 800, column)
    c.save()
    made["reportlab-vertical-japanese.pdf"] = INDEXED
    c = canvas.Canvas(str(out / "reportlab-chinese.pdf"), pagesize=A4)
    c.setFont("STSong-Light", 11)
    for i, line in enumerate(ZH[:45]):
        c.drawString(40, 800 - 17 * i, line)
    c.save()
    made["reportlab-chinese.pdf"] = INDEXED

    c = canvas.Canvas(str(out / "reportlab-acroform.pdf"), pagesize=A4)
    c.drawString(72, 800, "Application for a mooring permit in the northern harbour")
    for i in range(12):
        c.drawString(72, 760 - 40 * i, f"Question {i}: describe the vessel and its mooring needs")
        c.acroForm.textfield(
            name=f"q{i}",
            value=f"answer {i}: a small sailing boat",
            x=320,
            y=750 - 40 * i,
            width=220,
            height=18,
        )
    c.save()
    made["reportlab-acroform.pdf"] = INDEXED

    c = canvas.Canvas(str(out / "reportlab-page-numbers.pdf"), pagesize=A4)
    c.drawString(72, 800, EN[0][:90])
    c.drawString(72, 785, EN[1][:90])
    c.showPage()
    for n in range(2, 6):
        c.drawString(290, 30, str(n))
        c.showPage()
    c.save()
    made["reportlab-page-numbers.pdf"] = INDEXED

    c = canvas.Canvas(str(out / "reportlab-drawing.pdf"), pagesize=A4)
    for i in range(30):
        c.circle(300, 400, 10 + i * 8)
    c.showPage()
    c.save()
    made["reportlab-drawing.pdf"] = NOTHING

    c = canvas.Canvas(str(out / "reportlab-blank.pdf"), pagesize=A4)
    c.showPage()
    c.showPage()
    c.save()
    made["reportlab-blank.pdf"] = NOTHING


def pymupdf_files(out: Path, made: dict[str, str]) -> None:
    import pymupdf

    from tests.support.pdfmaker import two_column_form, xfa_form

    (out / "pymupdf-xfa.pdf").write_bytes(xfa_form())
    (out / "pymupdf-two-column-form.pdf").write_bytes(
        two_column_form()
    )  # both columns written row by row
    made["pymupdf-two-column-form.pdf"] = INDEXED
    made["pymupdf-xfa.pdf"] = XFA
    scan = pymupdf.open(out / "gs-scan.pdf")
    scan.save(out / "pymupdf-scan-copy.pdf", garbage=3, deflate=True)
    made["pymupdf-scan-copy.pdf"] = SCAN


def qpdf_files(out: Path, made: dict[str, str]) -> None:
    src = out / "libreoffice-report.pdf"
    run(
        [
            "qpdf",
            "--encrypt",
            "user-pass",
            "owner-pass",
            "256",
            "--",
            str(src),
            str(out / "qpdf-encrypted.pdf"),
        ]
    )
    made["qpdf-encrypted.pdf"] = PASSWORD
    run(["qpdf", "--linearize", str(out / "chromium-book.pdf"), str(out / "qpdf-linearized.pdf")])
    made["qpdf-linearized.pdf"] = INDEXED
    run(
        [
            "qpdf",
            "--object-streams=generate",
            str(out / "reportlab-report.pdf"),
            str(out / "qpdf-objstreams.pdf"),
        ]
    )
    made["qpdf-objstreams.pdf"] = INDEXED


def damaged(out: Path, made: dict[str, str]) -> None:
    """Damaged copies of good files, the way uploads and old archives damage them."""
    bases = [
        "chromium-report.pdf",
        "libreoffice-letter.pdf",
        "gs-text.pdf",
        "reportlab-report.pdf",
        "chromium-chinese.pdf",
    ]
    for base in bases:
        data = (out / base).read_bytes()
        stem = base[:-4]
        eof = data.rindex(b"%%EOF")
        variants = {
            "nul-padded": (data + b"\x00" * 8192, INDEXED),
            "trailing-bytes": (
                data + b"\r\n<html>a mail gateway appended this footer</html>\r\n" * 20,
                INDEXED,
            ),
            "ends-at-startxref": (data[: data.rindex(b"startxref") + len(b"startxref")], INDEXED),
            "no-header": (data[data.index(b"\n") + 1 :], INDEXED),
            "cut-in-half": (
                data[: len(data) // 2],
                None,
            ),  # truncated, unless every page still reads the same
        }
        if base == "chromium-report.pdf":
            variants["no-eof"] = (data[:eof], INDEXED)
        for kind, (body, expect) in variants.items():
            name = f"damaged-{stem}-{kind}.pdf"
            (out / name).write_bytes(body)
            made[name] = expect or (INDEXED if _same_text(out / base, out / name) else TRUNCATED)
    (out / "damaged-garbage.pdf").write_bytes(b"%PDF-1.7\n" + bytes(range(256)) * 64)
    made["damaged-garbage.pdf"] = UNREADABLE


def _same_text(original: Path, copy: Path) -> bool:
    import pymupdf

    try:
        with pymupdf.open(original) as a, pymupdf.open(copy) as b:
            return [p.get_text() for p in a] == [p.get_text() for p in b]
    except Exception:
        return False


def make_corpus(out: Path) -> dict[str, str]:
    made: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        chromium(out, t, made)
        libreoffice(out, t, made)
        ghostscript(out, t, made)
    reportlab_files(out, made)
    pymupdf_files(out, made)
    qpdf_files(out, made)
    damaged(out, made)
    missing = [n for n in made if not (out / n).exists()]
    if missing:
        sys.exit(f"producers failed to make: {missing}")
    return made


# --- classification -------------------------------------------------------------------------------


def pymupdf_says(path: Path) -> str:
    import pymupdf

    pymupdf.TOOLS.mupdf_display_errors(False)
    pymupdf.TOOLS.mupdf_display_warnings(False)
    try:
        doc = pymupdf.open(path)
        if doc.needs_pass:
            return PASSWORD
        count = doc.page_count
    except Exception:
        return UNREADABLE
    texts, errors, images = [], 0, False
    for i in range(count):
        try:
            page = doc.load_page(i)
            texts.append(page.get_text())
            images = images or bool(page.get_images())
        except Exception:
            errors += 1
    if count == 0 or errors == count:
        return UNREADABLE
    if any(t.strip() for t in texts):
        return INDEXED
    return SCAN if images else NOTHING


# Run inside a tree of Sluice (old or new): the stages a worker runs, up to chunking.
EVALUATE = r"""
import json, sys
from pathlib import Path
from sluice.errors import classify
from sluice.ops.ingest import SNIFF_BYTES
from sluice.pipeline.running.chunk import split_text
from sluice.pipeline.parsing.parse import PDF, open_document, sniff_type
for line in sys.stdin:
    path = Path(line.strip())
    try:
        data = path.read_bytes()
        media = sniff_type(data[:SNIFF_BYTES], path.name)
        parsed = open_document(path, media_type=media, max_pages=5000)
        chars = chunks = 0
        try:
            for _, text in parsed.pages():
                chars += len(text.strip())
                chunks += len(split_text(text, size=800, overlap=100))
        finally:
            parsed.close()
        if chars == 0:
            code = "no_text_layer" if media == PDF else "no_text"
            out = {"status": "failed", "kind": "user_action_required", "code": code}
        else:
            warnings = list(parsed.warnings)
            out = {"status": "succeeded", "media": media, "chunks": chunks, "warnings": warnings}
    except Exception as exc:
        err = classify(exc)
        out = {"status": "failed", "kind": err.kind.value, "code": err.code, "message": err.message}
    print(json.dumps({"name": path.name, **out}), flush=True)
"""

CODES = {
    "password_protected": PASSWORD,
    "no_text_layer": SCAN,
    "undecodable_text": SCAN,
    "blank_pages": NOTHING,
    "no_text_drawings_only": NOTHING,
    "xfa_form": XFA,
    "truncated_pdf": TRUNCATED,
}


def sluice_class(result: dict) -> str:
    if result["status"] == "succeeded":
        return INDEXED if result["media"] == "application/pdf" else "indexed as plain text"
    if result["kind"] == "transient":
        return f"transient, retried ({result['code']})"
    return CODES.get(
        result["code"], UNREADABLE if result["kind"] == "permanent" else result["code"]
    )


def evaluate(tree: Path, files: list[Path]) -> dict[str, dict]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run(
        [sys.executable, "-c", EVALUATE],
        input="\n".join(map(str, files)),
        text=True,
        capture_output=True,
        env=env,
        cwd=tree,
        timeout=1800,
    )
    if proc.returncode:
        sys.exit(f"evaluation in {tree} failed:\n{proc.stderr[-3000:]}")
    return {r["name"]: r for r in map(json.loads, proc.stdout.splitlines())}


# Files whose paragraphs are known in reading order: (file, paragraphs).
ORDERED = {
    # tests.support.pdfmaker's sentences, left column then right
    "pymupdf-two-column-form.pdf": None,
    "chromium-two-column.pdf": EN[40:80],
    "reportlab-two-column.pdf": EN[:90],
    "libreoffice-two-column.pdf": EN[200:260],
    "chromium-japanese-vertical.pdf": VERTICAL * 3,
    "reportlab-vertical-japanese.pdf": VERTICAL * 4,
}


def in_order(text: str, paragraphs: list[str]) -> int:
    """How many paragraphs a reader meets whole and in order. Line breaks and spaces are ignored
    in text with spaces between words; CJK text, which has none, must keep a sentence on one line
    (one character per line is not a sentence a search can find)."""
    cjk = not any(" " in p for p in paragraphs)
    flat = text if cjk else "".join(text.split())
    pos = hits = 0
    for p in paragraphs:
        i = flat.find(p if cjk else "".join(p.split()), pos)
        if i >= 0:
            hits += 1
            pos = i + 1
    return hits


def reading_order(out: Path) -> list[str]:
    import pymupdf

    from sluice.pipeline.parsing.parse import PDF, open_document
    from tests.support.pdfmaker import SENTENCES_LEFT, SENTENCES_RIGHT

    rows = []
    for name, paragraphs in ORDERED.items():
        paragraphs = paragraphs or SENTENCES_LEFT + SENTENCES_RIGHT
        with pymupdf.open(out / name) as doc:
            plain = "\n".join(page.get_text() for page in doc)
            by_sort = "\n".join(page.get_text(sort=True) for page in doc)
        parsed = open_document(out / name, media_type=PDF, max_pages=5000)
        ours = "\n".join(text for _, text in parsed.pages())
        rows.append(
            f"| {name} | {len(paragraphs)} | {in_order(plain, paragraphs)} | "
            f"{in_order(by_sort, paragraphs)} | {in_order(ours, paragraphs)} |"
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--dir", type=Path, help="where to make the corpus (default: a temporary folder)"
    )
    ap.add_argument("--before", default=BEFORE, help="git revision for the 'before' column")
    ap.add_argument("--keep", action="store_true", help="keep the corpus folder")
    ap.add_argument("--json", type=Path, help="also write every file's classes to this file")
    args = ap.parse_args()
    for tool in ("chromium", "soffice", "gs", "qpdf"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is missing: run `make wild-tools`")
    out = args.dir or Path(tempfile.mkdtemp(prefix="sluice-wild-"))
    out.mkdir(parents=True, exist_ok=True)
    made = make_corpus(out)
    files = sorted(out / n for n in made)
    with tempfile.TemporaryDirectory() as old:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", args.before], check=True, capture_output=True
        )
        subprocess.run(["tar", "-x", "-C", old], input=archive.stdout, check=True)
        before = evaluate(Path(old), files)
    after = evaluate(ROOT, files)
    rows = {
        f.name: {
            "expected": made[f.name],
            "pymupdf": pymupdf_says(f),
            "before": sluice_class(before[f.name]),
            "after": sluice_class(after[f.name]),
            "after_detail": after[f.name],
        }
        for f in files
    }
    classes = sorted({v for r in rows.values() for k, v in r.items() if k != "after_detail"})
    count = {
        k: Counter(r[k] for r in rows.values()) for k in ("expected", "pymupdf", "before", "after")
    }
    print(f"{len(files)} PDFs from real producers; before = {args.before}, after = this tree\n")
    print(
        "| class | made to be | PyMuPDF alone | Sluice before | Sluice after "
        "|\n|---|---|---|---|---|"
    )
    for c in classes:
        print(
            f"| {c} | {count['expected'][c]} | {count['pymupdf'][c]} | {count['before'][c]} | "
            f"{count['after'][c]} |"
        )
    for k in ("pymupdf", "before", "after"):
        hits = sum(r[k] == r["expected"] for r in rows.values())
        print(f"\n{k}: {hits} of {len(files)} in the class the file was made to have", end="")
    print("\n\nfiles whose class changed or still differs from what they were made to be:")
    for name, r in rows.items():
        if r["before"] != r["after"] or r["after"] != r["expected"]:
            print(
                f"  {name}: made {r['expected']!r}; PyMuPDF {r['pymupdf']!r}; before "
                f"{r['before']!r}; after {r['after']!r}"
            )
    print("\nparagraphs read whole and in order:\n")
    print(
        "| file | paragraphs | PyMuPDF get_text() | get_text(sort=True) | Sluice after "
        "|\n|---|---|---|---|---|"
    )
    print("\n".join(reading_order(out)))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, ensure_ascii=False))
    if not args.keep and args.dir is None:
        shutil.rmtree(out)


if __name__ == "__main__":
    main()
