"""Issue #27: every command keeps the console to its own lines, as `train` does (run_log.setup_tool via
the `glm-grpo` entry point): no bitsandbytes "Failed to load CPU gemm_4bit_forward ... pip install kernels",
no weight-loading bars, no FutureWarnings, no DeepSpeed accelerator line, no datasets split bar;
`--log-level debug` brings the library output back."""

import subprocess
import sys

import pytest
from adapter_files import write_adapter  # noqa: E402  (tests/integration/adapter_files.py)

from glm_grpo_ds.config import DataConfig
from glm_grpo_ds.data import DataError, load_prompts

pytestmark = [pytest.mark.slow]  # one process per command

CHATTER = ("gemm_4bit_forward", "kernels", "Loading", "it/s]", "FutureWarning", "real_accelerator", "Generating")


def glm_grpo(*args, cwd=None):
    proc = subprocess.run(
        [sys.executable, "-m", "glm_grpo_ds", *map(str, args)], capture_output=True, text=True, timeout=300, cwd=cwd
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def chatter(proc) -> list[str]:
    return [line for line in (proc.stdout + proc.stderr).splitlines() if any(c in line for c in CHATTER)]


def test_tools_print_only_their_own_lines(tmp_path):
    (tmp_path / "p.txt").write_text("red image\n")
    model = tmp_path / "model"
    built = glm_grpo("tiny-model", model)
    assert chatter(built) == [] and built.stdout.startswith("wrote tiny GLM-Image pipeline")
    small = ["--height", "64", "--width", "64", "--steps", "1"]
    rendered = glm_grpo("render", "--model", model, "--prompt", "a red cube", *small, "--out", tmp_path / "r")
    assert chatter(rendered) == [] and rendered.stdout.split() == [str(tmp_path / "r" / "000.png")]
    assert (
        rendered.stderr.strip()
        == "glm-grpo render: 64x64, 1 steps, guidance 1.5 (guidance_scale from the model's defaults)"
    )
    adapter = write_adapter(model, tmp_path / "adapter", r=4, alpha=8)
    merged = glm_grpo("merge", "--base", model, "--adapter", adapter, "--out", tmp_path / "merged")
    assert chatter(merged) == [], merged.stderr
    plan = glm_grpo(
        "estimate-memory",
        "--config",
        "launch/configs/glm_image_lora.yaml",
        "--deepspeed",
        "ds_configs/zero3.json",
    )
    assert chatter(plan) == [], plan.stderr
    # the job's preflight too (it imported bitsandbytes before any logging was set: its kernels line came first)
    checked = glm_grpo(
        "train", "--check", "--config", "launch/configs/tiny_cpu.yaml", "--deepspeed", "ds_configs/zero2.json",
        f"model.path={model}", f"data.train_file={tmp_path / 'p.txt'}", f"output_dir={tmp_path / 'run'}",
        "--num-gpus", "1", "rewards=[{name: colour_layout}]",
    )  # fmt: skip
    assert chatter(checked) == [] and checked.stdout.startswith("glm-grpo train --check:"), checked.stdout

    loud = glm_grpo("tiny-model", tmp_path / "model2", "--log-level", "debug")
    assert any("it/s]" in line for line in chatter(loud)), loud.stderr[-2000:]  # the shard-writing bar is back


def test_a_bad_csv_prompt_file_is_one_line_without_a_split_bar(tmp_path, capfd):
    bad = tmp_path / "p.csv"
    bad.write_text("caption\na red cube\n")
    with pytest.raises(DataError, match=r'data.prompt_key "prompt" is not a column of .*p.csv'):
        load_prompts(str(bad), "data.train_file", DataConfig())
    assert "Generating" not in capfd.readouterr().err
