# Two commands on a fresh machine:  make run  (the whole system)  and  make test  (the suite).
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
export PATH := $(CURDIR)/$(BIN):$(PATH)
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: setup run test test-fast test-unit lint bench bench-quick bench-fairness browser wild-tools wild-corpus clean

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "needs $(PYTHON)"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first: the CPU wheel of 2.13.0; anything that pulls torch later finds it satisfied
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

## run: set up, then start queue, cache, chroma, worker and console (http://127.0.0.1:8501)
run: setup
	$(BIN)/honcho start -f Procfile

## browser: Debian's Chromium for the end-to-end browser test (never a browser download)
browser:
	@command -v chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null; }

## wild-tools: Debian's PDF producers for bench/wild_corpus.py (Chromium, LibreOffice, Ghostscript, qpdf, CJK fonts)
wild-tools: browser
	@command -v soffice >/dev/null && command -v gs >/dev/null && command -v qpdf >/dev/null && fc-list | grep -qi "noto sans cjk" || { apt-get update -qq && \
		apt-get install -y -qq --no-install-recommends libreoffice-writer-nogui ghostscript qpdf fonts-noto-cjk fonts-dejavu-core >/dev/null; }

## wild-corpus: about 60 PDFs from real producers, classed by PyMuPDF alone, Sluice before and Sluice now
wild-corpus: setup wild-tools
	$(BIN)/python bench/wild_corpus.py

## test: set up, then the whole suite (slow real-model, crash and browser tests included)
test: setup browser
	$(BIN)/python -m pytest

## test-unit: the tests that need no server (job store on a temp SQLite file, queries, pure stages): seconds
test-unit: setup
	$(BIN)/python -m pytest -m "not servers and not slow and not browser"

## test-fast: everything but the slow and browser tests
test-fast: setup
	$(BIN)/python -m pytest -m "not slow and not browser"

lint: setup
	$(BIN)/ruff check .

## bench: the benchmark table, written to BENCHMARKS.md
bench: setup
	$(BIN)/pip install -q -e '.[bench]'
	$(BIN)/python bench/run.py
	$(BIN)/python bench/fairness.py --fifo

## bench-fairness: 2,000 jobs queued in one dataset, one upload to another: when does it start?
bench-fairness: setup
	$(BIN)/python bench/fairness.py --fifo

bench-quick: setup
	$(BIN)/python bench/run.py --quick

clean:
	rm -rf $(VENV) var test-output
