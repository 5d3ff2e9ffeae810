# make demo  - set up .venv and run the main job on the embedded tiny GLM-Image
# make test  - set up .venv and run the test suite
# make setup - only create .venv and install the package with the tested pins
# make test-fast - unit + fast integration tests (not `slow`, not `distributed`), a few minutes
# make test-real-width - the real-width slice trained on 2 CPU ranks (~5 min, ~16 GB RAM; issue #26)
# make lint  - ruff check + ruff format --check (what CI runs before the tests)
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python

.PHONY: setup demo test test-fast test-real-width lint clean

$(VENV)/.installed: setup.py pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]" -c constraints.txt
	touch $@

setup: $(VENV)/.installed

demo: setup
	PATH="$(abspath $(VENV))/bin:$$PATH" bash launch/demo.sh

test: setup
	$(PY) -m pytest -q -m "not realwidth" tests

test-fast: setup
	$(PY) -m pytest -q -m "not slow and not distributed and not realwidth" tests

test-real-width: setup
	$(PY) -m pytest -q -m realwidth tests

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf $(VENV) outputs .pytest_cache
