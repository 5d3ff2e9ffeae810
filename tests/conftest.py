"""Shared fixtures. Tests never touch a model hub: HF_HUB_OFFLINE is forced before any import, and
datasets' Arrow cache goes to a temporary directory (removed at exit), not ~/.cache.

`make test` runs the suite on 2 pytest-xdist workers (one process per core; a test module stays on one
worker, so its module fixtures are built once). What every worker needs alike is built once for the
whole session by whichever worker asks first (tests/built_once.py), the others wait and read it."""

import atexit
import os
import shutil
import subprocess
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
from durations_budget import pytest_terminal_summary  # noqa: E402, F401  (tests/durations_budget.py: the slow tests named)


@pytest.fixture(autouse=True)
def fresh_warn_once(monkeypatch):
    """Each test starts with no one-time warning given (runtime/log.warning_once keeps a per-process set): else a
    test asserting a warning fails or passes by which tests its xdist worker ran before it."""
    from glm_grpo_ds.runtime import log

    monkeypatch.setattr(log, "_warned", set())


@pytest.fixture(autouse=True)
def our_logging_restored():
    """Our loggers as they were before each test: a test that calls log.setup under capsys binds the handlers to its
    captured stream, which is closed after it; a later test of the worker logging a line printed a "Logging error"
    traceback instead (which test came next varies with xdist's scheduling)."""
    import logging

    from glm_grpo_ds.runtime import log

    loggers = [logging.getLogger(name) for name in ("glm_grpo", "glm_grpo.fatal", "glm_grpo.progress")]
    saved = [(lg, list(lg.handlers), lg.level, lg.propagate) for lg in loggers]
    rank = log._rank
    yield
    for lg, handlers, level, propagate in saved:
        lg.handlers[:] = handlers
        lg.setLevel(level)
        lg.propagate = propagate
    log._rank = rank


@pytest.fixture
def cpu_fp8():
    """Skips a test that multiplies FP8 on the CPU where this torch cannot (torch 2.11, the floor's and the GPU
    image's, takes per-row scales on a GPU only; 2.15 on the CPU too): the main suite runs it, the floor skips it
    with the reason, and its refusal is tested in tests/unit/test_fp8.py either way."""
    import torch

    from glm_grpo_ds.decoder.fp8 import fp8_supported

    why = fp8_supported(torch.device("cpu"))
    if why:
        pytest.skip(why)


def _mount_tmpfs(path, size: str) -> None:
    """A tmpfs of ``size`` at ``path``, or a skip where this machine does not let a test mount one."""
    path.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command: a real full file system needs a tmpfs")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip()}): a real full disk needs one")


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs (where this machine lets a test mount one), unmounted after."""
    path = tmp_path / "small"
    _mount_tmpfs(path, "1m")
    yield path
    subprocess.run(["umount", "-l", str(path)], check=False)  # lazy: a file a failed write left open keeps it busy


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny GLM-Image pipeline directory (seed 0), built once per test session."""
    from glm_grpo_ds.testing.tiny import build_tiny_pipeline

    return built_once(tmp_path_factory, "tiny_model", lambda path: build_tiny_pipeline(path, seed=0))


# The modules that take longest, longest first (seconds of the two workers' time, summed over each module's tests
# in a fresh-clone suite run of 2026-11-28 on 2 cores, read from --junitxml; `--durations` lists the tests): a long
# module picked up last would leave one xdist worker running it while the other idles. The Makefile runs pytest-xdist
# with --no-loadscope-reorder: by default xdist re-sorts the modules by their number of tests, which ignored this order
# and started the few-test, minutes-long modules (bench, gpu_check, quiet_tools) last: 24.5 min instead of ~20.
LONGEST_FIRST = (
    "test_bench",  # 448
    "test_world",  # 398
    "test_trainer_deepspeed",  # 350
    "test_reshape_resume",  # ~300 (alone, 2026-11-29)
    "test_robustness",  # 338
    "test_sharing",  # 166
    "test_multinode",  # 130
    "test_model_source",  # 128
    "test_gpu_timing_lease",  # ~75 (alone, 2026-11-29; replaces two CPU forms of ~155 s)
    "test_evaluate_command",  # 108
    "test_observability",  # 97
    "test_fast_rollout",  # 86
    "test_quiet_tools",  # 83
    "test_checkpoint_resume",  # 80
    "test_real_width",  # 65
    "test_gpu_check",  # ~50 (its two-rank run in the tools tier since 2026-11-29; was 147 with it)
    "test_console",  # 53
    "test_remote_reward",  # 46
    "test_decode_loop",  # 43
    "test_data_formats",  # 38
    "test_seed_recipe",  # ~45 (its run alone, 2026-11-29; the tiny world built once)
    "test_run_parts",  # ~35 (alone, 2026-11-29)
    "test_held_back_rank",  # ~40 (alone, 2026-11-29)
    "test_preflight",  # ~35 (alone, 2026-11-29)
    "test_memory_plan_deepspeed",  # 37
    "test_sweep_seeds",  # 29
    "test_rewards",  # 29
    "test_launch_env",  # 28
    "test_logprobs_in_gather",  # 27
    "test_data_training",  # 22
    "test_rollout_rows",  # 21
    "test_decoder",  # 21
    "test_fused_lora",  # 19
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable: the rest keep their order
