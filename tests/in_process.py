"""`glm-grpo train` and the other `glm-grpo` commands run inside the test process: what an error case needs
(the input checks, the one-line error, the exit status) without a new interpreter per case (~5 s of
imports each). The process-wide state a run
sets up is put back afterwards, so later tests in the same process see none of it: the logging handlers
and levels (run_log.setup), captured warnings, sys.excepthook, the launcher variables a single process
defaults to (RANK, MASTER_PORT, ...), torch's thread count and the process group. It runs in the checkout,
as the subprocess tests do (`cwd=ROOT`): relative paths such as ds_configs/zero2.json mean the same.

    from in_process import glm_grpo, train_main   # a test module (tests/ is on the path: tests/conftest.py)
    code, err_lines = train_main(["--config", CONFIG, "--deepspeed", DS, *overrides], capfd)
    code, out, err = glm_grpo(["merge", "--base", ...], capfd)
"""

import logging
import os
import sys
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
# what ds/engine.init_distributed sets by default for a single process (setdefault): removed afterwards
_LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "DS_ACCELERATOR")
_GLM_LOGGERS = ("glm_grpo", "glm_grpo.fatal")


def _logging_state():
    root = logging.getLogger()
    named = {name: logging.getLogger(name) for name in _GLM_LOGGERS}
    return (
        root.level,
        list(root.handlers),
        {n: (lg.level, list(lg.handlers), lg.propagate) for n, lg in named.items()},
    )


def _restore_logging(state) -> None:
    level, handlers, named = state
    root = logging.getLogger()
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
            handler.close()
    root.setLevel(level)
    for name, (lvl, hs, propagate) in named.items():
        lg = logging.getLogger(name)
        lg.handlers[:] = hs
        lg.setLevel(lvl)
        lg.propagate = propagate
    logging.captureWarnings(False)


def _run(main, argv: list, capfd) -> tuple[int, str, str]:
    """``main(argv)`` here with the state it sets up put back; (exit code, stdout, stderr) it wrote.
    ``capfd``: pytest's fixture (the run's handlers bind to the streams in place when it starts)."""
    from glm_grpo_ds.ds import dist

    saved_env = {k: os.environ.get(k) for k in _LAUNCHER_VARS}
    saved_dist = dict(dist._state)
    os.environ["DS_ACCELERATOR"] = "cpu"  # a CPU run even where CUDA works, as the subprocess tests
    logging_state, hook, threads = _logging_state(), sys.excepthook, torch.get_num_threads()
    capfd.readouterr()  # what came before is not this run's
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        with warnings.catch_warnings():
            code = main([str(a) for a in argv])
    except SystemExit as end:  # argparse's usage errors, a command that exits by itself
        code = end.code if isinstance(end.code, int) else 1
    finally:
        if dist.initialized():  # main shuts it down on every path; a failed assertion above must not leak it
            torch.distributed.destroy_process_group()
        os.chdir(cwd)
        dist._state.update(saved_dist)
        _restore_logging(logging_state)
        sys.excepthook = hook
        torch.set_num_threads(threads)
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    out, err = capfd.readouterr()
    return int(code or 0), out, err


def train_main(argv: list, capfd) -> tuple[int, list[str]]:
    """``python -m glm_grpo_ds.train ARGV`` here: (exit code, the lines it wrote to stderr)."""
    from glm_grpo_ds.train import main

    code, _, err = _run(main, argv, capfd)
    return code, err.splitlines()


def glm_grpo(argv: list, capfd) -> tuple[int, str, str]:
    """``glm-grpo ARGV`` here: (exit code, stdout, stderr)."""
    from glm_grpo_ds.commands.cli import main

    return _run(main, argv, capfd)
