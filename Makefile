# Two commands on a fresh machine:  make run  (the whole system)  and  make test  (the suite).
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The suite's processes (pytest-xdist): each starts its own Redis and Chroma servers; 2 fits 2 cores
TEST_WORKERS ?= 2
# The index sizes of `make bench-scale` (chunks in the dataset at each point)
SCALE_SIZES ?= 0,100000,300000,1000000
export PATH := $(CURDIR)/$(BIN):$(PATH)
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
# A bare `make` lists the targets; it installs nothing.
.DEFAULT_GOAL := help

## help: this list (the default goal: a bare `make` installs nothing)
help:
	@awk 'sub(/^## /, "") { if (match($$0, /^[a-z-]+: /)) printf "  %-16s %s\n", substr($$0, 1, RLENGTH - 2), substr($$0, RLENGTH + 1); else printf "  %-16s %s\n", "", $$0 }' $(firstword $(MAKEFILE_LIST))

.PHONY: help setup run test test-fast test-unit fuzz lint bench bench-quick bench-retrieval bench-scale bench-cpu bench-fairness bench-api bench-tables bench-cluster browser ocr wild-tools wild-corpus cluster-tools cluster-test clean

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "needs $(PYTHON)"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first: the CPU wheel of 2.13.0; anything that pulls torch later finds it satisfied
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

## setup: create .venv and install Sluice with its dev tools (torch's CPU wheel first)
setup: $(STAMP)

## run: set up, then start every process of the Procfile (http://127.0.0.1:8501); Ctrl-C stops them in order
run: setup ocr
	$(BIN)/sluice run --procfile Procfile

## browser: Debian's Chromium for the end-to-end browser test (never a browser download)
browser:
	@command -v chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null; }

## ocr: Debian's Tesseract and its English data, for OCR of scanned pages (never a download at run time)
ocr:
	@command -v tesseract >/dev/null && tesseract --list-langs 2>/dev/null | grep -qx eng || { apt-get update -qq && \
		apt-get install -y -qq --no-install-recommends tesseract-ocr tesseract-ocr-eng >/dev/null; }

## cluster-tools: Debian's nginx (the TLS proxy of tests/cluster), and iproute2 and openssl
cluster-tools:
	@command -v nginx >/dev/null && command -v ip >/dev/null && command -v openssl >/dev/null || { apt-get update -qq && \
		apt-get install -y -qq --no-install-recommends nginx iproute2 openssl >/dev/null; }

## cluster-test: Sluice across network namespaces (services, two workers, entry host; one killed, one cut off): about 2 minutes, as root
cluster-test: setup cluster-tools
	RUN_CLUSTER_TEST=1 $(BIN)/python -m pytest -p no:cacheprovider tests/cluster -q -s

## wild-tools: Debian's PDF producers for bench/wild_corpus.py (Chromium, LibreOffice, Ghostscript, qpdf, CJK fonts)
wild-tools: browser
	@command -v soffice >/dev/null && command -v gs >/dev/null && command -v qpdf >/dev/null && fc-list | grep -qi "noto sans cjk" || { apt-get update -qq && \
		apt-get install -y -qq --no-install-recommends libreoffice-writer-nogui ghostscript qpdf fonts-noto-cjk fonts-dejavu-core >/dev/null; }

## wild-corpus: about 60 PDFs from real producers, classed by PyMuPDF alone, Sluice before and Sluice now
wild-corpus: setup wild-tools
	$(BIN)/python -m bench.wild_corpus

## test: set up, then the whole suite (slow real-model, crash and browser tests included), in TEST_WORKERS processes
test: setup browser ocr
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal --durations=25

## test-unit: the tests that need no server (job store on a temp SQLite file, queries, pure stages): seconds
test-unit: setup
	$(BIN)/python -m pytest -m "not servers and not slow and not browser"

## test-fast: everything but the slow and browser tests
test-fast: setup ocr
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal -m "not slow and not browser"

## fuzz: schemathesis over every API operation on SQLite and PostgreSQL with 100 cases each (the suite runs 8)
fuzz: setup
	SLUICE_FUZZ_EXAMPLES=100 $(BIN)/python -m pytest -p no:cacheprovider tests/test_api_fuzz.py -q

## lint: ruff's checks, ruff's format check and mypy (CI runs it before the tests)
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

## bench: the benchmark table, written to BENCHMARKS.md (ingestion, tables as rows, cold start, OCR, where the CPU goes, fairness, the HTTP API, reconcile at 200,000 chunks, LlamaIndex and Haystack beside): about 22 minutes
## (retrieval at 100,000 chunks takes as long again on its own: make bench-retrieval)
bench: setup ocr browser wild-tools
	$(BIN)/pip install -q -e '.[bench,peer-haystack]'
	$(BIN)/python -m bench.run
	$(BIN)/python -m bench.tables --out BENCHMARKS.md
	$(BIN)/python -m bench.ocr --pages 4 --out BENCHMARKS.md
	$(BIN)/python -m bench.cpu --out BENCHMARKS.md
	$(BIN)/python -m bench.fairness --fifo
	$(BIN)/python -m bench.api --out BENCHMARKS.md
	$(BIN)/python -m bench.reconcile_scale --out BENCHMARKS.md
	$(BIN)/python -m bench.plots benchmarks/scale.json --out benchmarks

## bench-tables: rows intact of 100 table PDFs from Chromium, LibreOffice and Ghostscript, and parse CPU per page against the code before 1de4d30
bench-tables: setup wild-tools
	$(BIN)/python -m bench.tables --out BENCHMARKS.md

## bench-api: the HTTP API under load: 500 uploads by 8 clients, GET of a job at 100,000 jobs, events on 50 streams
bench-api: setup
	$(BIN)/python -m bench.api

## bench-cluster: the cluster run with 60 documents per throughput run (one and two worker hosts, one core each); its row in BENCHMARKS.md; as root
bench-cluster: setup cluster-tools
	$(BIN)/python -m bench.cluster_throughput

## bench-retrieval: recall of dense, lexical and hybrid search, and latency at 100,000 chunks, alone;
## then nDCG@10 on a BEIR dataset beside published figures (bench/beir.py; skipped when none is there)
bench-retrieval: setup
	$(BIN)/python -m bench.retrieval
	$(BIN)/python -m bench.beir

## bench-scale: ingest rate, search latency and ANN recall at 0, 100,000, 300,000 and 1,000,000 chunks, the console at 300,000 jobs and the word index by vocabulary (hours on 2 cores; SCALE_SIZES=0,30000,100000 for fewer)
bench-scale: setup
	$(BIN)/pip install -q -e '.[bench]'
	$(BIN)/python -m bench.scale --sizes $(SCALE_SIZES) --model --out BENCHMARKS.md --json benchmarks/scale.json --plots benchmarks
	$(BIN)/python -m bench.console --jobs 300000 --out BENCHMARKS.md
	$(BIN)/python -m bench.lexical_scale --out BENCHMARKS.md

## bench-cpu: where the CPU goes, per chunk and per document: the model against everything else
bench-cpu: setup
	$(BIN)/python -m bench.cpu

## bench-fairness: 2,000 jobs queued in one dataset, one upload to another: when does it start?
bench-fairness: setup
	$(BIN)/python -m bench.fairness --fifo

## bench-quick: a small version of bench.run (about 2 minutes), written to BENCHMARKS.md
bench-quick: setup
	$(BIN)/python -m bench.run --quick

## clean: remove .venv, var and test-output
clean:
	rm -rf $(VENV) var test-output
