"""launch/gpu_timing.sh's CPU form (issue #63): the tiny GLM-Image with random weights (``random:tiny``) at 64x64, all
four parts in order, each writing its JSON as it ends: the training steps serial, then one step off (compared), the
DiT per image-step (sdpa and guidance on the first half of the steps), the decode step per sampler at 2 and 4 rows
(tokens checked against each variant's reference); then ``--write-docs`` regenerates the docs' regions from those
JSONs in a copy of the docs, leaving the planner's anchors alone (a CPU's figures are no GPU's)."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from glm_grpo_ds.memory.timing_docs import region
from glm_grpo_ds.runtime.ports import free_port

# the deepspeed launcher, twice (one rank each); the tools tier (make test-tools, after make test in CI)
pytestmark = [pytest.mark.slow, pytest.mark.distributed, pytest.mark.tools]

ROOT = Path(__file__).resolve().parents[2]
ANCHORS = "glm_grpo_ds/memory/gpu_figures.py"
PARTS = ("train", "train_one_step_off", "dit_timing", "decode_timing")
# every decode-step variant that has a reference to agree with (the lease's default five and graph_lora, hf_generate)
ROW_VARIANTS = "eager,merged,graph_lora,graph,fused,graph_fused,hf_generate"


@pytest.fixture(scope="module")
def lease(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_timing")
    env = dict(
        os.environ,
        PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        DS_ACCELERATOR="cpu",
        MASTER_PORT=str(free_port()),
        OUT=str(out),
        MODEL="random:tiny",
        SIZE="64",
        BUDGET_S="3600",  # the CPU form's budget: nothing skipped (the planned seconds are an H200's)
        TRAIN_STEPS="2",
        # fp32: bf16 matmuls on this CPU are ~50x slower; the DiT's compile: ~30 s a run on 2 cores
        TRAIN_OVERRIDES="grpo.group_size=4 decoder.num_inference_steps=1 decoder.compile=false model.dtype=fp32",
        DIT_VARIANTS="sdpa,guidance_half",
        DIT_BATCH="2",
        ROWS="2,4",
        ROW_VARIANTS=ROW_VARIANTS,
        DECODE_STEPS="4",
    )
    proc = subprocess.run(
        ["bash", "launch/gpu_timing.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return out, proc.stdout


def test_the_plan_comes_first_then_the_four_parts_in_order_each_with_its_json(lease):
    out, stdout = lease
    head = stdout.splitlines()[:7]
    assert head[0].startswith("the lease: 3600 s of wall clock, planned on one H200's figures")
    assert head[1].split() == ["part", "planned", "s", "how"]
    assert [line.split()[0] for line in head[2:7]] == [*PARTS, "total"]
    starts = [stdout.index(f"gpu_timing.sh: part {part}, at ") for part in PARTS]
    assert starts == sorted(starts) and stdout.index("total") < starts[0]
    assert "measured: train train_one_step_off dit_timing decode_timing; skipped: none; failed: none" in stdout
    plan = json.loads((out / "plan.json").read_text())
    env = (out / "env.txt").read_text()  # what the figures were measured with
    assert "- torch:" in env and "- CUDA available:" in env and "Every dependency is inside its supported range" in env
    for part in PARTS:
        m = json.loads((out / f"{part}.json").read_text())
        planned = next(p["planned_s"] for p in plan["parts"] if p["part"] == part)
        assert m["lease"]["planned_s"] == planned > 0 and m["lease"]["wall_s"] >= 0 and m["lease"]["budget_s"] == 3600
        assert m["device"] == "cpu" and m["torch"] and re.fullmatch(r"\d{4}-\d\d-\d\d", m["date"])


def test_the_training_parts_serial_then_one_step_off_compared(lease):
    out, stdout = lease
    serial, off = (json.loads((out / f"{p}.json").read_text()) for p in PARTS[:2])
    assert [r.get("rollout_overlapped", False) for r in serial["steps"]] == [False, False]
    assert [r["rollout_overlapped"] for r in off["steps"]] == [False, True]
    for m in (serial, off):
        settings = (m["model"], m["images"], m["size"], m["zero_stage"], m["full_size"])
        assert settings == ("random:tiny", 4, [64, 64], 2, False)
        assert m["rollout"]["fuse_lora"] and m["rollout"]["cuda_graph"] and not m["rollout"]["merge_lora"]
        assert m["planned"]["total_s"] > 0 and m["steady"]["images_per_gpu_s"] > 0
        assert f"training steps of {m['part']} on this machine (the first one" in stdout
    assert off["compared"][0].startswith("serial vs one step off, steady steps")
    assert "x the serial run's images per GPU-second" in off["compared"][3] and off["compared"][3] in stdout


def test_the_dit_part_times_half_guidance_beside_the_reference(lease):
    m = json.loads((lease[0] / "dit_timing.json").read_text())
    assert list(m["variants"]) == ["sdpa", "guidance_half"] and m["failed"] == {}
    half = m["variants"]["guidance_half"]
    assert half["guided_steps"] == {"1": 1, "3": 2} and half["guided_fraction"] == 0.5
    assert half["max_abs_diff"] > 0  # fewer guided steps: other images, by design


def test_the_decode_part_at_each_rows_with_tokens_checked(lease):
    out, stdout = lease
    m = json.loads((out / "decode_timing.json").read_text())
    assert list(m["rows"]) == ["2", "4"]
    for n, report in m["rows"].items():
        assert report == json.loads((out / f"decode_timing_rows_{n}.json").read_text())
        v, names = report["variants"], ROW_VARIANTS.split(",")
        assert list(v) == names and report["failures"] == [] and report["group_size"] == int(n)
        assert v["graph"]["same_tokens"] == 1.0 and v["graph"]["max_logp_diff"] == 0.0  # bitwise its eager loop
        assert v["graph_lora"]["same_tokens"] == 1.0 and v["graph_fused"]["same_tokens"] == 1.0
        assert v["merged"]["restored_bitwise"] is True and v["merged"]["vs_eager_max_logp_diff"] <= 1e-6
        for name, r in v.items():
            per_image = r["ms_per_step"] / 1e3 * report["decode_tokens"] / int(n)
            assert f"{n:>5}  {name:<22}{r['ms_per_step']:>9.2f}" in stdout and f"{per_image:>16.3f}" in stdout


def test_write_docs_regenerates_every_region_from_the_jsons_into_a_copy(lease, tmp_path):
    out = lease[0]
    for name in ("docs/memory-and-speed.md", "README.md", ANCHORS):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    before = {p: p.read_bytes() for p in (ROOT / "docs/memory-and-speed.md", ROOT / "README.md")}
    cmd = [sys.executable, "-m", "glm_grpo_ds.memory.step_time", "--write-docs", str(out), "--root", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    docs = (tmp_path / "docs/memory-and-speed.md").read_text()
    for name, part in (("train", "train"), ("train-one-step-off", "train_one_step_off"), ("dit", "dit_timing"),
                       ("decode", "decode_timing")):  # fmt: skip
        text = region(docs, name)
        assert text.strip().startswith("Measured 20") and " on cpu (torch " in text, name
        assert f"docs/memory-and-speed.md {name}: from {out / part}.json" in proc.stdout
    assert "| 2 (beside) |" in region(docs, "train-one-step-off") and "`guidance_half`" in region(docs, "dit")
    # the captured fused sampler beside its eager loop: the same tokens, and log-probs bit for bit
    graph_fused = next(line for line in region(docs, "decode").splitlines() if line.startswith("| 4 | `graph_fused` |"))
    assert graph_fused.endswith("| `fused`: 100.0%, max \\|dlogp\\| 0.0e+00 |"), graph_fused
    # a CPU's figures are no anchor: the anchors, the planned step and the README's measured step stay as they were
    assert (tmp_path / ANCHORS).read_bytes() == (ROOT / ANCHORS).read_bytes()
    assert region(docs, "planned-step") == region((ROOT / "docs/memory-and-speed.md").read_text(), "planned-step")
    assert (
        region((tmp_path / "README.md").read_text(), "time-per-step").split()
        == region((ROOT / "README.md").read_text(), "time-per-step").split()
    )
    assert "anchors: left as they were" in proc.stdout and "its measured step left (no full-size run)" in proc.stdout
    assert {p: p.read_bytes() for p in before} == before  # the real files untouched


def test_a_run_on_random_weights_says_so_in_its_summary_record_card_and_check(lease):
    """model.path=random:tiny (glm_grpo_ds/model/random_weights.py): each output of the run names its random weights."""
    out, stdout = lease
    run = out / "train"
    name = "random:tiny,ar_layers=2,dit_layers=2,seed=0"
    assert json.loads((run / "config.json").read_text())["model_source"]["random_weights"] == name
    assert f"model {name}: random weights" in stdout  # the run's closing summary
    card = (run / "final_adapter" / "README.md").read_text()
    assert f"- base model: `{name}`, **random weights**" in card
    check = subprocess.run(
        [sys.executable, "-m", "glm_grpo_ds.commands.cli", "check-run", str(run)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert f"INFO  model: {name}: random weights" in check.stdout
