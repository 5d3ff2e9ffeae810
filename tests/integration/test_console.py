"""A clean console (glm_grpo_ds/runtime/run_log.py): a training run shows our lines and our progress only;
library chatter (third-party loggers, Python warnings, DeepSpeed's prints, load progress bars) goes
to output_dir/logs/rank_0.log, and to the console too with --log-level debug; a bad input is one
stderr line. Real trainer processes on the tiny pipeline, with a reward plugin that behaves like a
chatty library: its logger installs its own console handler at import (as transformers, torch and
DeepSpeed do) and warns, and it raises a Python warning, at every call."""

import os
import re
import subprocess
import sys

import pytest
from launching import CONFIG, ROOT, common  # noqa: E402  (tests/integration/launching.py)
from launching import FAST as ONE_STEP  # noqa: E402

DS_CONFIG = "ds_configs/zero2.json"
ENV = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
# the shared quickest step with its progress bar left on (what the console shows is under test), one step
FAST = [option for option in ONE_STEP if not option.startswith("logging.progress_bar")] + ["max_steps=1"]
CHATTY = """
import logging
import warnings

import torch

_lib = logging.getLogger("chatty_lib")
_lib.addHandler(logging.StreamHandler())  # prints by itself, like a library's default handler
_lib.propagate = False


def reward(images, prompts, samples):
    _lib.warning("chatty_lib says something at every call")
    warnings.warn("chatty_lib: a deprecated call", FutureWarning)
    return torch.zeros(len(prompts))
"""
# what library chatter looks like on a console (none of it may appear without --log-level debug)
# ours, printed once per install (or when another virtual environment built it last) before the op compiles
BUILD_LINE = "glm-grpo: building DeepSpeed's CPU communication op"


def without_build_line(text: str) -> str:
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith(BUILD_LINE))


CHATTER = re.compile(
    r"\[WARNING\]|\[INFO\]|Loading|%\||ds_accelerator|UserWarning|FutureWarning|warnings\.warn|chatty_lib|"
    r"built successfully|cpp_extension|DeepSpeed"
)


def run_train(*args, flags=()) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "glm_grpo_ds", "train", "--config", str(CONFIG), "--deepspeed", DS_CONFIG]
    return subprocess.run([*cmd, *flags, *args], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)


def chatty_run(tiny_model_dir, data64, tmp_path, flags=()):
    (tmp_path / "chatty.py").write_text(CHATTY)
    out = tmp_path / "run"
    rewards = f"rewards=[{{name: pixel_mse}}, {{name: '{tmp_path / 'chatty.py'}:reward'}}]"
    proc = run_train(*common(tiny_model_dir, data64, out, *FAST), rewards, flags=flags)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return proc, out


@pytest.mark.slow  # a training process (~30 s)
def test_console_holds_only_our_lines_and_the_log_file_the_library_lines(tiny_model_dir, data64, tmp_path):
    proc, out = chatty_run(tiny_model_dir, data64, tmp_path)
    *lines, summary = without_build_line(proc.stdout).splitlines()
    logfile = out / "logs" / "rank_0.log"
    # the last line names the file and counts what it holds, by library
    assert summary.startswith(f"      log {logfile} (") and "chatty_lib 1" in summary, summary
    console = lines + proc.stderr.splitlines()
    assert not [line for line in console if CHATTER.search(line)], proc.stdout + proc.stderr
    # stdout: the startup summary and the closing lines; stderr: the progress line(s) only (with the step status's
    # lines when a phase outlasts logging.status_interval_s)
    assert all(re.match(r"(glm-grpo: |done: | {6})", line) for line in lines), proc.stdout
    assert proc.stderr.splitlines() and all(
        line.startswith(("grpo step ", "grpo [")) for line in proc.stderr.splitlines()
    )

    text = logfile.read_text()
    assert re.search(r"^\d{4}-\d\d-\d\d [\d:,]+ WARNING chatty_lib: chatty_lib says something", text, re.M)
    assert re.search(r"WARNING py.warnings: .*FutureWarning: chatty_lib: a deprecated call", text)
    assert "INFO printed.DeepSpeed: DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully" in text
    assert re.search(r"INFO glm_grpo: done: metrics ", text)  # our lines too, timestamped


@pytest.mark.slow  # a training process (~30 s)
def test_log_level_debug_shows_library_lines_on_the_console(tiny_model_dir, data64, tmp_path):
    proc, out = chatty_run(tiny_model_dir, data64, tmp_path, flags=["--log-level", "debug"])
    assert "[chatty_lib] WARNING: chatty_lib says something at every call" in proc.stderr
    assert "[py.warnings] WARNING:" in proc.stderr and "FutureWarning: chatty_lib: a deprecated call" in proc.stderr
    assert "[printed.DeepSpeed] INFO: DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully" in (
        proc.stderr
    )
    assert "Loading pipeline components" in proc.stderr  # the load progress bars stay on
    assert "chatty_lib says something" in (out / "logs" / "rank_0.log").read_text()


@pytest.mark.slow  # reads the shared short training run
def test_the_load_and_a_running_step_say_where_they_are(short_run_stderr):
    """glm_grpo_ds/observability/step_status.py in a real run whose stderr is not a terminal, with
    logging.status_interval_s=0 (a line at every change): the load's stages, then the step's phases with their
    counts, the first line of each naming the phase before and its time, then the step's line."""
    lines = [re.sub(r"\b\d+(\.\d)? s\b", "T s", line) for line in short_run_stderr.splitlines()]
    stages = ["input checks", "process group", "prompts", "model files", "processor", "rewards", "policy"]
    stages += ["DeepSpeed engine", "decoder", "trackers"]
    assert [line for line in lines if line.startswith("grpo [load]")] == [
        f"grpo [load] {stage}, T s into the load" + (f" ({before} took T s)" if before else "")
        for before, stage in zip([None, *stages], stages)
    ], short_run_stderr
    # the rollout's token counts come from its decode loop every ~64 tokens (rollout.on_tokens), when it reports
    tokens = re.compile(r"grpo \[step 1/1\] rollout: \d+/\d+ tokens, T s into the step$")
    # launching.FAST: one prompt x 4 samples (one DiT batch), one reward (pixel_mse), one micro-batch of 4
    assert [line for line in lines if line.startswith("grpo [step") and not tokens.match(line)] == [
        "grpo [step 1/1] rollout, T s into the step",
        "grpo [step 1/1] decode: 0/4 images, T s into the step (rollout took T s)",
        "grpo [step 1/1] decode: 4/4 images, T s into the step",
        "grpo [step 1/1] reward: 0/1 rewards done, T s into the step (decode took T s)",
        "grpo [step 1/1] reward: 1/1 rewards done, T s into the step",
        "grpo [step 1/1] advantages, T s into the step (reward took T s)",
        "grpo [step 1/1] update: 0/1 micro-batches, T s into the step (advantages took T s)",
        "grpo [step 1/1] update: 1/1 micro-batches, T s into the step",
        "grpo [step 1/1] record, T s into the step (update took T s)",
    ], short_run_stderr
    # nothing else, and the step's line last
    assert len(lines) == len(stages) + 9 + sum(1 for line in lines if tokens.match(line)) + 1
    assert lines[-1].startswith("grpo step 1/1 reward ")


@pytest.mark.slow  # reads the shared short training run
def test_the_run_log_holds_each_steps_progress_line(short_run, short_run_stderr):
    """logs/rank_0.log has the step's progress line the console printed, timestamped (observability/metrics.py
    Progress writes it there at every step, whatever the console shows: a bar, or a line every log_every)."""
    console = [line for line in short_run_stderr.splitlines() if line.startswith("grpo step ")]
    logged = [line for line in (short_run / "logs" / "rank_0.log").read_text().splitlines() if "grpo step " in line]
    assert len(console) == len(logged) == 1, logged
    stamp, text = logged[0].split(" INFO glm_grpo.progress: ")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+", stamp) and text == console[0]


def test_missing_data_file_is_exactly_one_stderr_line(tiny_model_dir, tmp_path):
    """An input error before output_dir is used: the library output held back is dropped, nothing else
    is printed and no log is written."""
    out = tmp_path / "run"
    proc = run_train(*common(tiny_model_dir, tmp_path / "missing.jsonl", out, *FAST))
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [f"glm-grpo train: data.train_file {tmp_path / 'missing.jsonl'} does not exist"]
    assert proc.stdout == "" and not (out / "logs").exists()


def test_input_error_after_the_log_opens_is_one_stderr_line_and_logged(tiny_model_dir, data64, tmp_path):
    """An input error found while building the rewards (an lpips backbone file that is no state dict: a missing one
    is refused before the log opens, by the rewards' checks): still one line on the console (besides a step-status
    line when the load before it outlasted logging.status_interval_s, as on a busy machine); the log file holds it
    after what the libraries said."""
    out = tmp_path / "run"
    weights = tmp_path / "broken_alexnet.pth"
    weights.write_bytes(b"not a state dict")
    rewards = f"rewards=[{{name: lpips, args: {{backbone_weights: {weights}}}}}]"
    proc = run_train(*common(tiny_model_dir, data64, out, *FAST), rewards)
    assert proc.returncode == 2 and without_build_line(proc.stdout) == ""
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("grpo [load] ")]
    start = f"glm-grpo train: reward lpips: backbone_weights {weights} cannot be"
    assert len(lines) == 1 and lines[0].startswith(start)
    text = (out / "logs" / "rank_0.log").read_text()
    assert "printed.DeepSpeed: DeepSpeed" in text and f"ERROR glm_grpo.fatal: {lines[0]}" in text
