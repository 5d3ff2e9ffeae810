"""An earlier run's output_dir, resume_from=auto, a bad input under the real launcher (the one-line path end
to end; the other bad-input cases run in-process in test_bad_inputs.py); reward failures, non-finite steps
and preemption during training. Single-process runs use `python -m glm_grpo_ds.train`; cross-rank
agreement uses the real deepspeed launcher with 2 CPU ranks."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from launching import (  # noqa: E402  (tests/integration/launching.py)
    CONFIG,
    ENV,
    FAST,
    ROOT,
    WORKER,
    common,
    free_port,
    launch,
    launch_cmd,
    run_cmd,
    run_train,
    train_args,
    train_cmd,
)
from run_files import assert_no_frozen_parameters, metrics, tree_hash  # noqa: E402  (tests/run_files.py)
from safetensors.torch import load_file

pytestmark = [pytest.mark.slow, pytest.mark.distributed]  # a training process per case, some through the launcher


def test_lora_zero2_checkpoint_holds_no_frozen_base_parameter(short_run):
    assert_no_frozen_parameters(short_run / "checkpoints" / "step_000001" / "ds")


def test_fresh_start_in_an_earlier_runs_output_dir_is_refused_then_overwrite_starts_over(
    short_run, tiny_model_dir, data64, tmp_path
):
    """Re-running into a used output_dir must not destroy the earlier run: refused with one line and
    the earlier run byte-identical; overwrite_output_dir=true starts over, and pruning keeps this run's
    newest checkpoint (the one `latest` names)."""
    out = tmp_path / "earlier"
    shutil.copytree(short_run, out)
    before = tree_hash(out)
    again = common(tiny_model_dir, data64, out, "max_steps=2", "save_steps=1", "save_total_limit=1", *FAST)
    proc = run_train(*again)
    assert proc.returncode == 2, proc.stderr[-3000:]
    ours = [line for line in proc.stderr.splitlines() if line.startswith("glm-grpo train:")]
    assert ours == [
        f"glm-grpo train: output_dir {out} holds an earlier run (checkpoints/, metrics.jsonl, final_adapter/); "
        "continue it with resume_from=auto (or latest), or start over with overwrite_output_dir=true (deletes it), "
        "or pick another output_dir="
    ], proc.stderr[-3000:]
    assert tree_hash(out) == before

    proc = run_train(*again, "overwrite_output_dir=true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r["step"] for r in metrics(out)] == [1, 2]
    ckpts = out / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step_000002"]
    assert (ckpts / "latest").read_text() == "step_000002"
    assert json.loads((ckpts / "step_000002" / "trainer_state.json").read_text())["run_id"]


def test_resume_from_auto_starts_fresh_then_continues(tiny_model_dir, data64, tmp_path):
    """What the launch scripts pass: the first launch starts fresh, the relaunch (a requeued job)
    continues from `latest`."""
    out = tmp_path / "run"
    first = run_train(*common(tiny_model_dir, data64, out, "max_steps=1", "save_steps=1", "resume_from=auto", *FAST))
    assert first.returncode == 0, first.stderr[-3000:]
    assert f"resume_from=auto: no checkpoint in {out}, starting fresh" in first.stdout
    # issue #27: the prompt file changed since the checkpoint (one row more) -> a warning, not silence
    changed = Path(data64).with_name(f"changed_{tmp_path.name}.jsonl")
    lines = Path(data64).read_text().splitlines()
    changed.write_text("\n".join([*lines, lines[0]]) + "\n")
    again = run_train(*common(tiny_model_dir, changed, out, "max_steps=2", "save_steps=1", "resume_from=auto", *FAST))
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resumed from {out / 'checkpoints' / 'step_000001'} at step 1" in again.stdout
    assert "differs from the one this checkpoint was trained on" in again.stdout + again.stderr
    assert [r["step"] for r in metrics(out)] == [1, 2]
    assert (out / "checkpoints" / "latest").read_text() == "step_000002"
    # the first end's adapter is set aside by its step, final_adapter/ is the new end's
    assert json.loads((out / "final_adapter.step1" / "training_state.json").read_text()) == {"step": 1}
    assert json.loads((out / "final_adapter" / "training_state.json").read_text()) == {"step": 2}
    # a finished run: one line, exit 0, nothing touched (no model loaded, no file rewritten)
    before = tree_hash(out)
    done = run_train(*common(tiny_model_dir, changed, out, "max_steps=2", "save_steps=1", "resume_from=auto", *FAST))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "nothing to do: the run finished at step 2 of max_steps=2" in done.stdout
    assert tree_hash(out) == before
    # killed before its final weights, relaunched with max_steps lowered below the checkpoint: the weights written
    # are step 2's and say so, and the next relaunch finds the run finished
    shutil.rmtree(out / "final_adapter")
    lowered = common(tiny_model_dir, changed, out, "max_steps=1", "save_steps=1", "resume_from=auto", *FAST)
    assert run_train(*lowered).returncode == 0
    assert json.loads((out / "final_adapter" / "training_state.json").read_text()) == {"step": 2}
    assert "nothing to do: the run finished at step 2 of max_steps=1" in run_train(*lowered).stdout


def test_bad_input_under_the_launcher_exits_2_with_one_line(tiny_model_dir, data64, tmp_path):
    """Every rank raises the same input error before any collective: no hang, one line (rank 0)."""
    proc = launch(
        2,
        [
            *train_args(),
            *common(tiny_model_dir, data64, tmp_path / "out", *FAST),
            "rewards=[{name: pixel_mes}]",
        ],
        timeout=300,
        check=False,
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text[-3000:]
    assert text.count("glm-grpo train: rewards[0].name: unknown reward 'pixel_mes'") == 1 and "Traceback" not in text


# ----------------------------------------------------------------------------- during training
FLAKY = """
import torch
calls = [0]
def flaky(images, prompts, samples):
    calls[0] += 1
    if calls[0] != 2:
        raise RuntimeError(f"scorer offline (call {calls[0]})")
    values = torch.arange(len(prompts), dtype=torch.float32)
    values[0] = float("nan")
    return values
"""


def test_reward_that_raises_or_returns_nan_is_counted_and_warned_once(tiny_model_dir, data64, tmp_path):
    (tmp_path / "flaky.py").write_text(FLAKY)
    spec = f"{tmp_path / 'flaky.py'}:flaky"
    out = tmp_path / "run"
    proc = run_train(
        *common(tiny_model_dir, data64, out, "max_steps=3", *FAST),
        f"rewards=[{{name: pixel_mse}}, {{name: '{spec}'}}]",
        flags=["--log-level", "warning"],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = metrics(out)
    assert [r[f"reward/{spec}_failed"] for r in rows] == [4, 0, 4]
    assert [r[f"reward/{spec}_undefined"] for r in rows] == [4, 1, 4]
    assert all(r["reward/pixel_mse_failed"] == 0 and r["skipped"] == 0 for r in rows)
    # over the groups every reward measured: none at steps 1 and 3 (null, not 0.0: an outage is no easy prompts)
    assert [r["frac_reward_zero_std"] for r in rows] == [None, 0.0, None]
    assert proc.stderr.count("raised RuntimeError: scorer offline (call 1)") == 1
    assert "call 3" not in proc.stderr  # warned once, not every step
    assert proc.stderr.count("returned None/NaN/inf for 1 of 4 samples") == 1
    assert "glm-grpo: world size" not in proc.stdout  # --log-level warning hides the info summary
    # the closing lines say it again: the console's one warning was at step 1, long scrolled away in a real run
    closing = f"{spec}: 8 samples undefined by failures in 2 of 3 steps (steps 1-3; reward/{spec}_failed in"
    assert (proc.stdout + proc.stderr).count(closing) == 1, proc.stderr[-2000:]
    assert "rewards that failed on some samples (1; check the reward's server or plugin)" in proc.stdout + proc.stderr


STARVED = """
import os
import torch
calls = [0]
def starved(images, prompts, samples):
    calls[0] += 1
    if calls[0] == 2 and os.environ["RANK"] == "1":  # the caching allocator's words (torch 2.15)
        raise torch.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.23 "
            "GiB is free. Including non-PyTorch memory, this process has 77.90 GiB memory in use. Of the allocated "
            "memory 70.10 GiB is allocated by PyTorch, and 0.50 GiB is reserved by PyTorch but unallocated."
        )
    return torch.zeros(len(prompts))
"""


def test_out_of_memory_on_one_rank_ends_the_run_with_its_line_and_exit_8(tiny_model_dir, data64, tmp_path):
    """Rank 1's reward runs out of memory at step 2: not a failure of its samples (the run would go on training on
    the other reward alone) but the run's end, under the launcher: one line from rank 1, named, saying where and
    what plans it lower and how to go on from the checkpoint of step 1; the launcher's status 8 (rank 0, whose
    collective lost rank 1, waits instead of exiting 1 first: ds/dist.py peer_lost)."""
    (tmp_path / "starved.py").write_text(STARVED)
    out = tmp_path / "run"
    proc = launch(
        2,
        [
            *train_args(),
            *common(tiny_model_dir, data64, out, "max_steps=3", "save_steps=1", *FAST),
            f"rewards=[{{name: pixel_mse}}, {{name: '{tmp_path / 'starved.py'}:starved', label: judge}}]",
        ],
        timeout=300,
        check=False,
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode == 8, text[-3000:]
    (line,) = [x for x in text.splitlines() if "out of GPU memory" in x]
    assert re.match(
        r"\[rank 1, [^]]+\] glm-grpo train: out of GPU memory in the reward phase of step 2 \(reward judge\): tried "
        r"to allocate 2.00 GiB with 1.23 GiB of 79.15 GiB free; the plan puts this phase at [\d.]+ of [\d.]+ GiB; ",
        line,
    ), line
    assert line.endswith("the last checkpoint is step_000001 (checkpoints/latest): make one of these changes, then "
                         "resume with resume_from=latest")  # fmt: skip
    assert "raised OutOfMemoryError" not in text and "fragmentation" not in line  # 0.5 GiB of 79 is no fragmentation
    assert (out / "checkpoints" / "latest").read_text() == "step_000001"


def test_steps_whose_rewards_are_all_undefined_are_skipped_then_the_run_stops(tiny_model_dir, data64, tmp_path):
    """A reward undefined for every sample (here a plugin that always returns NaN) trains nothing:
    each such step is skipped like a non-finite one, and max_consecutive_skips of them stop the run
    with a checkpoint and exit 3 instead of "succeeding" with zero gradients."""
    (tmp_path / "never.py").write_text(
        "import torch\ndef never(images, prompts, samples):\n    return torch.full((len(prompts),), float('nan'))\n"
    )
    out = tmp_path / "run"
    proc = run_train(
        *common(tiny_model_dir, data64, out, "max_steps=4", "max_consecutive_skips=2", *FAST),
        f"rewards=[{{name: '{tmp_path / 'never.py'}:never'}}]",
    )
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "glm-grpo train: stopped at step 2: the last 2 steps were skipped" in proc.stderr
    assert proc.stderr.count("every trained reward is undefined (NaN) for every sample") == 1  # warned once
    rows = metrics(out)
    assert [(r["skipped"], r["skipped_steps"], r["loss"], r["grad_norm"]) for r in rows] == [
        (1, 1, None, None),
        (1, 2, None, None),
    ]
    ckpts = out / "checkpoints"
    assert (ckpts / "latest").read_text() == "step_000002"
    adapter = load_file(ckpts / "step_000002" / "adapter" / "adapter_model.safetensors")
    assert all((t == 0).all() for k, t in adapter.items() if "lora_B" in k)  # LoRA B starts at 0: no update ran


@pytest.mark.parametrize("nprocs,ds_config", [(1, "zero2.json"), (2, "zero3.json")])
def test_nonfinite_steps_are_skipped_then_the_run_stops_with_a_checkpoint(
    nprocs, ds_config, tiny_model_dir, data64, tmp_path
):
    out = tmp_path / "run"
    overrides = common(
        tiny_model_dir,
        data64,
        out,
        "max_steps=6",
        "save_steps=1",
        "max_consecutive_skips=2",
        "optimizer.lr=1e-2",
        *FAST,
    )
    args = [
        str(WORKER),
        "nonfinite",
        str(tmp_path / "w"),
        "--deepspeed",
        f"ds_configs/{ds_config}",
        "--config",
        str(CONFIG),
        *overrides,
    ]
    # what is tested is the ranks' skipping, not the launcher (its exit status: the bad-input and signal tests)
    if nprocs == 1:
        proc = run_cmd([sys.executable, *args], timeout=300)  # forked from the preloaded parent (tests/forkserver.py)
    else:
        proc = launch(nprocs, args, timeout=300, check=False, launcher=False)
    assert proc.returncode == 3, (proc.stdout + proc.stderr)[-3000:]
    assert (
        "glm-grpo train: stopped at step 3: the last 2 steps were skipped for a non-finite loss or gradient"
        in proc.stderr
    )
    rows = metrics(out)
    assert [r["skipped"] for r in rows] == [0, 1, 1] and [r["skipped_steps"] for r in rows] == [0, 1, 2]
    assert rows[0]["loss"] is not None and rows[1]["loss"] is None
    ckpts = out / "checkpoints"
    assert (ckpts / "latest").read_text() == "step_000003"
    adapters = [load_file(ckpts / f"step_00000{i}" / "adapter" / "adapter_model.safetensors") for i in (1, 2, 3)]
    assert any(t.abs().sum() > 0 for k, t in adapters[0].items() if "lora_B" in k)  # step 1 did update
    for skipped in adapters[1:]:  # the skipped steps changed nothing, bitwise
        assert all((skipped[k] == adapters[0][k]).all() for k in adapters[0])
    assert json.loads((ckpts / "step_000003" / "trainer_state.json").read_text())["skipped_steps"] == 2


def test_sigterm_saves_a_checkpoint_and_resume_continues(tiny_model_dir, data64, tmp_path):
    out = tmp_path / "run"
    args = [
        *train_args(),
        *common(tiny_model_dir, data64, out, "max_steps=1000", *FAST),
    ]
    cmd, env, _ = launch_cmd(2, args)
    log = (tmp_path / "log").open("w+")
    # a session of its own: a failure kills its ranks too, not only the runner (they would load the machine on)
    runner = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 300
        while not ((out / "metrics.jsonl").is_file() and (out / "metrics.jsonl").read_text().strip()):
            assert runner.poll() is None and time.time() < deadline, "run ended or never reached step 1"
            time.sleep(0.5)
        # The `deepspeed` runner does not forward signals on one node; its child, the per-node
        # launcher (deepspeed.launcher.launch), does: SIGTERM to each rank, SIGKILL 30 s later.
        (node_launcher,) = psutil.Process(runner.pid).children()
        node_launcher.send_signal(signal.SIGTERM)
        runner.wait(timeout=120)
    finally:
        _kill_session(runner.pid)
    log.seek(0)
    text = log.read()
    assert runner.returncode != 0
    m = re.search(
        r"glm-grpo train: preempted by SIGTERM at step (\d+); checkpoint at (\S+); resume with resume_from=latest", text
    )
    assert m, text[-3000:]
    step = int(m.group(1))
    assert Path(m.group(2)) == out / "checkpoints" / f"step_{step:06d}"
    assert (out / "checkpoints" / "latest").read_text() == f"step_{step:06d}"
    proc = launch(
        2,
        [
            *train_args(),
            *common(tiny_model_dir, data64, out, f"max_steps={step + 1}", "resume_from=latest", *FAST),
        ],
        timeout=600,
        launcher=False,  # the resume is tested here, not the launcher (it took the SIGTERM above)
    )
    assert f"resumed from {out / 'checkpoints' / f'step_{step:06d}'} at step {step}" in proc.stdout
    assert [r["step"] for r in metrics(out)] == list(range(1, step + 2))
    assert (out / "final_adapter" / "adapter_model.safetensors").is_file()


# ----------------------------------------------------------------------------- Ctrl-C
def _wait_for(predicate, runner, what, timeout=300):
    deadline = time.time() + timeout
    while not predicate():
        assert runner.poll() is None, f"the run ended before {what}"
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def sigint_default():
    """preexec_fn of a run a test sends Ctrl-C to: SIGINT's default, whatever this process has (`make test &`
    and nohup start the suite with SIGINT ignored, and a run keeps an inherited ignored SIGINT ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_during_startup_is_one_line(tiny_model_dir, data64, tmp_path):
    out = tmp_path / "run"
    cmd = train_cmd()
    runner = subprocess.Popen(
        [*cmd, *common(tiny_model_dir, data64, out, *FAST)],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=sigint_default,
    )
    try:
        # at the instant output_dir appears (Trainer.__init__, inside startup_signals): the earliest point of
        # startup a user can see. It was lost on two fresh clones (2026-11-23); now a swallowed Interrupted
        # raises again when startup ends, and the run starts with SIGINT's default (sigint_default).
        _wait_for(out.is_dir, runner, "startup")
        runner.send_signal(signal.SIGINT)
        _, err = runner.communicate(timeout=120)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert runner.returncode == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    ours = [line for line in err.splitlines() if line.startswith("glm-grpo train:")]
    assert ours == [
        "glm-grpo train: interrupted by SIGINT during startup, before the first step; nothing was saved "
        "(checkpoints already in output_dir are untouched)"
    ], err[-3000:]


SLOW = """
import os, time
from pathlib import Path
import torch
calls = [0]
def slow(images, prompts, samples):
    calls[0] += 1
    if calls[0] == 2:  # step 2 takes a minute (SLOW_S): a signal now lands in the middle of a step
        Path(os.environ["IN_STEP_2"]).touch()
        time.sleep(float(os.environ.get("SLOW_S", "60")))
    return images.mean(dim=(1, 2, 3))
"""


def test_ctrl_c_announces_at_once_and_a_second_one_aborts_with_the_checkpoint_intact(tiny_model_dir, data64, tmp_path):
    (tmp_path / "slow.py").write_text(SLOW)
    out, marker = tmp_path / "run", tmp_path / "in_step_2"
    cmd = train_cmd()
    overrides = common(tiny_model_dir, data64, out, "max_steps=5", "save_steps=1", *FAST)
    log = (tmp_path / "stderr").open("w+")
    runner = subprocess.Popen(
        [*cmd, *overrides, f"rewards=[{{name: '{tmp_path / 'slow.py'}:slow'}}]"],
        cwd=ROOT,
        env=dict(ENV, IN_STEP_2=str(marker)),
        stdout=subprocess.DEVNULL,
        stderr=log,
        preexec_fn=sigint_default,
    )
    try:
        _wait_for(marker.exists, runner, "step 2")
        runner.send_signal(signal.SIGINT)
        notice = "glm-grpo train: SIGINT received: the run will save a checkpoint and stop after step 2"
        # at once, although the step has most of a minute to go
        _wait_for(lambda: notice in Path(log.name).read_text(), runner, "the notice", timeout=10)
        runner.send_signal(signal.SIGINT)
        runner.wait(timeout=20)  # aborted at once, not after the step
    finally:
        if runner.poll() is None:
            runner.kill()
    log.seek(0)
    err = log.read()
    assert runner.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "preempted" not in err, err[-3000:]
    assert "press Ctrl-C again to abort at once (the last complete checkpoint stays intact)" in err
    assert err.count("glm-grpo train: second Ctrl-C: aborted at once, without a checkpoint") == 1
    from glm_grpo_ds.lifecycle import checkpoint

    latest = checkpoint.resolve(out, "latest")  # the step-1 checkpoint, complete and loadable
    assert latest.name == "step_000001" and checkpoint.read_state(latest)["step"] == 1


def _kill_session(sid: int) -> None:
    """SIGKILL every process left in session ``sid`` (a launcher its script no longer waits for, its ranks)."""
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) == sid:
                proc.kill()
        except (OSError, psutil.Error):
            pass


def test_sigterm_to_train_sh_outlasts_the_launchers_30_s_kill(tiny_model_dir, data64, tmp_path):
    """A scheduler's SIGTERM to launch/train.sh while step 2 takes 40 s (a full-size step and save take
    minutes): the script passes it to the rank, not to the deepspeed launcher (which would SIGKILL the rank
    30 s later); the rank finishes the step, saves step 2 and the script exits 143."""
    (tmp_path / "slow.py").write_text(SLOW)
    out, marker = tmp_path / "run", tmp_path / "in_step_2"
    env = dict(
        ENV,
        PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",  # the venv's deepspeed
        NUM_GPUS="1",
        CONFIG=str(CONFIG),
        DS_CONFIG="ds_configs/zero2.json",
        MASTER_PORT=str(free_port()),
        OMP_NUM_THREADS="1",
        IN_STEP_2=str(marker),
        SLOW_S="40",
    )
    rewards = f"rewards=[{{name: '{tmp_path / 'slow.py'}:slow'}}]"
    overrides = common(tiny_model_dir, data64, out, "max_steps=3", "save_steps=100", *FAST, rewards)
    log = (tmp_path / "log").open("w+")
    runner = subprocess.Popen(
        ["bash", "launch/train.sh", *overrides],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        _wait_for(marker.exists, runner, "step 2")
        sent = time.monotonic()
        runner.send_signal(signal.SIGTERM)  # to the script only, as a scheduler does
        runner.wait(timeout=180)
        waited = time.monotonic() - sent
    finally:
        _kill_session(runner.pid)
    log.seek(0)
    text = log.read()
    assert runner.returncode == 143, text[-3000:]
    assert "glm-grpo train: preempted by SIGTERM at step 2; checkpoint at" in text, text[-3000:]
    assert (out / "checkpoints" / "latest").read_text() == "step_000002"
    assert waited > 30  # the step outlasted the launcher's SIGKILL delay
