# memfit: `make demo` and `make test` work on a fresh machine with only Python.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
MEMFIT := $(VENV)/bin/memfit
STAMP := $(VENV)/.memfit-installed
HUB_DEPS := regex tokenizers sentencepiece kagglehub absl-py packaging rich
# The TF Model Garden (tf_keras models trained through their task's own step) pins its own
# TensorFlow: it gets a second environment, where tests/garden runs.
GARDEN_VENV ?= .venv-garden
GARDEN_PY := $(GARDEN_VENV)/bin/python
GARDEN_STAMP := $(GARDEN_VENV)/.memfit-installed
GARDEN_PIN ?= tf-models-official==2.20.0
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: install install-garden demo test test-fast test-main test-garden lint bench bench-quick clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[cpu,test]"
	@# keras-hub (the RetinaNet of the demo and benchmarks) without its tensorflow-text
	@# requirement, which would add the full `tensorflow` beside tensorflow-cpu.
	$(PY) -m pip install -q --no-deps "keras-hub>=0.21"
	$(PY) -m pip install -q $(HUB_DEPS)
	@# kyolo (the YOLO family the detector tests train) without matplotlib and pillow, which
	@# only its plotting helpers import: it needs nothing else beside keras and numpy.
	$(PY) -m pip install -q --no-deps "kyolo>=0.1.5"
	@touch $(STAMP)

install: $(STAMP)

$(GARDEN_STAMP): pyproject.toml
	@test -x $(GARDEN_PY) || $(PYTHON) -m venv $(GARDEN_VENV)
	$(GARDEN_PY) -m pip install -q --upgrade pip
	$(GARDEN_PY) -m pip install -q "$(GARDEN_PIN)"
	$(GARDEN_PY) -m pip install -q -e ".[test]"
	@touch $(GARDEN_STAMP)

install-garden: $(GARDEN_STAMP)

# The main job on an embedded default: a keras-hub RetinaNet on generated detection data whose
# last shard holds twice-the-resolution images, under an emulated card: doctor, data check,
# estimate vs measure, batch, plan, plain model.fit dying, memfit.fit recovering, the report.
demo: install
	$(MEMFIT) demo --out memfit-demo

lint: install
	$(PY) -m ruff check src tests examples bench

# Test files run on TEST_WORKERS processes (a file's tests stay together: they share fixtures).
# Four on 2 cores: with two, the suite kept the cores 71% busy (user+system CPU over wall
# time), as its tests wait on the child processes they start; fresh-clone CI
# runs took 990 s of tests with 2 workers, 904 s with 3 and 858 s with 4 (181% busy).
TEST_WORKERS ?= 4
test: test-main test-garden

# The edit-test loop: the tests that start no process (no TensorFlow child, no CLI run).
test-fast: install lint
	$(PY) -m pytest -q -n $(TEST_WORKERS) -m "not child" --durations=10

test-main: install lint
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15

# tf_keras and the TF Model Garden, in their own environment (tests/garden).
test-garden: install-garden
	$(GARDEN_PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder tests/garden \
		--durations=10

# Benchmarks: one script per claim, tables on the terminal, JSON in bench/results/.
bench: install install-garden
	@mkdir -p bench/results
	MEMFIT_GARDEN_PYTHON=$(GARDEN_PY) $(PY) -m bench.detectors --out bench/results/detectors.json
	$(PY) -m bench.batch_search --out bench/results/batch_search.json
	$(PY) -m bench.recovery --out bench/results/recovery.json
	$(PY) -m bench.watch_overhead --out bench/results/watch_overhead.json
	$(PY) -m bench.data_audit --out bench/results/data_audit.json
	$(PY) -m bench.estimate_accuracy --out bench/results/estimate_accuracy.json

bench-quick: install install-garden
	@mkdir -p bench/results
	MEMFIT_GARDEN_PYTHON=$(GARDEN_PY) $(PY) -m bench.detectors --quick \
		--out bench/results/detectors_quick.json
	$(PY) -m bench.batch_search --quick --out bench/results/batch_search_quick.json
	$(PY) -m bench.recovery --quick --out bench/results/recovery_quick.json
	$(PY) -m bench.watch_overhead --quick --out bench/results/watch_overhead_quick.json
	$(PY) -m bench.data_audit --quick --out bench/results/data_audit_quick.json
	$(PY) -m bench.estimate_accuracy --quick --out bench/results/estimate_accuracy_quick.json

clean:
	rm -rf $(VENV) $(GARDEN_VENV) .pytest_cache .ruff_cache build src/*.egg-info
