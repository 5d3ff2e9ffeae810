"""launch/gpu_check.sh - the README's one-GPU check of the multi-GPU / bf16 paths - run on a CPU:
bf16 on CPU, gloo collectives forced on at world size 1, top-k 8 / top-p 0.75 draws, ZeRO-3 + LoRA;
every verdict passes, and `glm-grpo check-run` fails a run with a non-finite step."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from run_files import metrics  # noqa: E402  (tests/run_files.py)

from glm_grpo_ds.commands.check_run import main as check_run_main
from glm_grpo_ds.runtime.ports import free_port

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow]  # a short training run + verify-logprobs


def run_gpu_check(out: Path, *args: str, **env_extra: str) -> str:
    """``bash launch/gpu_check.sh ARGS`` on the CPU writing to ``out``; asserts exit 0, returns its output."""
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        DS_ACCELERATOR="cpu",
        OUT=str(out),
        VERIFY_SIZE="64",
        MASTER_PORT=str(free_port()),
        PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        **env_extra,
    )
    proc = subprocess.run(
        ["bash", "launch/gpu_check.sh", *args, "rollout.height=64", "rollout.width=64", "grpo.group_size=4"]
        + ["decoder.num_inference_steps=1"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    for check in ("no non-finite step", "run complete", "sampler vs trainer parity"):
        assert f"PASS  {check}" in text
    # gpu_check.yaml's one iteration: the old log-probs are the update's own, 1 by construction, no PASS for it
    assert "INFO  ratio 1 on the first iteration: " in text
    return text


def test_gpu_check_script_on_cpu_passes_and_check_run_can_fail(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "check"
    text = run_gpu_check(out, str(tiny_model_dir), "max_steps=2")
    assert "(collectives forced on)" in text and "dtype torch.bfloat16" in text
    # CPU: the peaks reported, not judged, in one INFO line; nothing else is a WARN on a run whose alarms are quiet
    assert text.count("INFO  not judged on a CPU: peak vs planner, measured / planned: rollout ") == 1
    assert not any(line.startswith("WARN  ") for line in text.splitlines())
    assert "INFO  image-statistics alarms: none fired (rules: dark_fraction > start + 0.25;" in text
    assert f"INFO  curves: {out / 'reward_curve.png'}" in text

    rows = metrics(out)
    rows[-1].update(loss=None, skipped=1, first_iteration_ratio_min=None)  # what a NaN step records
    rows[-1]["images/dark_fraction"] = 1.0  # and images gone black at the last step: the default alarm fires
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    capsys.readouterr()
    assert check_run_main([str(out), "--verify", str(out / "verify.txt")]) == 1
    verdicts = capsys.readouterr().out
    assert "FAIL  no non-finite step" in verdicts
    step = rows[-1]["step"]
    warn = f"WARN  image-statistics alarm: 'dark_fraction > start + 0.25' fired at step {step}: dark_fraction 1 "
    assert warn in verdicts


@pytest.mark.distributed
@pytest.mark.tools  # the script's --num-gpus path; ZeRO-3 on two ranks is make test's (test_trainer_deepspeed.py)
def test_gpu_check_script_with_two_ranks_runs_zero3_across_them(tiny_model_dir, tmp_path):
    """`--num-gpus 2`: the check's training run on two ranks (ZeRO-3 partitions and gathers for real),
    collectives not forced (nothing to force at world size 2); every verdict passes."""
    text = run_gpu_check(
        tmp_path / "check2", "--num-gpus", "2", str(tiny_model_dir), "max_steps=1", OMP_NUM_THREADS="1"
    )
    assert "glm-grpo: world size 2 (1 node(s), CPU ranks, gloo), ZeRO stage 3" in text
    assert "(collectives forced on)" not in text
