"""Shared fixtures. Tests never touch a model hub: HF_HUB_OFFLINE is forced before any import, and
datasets' Arrow cache goes to a temporary directory (removed at exit), not ~/.cache.

`make test` runs the suite on 2 pytest-xdist workers (one process per core; a test module stays on one
worker, so its module fixtures are built once). What every worker needs alike is built once for the
whole session by whichever worker asks first (tests/built_once.py), the others wait and read it."""

import atexit
import os
import shutil
import tempfile

os.environ["HF_HUB_OFFLINE"] = "1"
if "HF_DATASETS_CACHE" not in os.environ:
    os.environ["HF_DATASETS_CACHE"] = tempfile.mkdtemp(prefix="glm-grpo-test-datasets-")
    atexit.register(shutil.rmtree, os.environ["HF_DATASETS_CACHE"], ignore_errors=True)
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # Each worker's share of the cores: one thread per process (torch's pool, its OpenMP, onnxruntime via
    # glm_grpo_ds/runtime/threads.py; the runs it starts inherit it). Two workers each running a process with a
    # thread per core would spin against each other; the 2-rank runs already get one core per rank.
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
from built_once import built_once  # noqa: E402  (tests/built_once.py)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny GLM-Image pipeline directory (seed 0), built once per test session."""
    from glm_grpo_ds.testing.tiny import build_tiny_pipeline

    return built_once(tmp_path_factory, "tiny_model", lambda path: build_tiny_pipeline(path, seed=0))


# The modules that take longest (minutes each on 2 cores; `--durations` lists their tests), started first:
# a long module picked up last would leave one xdist worker running it while the other idles.
LONGEST_FIRST = (
    "test_trainer_deepspeed",
    "test_multinode",
    "test_robustness",
    "test_bench",
    "test_gpu_check",
    "test_model_source",
    "test_world",
    "test_real_width",
    "test_checkpoint_resume",
    "test_sharing",
    "test_observability",
    "test_memory_plan_deepspeed",
    "test_quiet_tools",
    "test_logprobs_in_gather",
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable: the rest keep their order
