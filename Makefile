# make demo  - set up .venv and run the main job on the embedded tiny GLM-Image
# make test  - set up .venv and run the test suite
# make setup - only create .venv and install the package with the tested pins
# make test-fast - unit + fast integration tests (not `slow`, not `distributed`), a few minutes
# make slice-check - GLM-Image's real-width slice trained at 1024x1024, LoRA and full FT (docs/real-width.md)
# make lint  - ruff check + ruff format --check (what CI runs before the tests)
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# pytest-xdist workers: one per core of the 2-core CI machine; a test module stays on one worker
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

.PHONY: setup demo test test-fast slice-check lint clean

$(VENV)/.installed: setup.py pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]" -c constraints.txt
	touch $@

setup: $(VENV)/.installed

demo: setup
	PATH="$(abspath $(VENV))/bin:$$PATH" bash launch/demo.sh

test: setup
	$(PYTEST) tests

test-fast: setup
	$(PYTEST) -m "not slow and not distributed" tests

slice-check: setup
	PATH="$(abspath $(VENV))/bin:$$PATH" bash launch/slice_check.sh

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf $(VENV) outputs .pytest_cache
