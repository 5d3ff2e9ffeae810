# make demo  - set up .venv and run the main job on the embedded tiny GLM-Image
# make test  - set up .venv and run the test suite
# make setup - only create .venv and install the package with the tested pins
# make test-fast - unit + fast integration tests (not `slow`, not `distributed`), a few minutes
# make test-tools - the profilers' end-to-end runs (`tools` marker), after `make test`
# make slice-check - GLM-Image's real-width slice trained at 1024x1024, LoRA and full FT (docs/real-width.md)
# make lint  - ruff check + ruff format --check (what CI runs before the tests)
# make test-install - the tests that download from the package index (glm-grpo wheelhouse; tests/install/)
# make test-floor - the fast suite on the oldest supported versions (constraints-floor.txt) in .venv-floor,
#                   installed from a wheelhouse bundle with no index (docs/install.md)
# make test-container - a GPU container's set: the floor's torch with the tested top of everything else, in
#                   .venv-floor (made by test-floor first when missing): the fast suite, the GPU checks' CPU forms
# make floor-venv - only build .venv-floor from a wheelhouse of constraints-floor.txt
# make clean - remove .venv, .venv-floor, its wheelhouse, outputs/ and .pytest_cache
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# pytest-xdist workers: one per core of the 2-core CI machine; a test module stays on one worker, and the modules
# start in tests/conftest.py's order (LONGEST_FIRST), not re-sorted by their number of tests
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

.PHONY: setup demo test test-fast test-tools test-install test-floor floor-venv test-container slice-check lint clean

$(VENV)/.installed: setup.py pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]" -c constraints.txt
	@# DeepSpeed's CPU communication op, built once here rather than by the first CPU run (~40 s); a failure is
	@# only said: that run builds it then, as before
	DS_ACCELERATOR=cpu PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) -m glm_grpo_ds.ds.process_group || \
		echo "make setup: DeepSpeed's CPU op was not built now (above); the first CPU run builds it"
	touch $@

setup: $(VENV)/.installed

demo: setup
	PATH="$(abspath $(VENV))/bin:$$PATH" bash launch/demo.sh

test: setup
	$(PYTEST) -m "not install and not tools" tests

test-fast: setup
	$(PYTEST) -m "not slow and not distributed and not install and not tools" tests

# the profilers' end-to-end runs and the GPU timing lease's CPU form (docs/testing.md, the tiers): CI runs them
# after `make test`
test-tools: setup
	$(PYTEST) -m tools tests

test-install: setup
	$(PY) -m pytest -q -m install tests/install

# The floor: a bundle of constraints-floor.txt's versions for this machine (glm-grpo wheelhouse), installed
# with no index into a fresh venv, then the fast suite from it, plus the slow tests that catch what the fast
# suite misses at old versions (peft 0.19's empty adapter files, DeepSpeed 0.19.2's ZeRO-3 recompute error and
# 0.19.3-0.19.7's CPU gather race, bitsandbytes 0.49's missing CPU 8-bit step: the 8-bit LoRA runs at ZeRO-2 and
# ZeRO-3). The install uses none of this machine's pip settings: a configured find-links could complete an
# incomplete bundle.
FLOOR := .venv-floor
FLOOR_SLOW := tests/integration/test_trainer_deepspeed.py::test_lora_8bit_checkpointing_trains_only_the_adapter
FLOOR_PYTEST := $(FLOOR)/bin/python -m pytest -q -p no:cacheprovider
FLOOR_FAST := $(FLOOR_PYTEST) -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
	-m "not slow and not distributed and not install" tests
floor-venv: setup
	rm -rf $(FLOOR) $(FLOOR)-wheels
	$(VENV)/bin/glm-grpo wheelhouse $(FLOOR)-wheels --constraints constraints-floor.txt --extras dev
	$(PYTHON) -m venv $(FLOOR)
	PIP_CONFIG_FILE=/dev/null $(FLOOR)/bin/python -m pip --isolated install -q --no-index \
		--find-links $(FLOOR)-wheels -c $(FLOOR)-wheels/constraints.txt "glm-grpo-ds[dev]"

test-floor: floor-venv
	bash -o pipefail -c '$(FLOOR)/bin/glm-grpo env | tail -n +3'  # env's exit 1 (a version out of range) stops it
	$(FLOOR_FAST)
	$(FLOOR_PYTEST) $(FLOOR_SLOW)

# A GPU container's set (NGC-style images keep their torch; pip brings the newest of the rest): the floor's torch and
# torchvision with constraints.txt's versions of everything else, installed over .venv-floor from the index. It is
# what `glm-grpo wheelhouse` gives a container that has only torch 2.11 (the GPU leases'), the corner of the
# supported ranges that neither the floor nor the top tests. Then the fast suite, `launch/gpu_timing.sh`'s and
# `launch/gpu_check.sh`'s CPU forms (the GPU lease runs those on these versions). test-floor rebuilds the floor.
CONTAINER_PINS := $(FLOOR)/container-constraints.txt
test-container: setup
	[ -x $(FLOOR)/bin/python ] || $(MAKE) floor-venv
	{ grep -vE '^(torch|torchvision)==' constraints.txt; grep -E '^(torch|torchvision)==' constraints-floor.txt; } \
		> $(CONTAINER_PINS)
	$(FLOOR)/bin/python -m pip install -q -c $(CONTAINER_PINS) ".[dev]"
	bash -o pipefail -c '$(FLOOR)/bin/glm-grpo env | tail -n +3'  # env's exit 1 (a version out of range) stops it
	$(FLOOR_FAST)
	$(FLOOR_PYTEST) tests/integration/test_gpu_timing_lease.py tests/integration/test_gpu_check.py

slice-check: setup
	PATH="$(abspath $(VENV))/bin:$$PATH" bash launch/slice_check.sh

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf $(VENV) $(FLOOR) $(FLOOR)-wheels outputs .pytest_cache
