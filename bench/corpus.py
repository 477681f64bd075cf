"""The benchmark corpus: generated multi-page report PDFs with known-answer facts, plus the text
PDFs of the shared sample set.

Every generated document carries a few facts about an invented, unique name ("the Varnhold pumping
station"). The query for a fact asks about that name in other words; a retrieved chunk answers it
when it contains the name. Names are unique across the corpus, so the check needs no chunk ids and
works for any chunker (Sluice's and LlamaIndex's alike).
"""

from __future__ import annotations

import json
import random
import textwrap
from dataclasses import asdict, dataclass
from pathlib import Path

# Ordinary text PDFs of ../shared/corpus/pdf-samples (their README lists them).
SAMPLE_TEXT_PDFS = ("001", "002", "003", "004", "006", "009", "011", "014", "021", "025", "026")

_SYLLABLES = (
    "var",
    "nol",
    "dre",
    "kas",
    "tim",
    "bel",
    "quo",
    "rin",
    "sol",
    "mar",
    "fen",
    "lux",
    "ord",
    "pel",
    "tav",
    "gri",
    "hem",
    "zor",
    "wil",
    "cad",
    "bro",
    "nes",
    "yal",
    "ost",
    "dun",
    "vel",
)

# Invented report topics: the things, verbs, units and vocabulary each generated report draws from.
TOPICS = {
    name: {k: tuple(v) for k, v in spec.items()}
    for name, spec in json.loads((Path(__file__).with_name("topics.json")).read_text()).items()
}

_OPENERS = (
    "During the reporting period",
    "Across the network",
    "In the second half of the year",
    "Compared with the plan",
    "According to the operations log",
    "Following the annual review",
    "As the audit committee noted",
    "Throughout the winter months",
    "In line with the maintenance strategy",
    "Since the last inspection",
)
_VERBS = (
    "improved",
    "declined slightly",
    "remained stable",
    "required closer attention",
    "was reorganised",
    "was measured weekly",
    "drew several complaints",
    "exceeded its target",
    "fell behind schedule",
    "was reviewed by an external panel",
)
_TAILS = (
    "and the team expects further gains once the new procedures settle in.",
    "which the board accepted with minor amendments.",
    "although staffing shortages slowed the work in the autumn.",
    "and the figures were reconciled with the finance department.",
    "while contractors completed the remaining works ahead of the deadline.",
    "so the budget for the next cycle has been adjusted accordingly.",
    "and a follow-up survey is planned for the coming spring.",
    "which reduced unplanned outages noticeably.",
)


PAGE_LINES = 62


@dataclass(frozen=True)
class Fact:
    name: str  # the unique invented name; a chunk containing it answers the query
    query: str
    document: str


def _name(rng: random.Random, used: set[str]) -> str:
    while True:
        word = "".join(rng.choice(_SYLLABLES) for _ in range(3)).capitalize()
        if word not in used:
            used.add(word)
            return word


def _sentence(rng: random.Random, words: tuple[str, ...]) -> str:
    return f"{rng.choice(_OPENERS)}, {rng.choice(words)} {rng.choice(_VERBS)}, {rng.choice(_TAILS)}"


def _fact(rng: random.Random, topic: dict, name: str) -> tuple[str, str]:
    thing = rng.choice(topic["things"])
    verb = rng.choice(topic["verbs"])
    unit = rng.choice(topic["units"])
    year = rng.randint(1921, 2019)
    amount = f"{rng.randint(2, 95)},{rng.randint(100, 999)}"
    manager = (
        rng.choice(("Ana", "Tomas", "Irene", "Kofi", "Mei", "Lars", "Priya", "Jonas"))
        + " "
        + _name(rng, set())
    )
    text = (
        f"The {name} {thing} was commissioned in {year} and today {verb} about {amount} {unit} "
        f"every day. Its site manager, {manager}, reported that the {name} {thing} met its "
        "availability target in all but two months of the year."
    )
    query = f"How much does the {name} {thing} handle per day and when did it open?"
    return text, query


def generate(
    out_dir: Path, *, documents: int, pages: int, facts_per_document: int = 5, seed: int = 7
) -> tuple[list[Path], list[Fact]]:
    """Write ``documents`` PDFs of ``pages`` pages each (about 2,600 characters a page)."""
    import pymupdf

    rng = random.Random(seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    used: set[str] = set()
    paths: list[Path] = []
    facts: list[Fact] = []
    topic_names = sorted(TOPICS)
    for d in range(documents):
        topic_name = topic_names[d % len(topic_names)]
        topic = TOPICS[topic_name]
        filename = f"report-{d:03d}-{topic_name.replace(' ', '-')}.pdf"
        fact_pages = {rng.randrange(pages): None for _ in range(facts_per_document)}
        doc = pymupdf.open()
        for p in range(pages):
            paragraphs = [f"{topic_name.title()} annual report {2000 + d % 25}, section {p + 1}"]
            if p in fact_pages:
                name = _name(rng, used)
                text, query = _fact(rng, topic, name)
                facts.append(Fact(name=name, query=query, document=filename))
            else:
                text = ""
            body: list[str] = []
            for _ in range(rng.randint(4, 5)):
                body.append(
                    " ".join(_sentence(rng, topic["words"]) for _ in range(rng.randint(3, 5)))
                )
            if text:
                body.insert(rng.randrange(3), text)
            paragraphs += body
            lines: list[str] = []
            for para in paragraphs:
                wrapped = textwrap.wrap(para, 95) + [""]
                if len(lines) + len(wrapped) > PAGE_LINES:
                    break
                lines += wrapped
            page = doc.new_page(width=595, height=842)
            page.insert_text((50, 60), "\n".join(lines), fontsize=9, fontname="helv")
        path = out_dir / filename
        doc.save(path, garbage=3, deflate=True)
        doc.close()
        paths.append(path)
    (out_dir / "facts.json").write_text(json.dumps([asdict(f) for f in facts], indent=1))
    return paths, facts


def generate_big(path: Path, *, pages: int, seed: int = 11) -> Path:
    """One long PDF (the memory figure): ``pages`` pages of report text."""
    import pymupdf

    rng = random.Random(seed)
    topic = TOPICS["rail maintenance"]
    doc = pymupdf.open()
    for p in range(pages):
        text = "\n\n".join(
            " ".join(_sentence(rng, topic["words"]) for _ in range(4)) for _ in range(4)
        )
        lines = [f"Track register, page {p + 1}", ""]
        for para in text.split("\n\n"):
            lines += textwrap.wrap(para, 95) + [""]
        doc.new_page(width=595, height=842).insert_text(
            (50, 60), "\n".join(lines), fontsize=9, fontname="helv"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    doc.save(path, garbage=3, deflate=True)
    doc.close()
    return path


def generate_small(out_dir: Path, *, documents: int, seed: int = 17) -> list[Path]:
    """``documents`` short PDFs of 1 to 3 pages (about one chunk a page): a stream of small
    uploads."""
    import pymupdf

    rng = random.Random(seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    topic_names = sorted(TOPICS)
    paths = []
    for d in range(documents):
        topic = TOPICS[topic_names[d % len(topic_names)]]
        doc = pymupdf.open()
        for p in range(rng.randint(1, 3)):
            para = " ".join(_sentence(rng, topic["words"]) for _ in range(rng.randint(5, 7)))
            lines = [f"Notice {d + 1}, page {p + 1}", ""] + textwrap.wrap(para, 95)
            doc.new_page(width=595, height=842).insert_text(
                (50, 60), "\n".join(lines), fontsize=9, fontname="helv"
            )
        path = out_dir / f"notice-{d:03d}.pdf"
        doc.save(path, garbage=3, deflate=True)
        doc.close()
        paths.append(path)
    return paths


def sample_pdfs(samples_dir: Path, *, quick: bool = False) -> list[Path]:
    """The text PDFs of the shared sample set (in quick mode only the small ones)."""
    if not samples_dir.is_dir():
        return []
    out = []
    for path in sorted(samples_dir.glob("*.pdf")):
        if path.name[:3] in SAMPLE_TEXT_PDFS and not (quick and path.stat().st_size > 200_000):
            out.append(path)
    return out


def load_facts(path: Path) -> list[Fact]:
    return [Fact(**row) for row in json.loads(path.read_text())]
