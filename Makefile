# make demo  - set up .venv and run the main job on the embedded tiny GLM-Image
# make test  - set up .venv and run the test suite
# make setup - only create .venv and install the package with the tested pins
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python

.PHONY: setup demo test clean

$(VENV)/.installed: setup.py constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]" -c constraints.txt
	touch $@

setup: $(VENV)/.installed

demo: setup
	PATH="$(abspath $(VENV))/bin:$$PATH" bash launch/demo.sh

test: setup
	$(PY) -m pytest -q tests

clean:
	rm -rf $(VENV) outputs .pytest_cache
