# memfit: `make demo` and `make test` work on a fresh machine with only Python.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
MEMFIT := $(VENV)/bin/memfit
STAMP := $(VENV)/.memfit-installed
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: install demo test lint clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[cpu,test]"
	@touch $(STAMP)

install: $(STAMP)

# The main job on an embedded default: preflight, then one training step of MobileNetV2
# (weights=None, 160x160) at batch 1, 4, 16 and 64 under an emulated 1 GiB card.
demo: install
	$(MEMFIT) doctor --memory 1GiB
	$(MEMFIT) measure keras.applications.MobileNetV2 --input-shape 160,160,3 \
		--batch-size 1,4,16,64 --memory 1GiB

lint: install
	$(PY) -m ruff check src tests examples

test: install lint
	$(PY) -m pytest -q --durations=10

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build src/*.egg-info
