"""Memory planner arithmetic by hand (ZeRO paper formulas with LoRA / 8-bit adjustments) and the CLI."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from glm_grpo_ds.config import load_config
from glm_grpo_ds.memory_plan import GIB, EstimateConfig, Sizes, grid_tokens, plan

ROOT = Path(__file__).resolve().parents[2]
ZERO = {s: json.loads((ROOT / "ds_configs" / f"zero{s}.json").read_text()) for s in (1, 2, 3)}
TEXT = dict(layers=4, hidden=64, intermediate=160, heads=4, kv_heads=2, head_dim=16, vision_vocab=100)


def sizes(trainable, lora=()):
    return Sizes(
        ar_base=[1000, 10, 4000],
        lora=list(lora),
        trainable=trainable,
        largest_trainable=max(lora, default=4000),
        decoder=500,
        dit_hidden=32,
        text=TEXT,
        source="test",
    )


def cfg(*overrides):
    return load_config(
        None, ["model.path=x", "data.train_file=x", "rewards=[{name: pixel_mse}]", "model.dtype=bf16", *overrides]
    )


def test_grid_tokens_match_glm_image():
    assert grid_tokens(1024, 1024) == 1024 + 256  # DESIGN: 1024^2 -> 1024 + 256
    assert grid_tokens(64, 96) == 2 * 3 + 19 * 13  # preview 16*sqrt(2/3) x 16*sqrt(3/2)


def test_full_finetuning_adamw_is_the_zero_paper_formula():
    # full fine-tuning, AdamW: (2 + 2 + 12) * psi / N model states at ZeRO-3 (bf16 weights + grads,
    # fp32 master + two moments); tensors of 10 elements are below no threshold here
    c = cfg("lora=null", "optimizer.name=adamw", "grpo.beta=0")
    ds = json.loads(json.dumps(ZERO[3]))
    ds["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    p = plan(c, ds, EstimateConfig(num_gpus=4), sizes(trainable=5010))
    comp = p["components"]
    assert comp["ar_weights"] == 2 * (250 + 3 + 1000)  # ceil(psi_i / 4) per tensor, bf16
    assert comp["gradients"] == 2 * math.ceil(5010 / 4)
    assert comp["master_weights"] == 4 * math.ceil(5010 / 4)
    assert comp["optimizer_states"] == 8 * math.ceil(5010 / 4) + 4
    assert comp["reference"] == 0 and comp["lora_weights"] == 0


def test_stages_lora_8bit_reference_and_offload():
    lora = [640, 640]
    c = cfg("optimizer.name=adamw_8bit", "lora.r=8")
    p1 = plan(c, ZERO[1], EstimateConfig(num_gpus=2), sizes(trainable=1280, lora=lora))["components"]
    assert p1["ar_weights"] == 2 * 5010 and p1["lora_weights"] == 2 * 1280  # whole on every GPU
    assert p1["gradients"] == 2 * 1280  # ZeRO-1 does not partition gradients
    assert p1["optimizer_states"] == 2 * 640 + 8 * math.ceil(640 / 256) + 2048  # 8-bit codes + block scales + maps
    p2 = plan(c, ZERO[2], EstimateConfig(num_gpus=2), sizes(trainable=1280, lora=lora))["components"]
    assert p2["gradients"] == 2 * 640 + 2 * 640  # partition + one whole tensor at a partition edge
    # ZeRO-3 keeps tensors below the persistence threshold (10 x hidden = 640) whole
    p3 = plan(c, ZERO[3], EstimateConfig(num_gpus=2), sizes(trainable=1280, lora=lora))["components"]
    assert p3["ar_weights"] == 2 * (500 + 5 + 2000) + 2 * 10
    # full fine-tuning with beta > 0 keeps a sharded frozen reference
    full = plan(
        cfg("lora=null", "grpo.beta=0.04", "optimizer.name=adamw"), ZERO[3], EstimateConfig(num_gpus=2), sizes(5010)
    )
    assert full["components"]["reference"] == full["components"]["ar_weights"]
    off = json.loads((ROOT / "ds_configs" / "zero3_offload.json").read_text())
    po = plan(cfg("lora=null", "grpo.beta=0", "optimizer.name=adamw"), off, EstimateConfig(num_gpus=2), sizes(5010))
    assert po["components"]["optimizer_states"] == 0 and po["components"]["master_weights"] == 0
    assert po["host_bytes"] == {"master_weights": 4 * 2505, "optimizer_states": 8 * 2505 + 4}


def test_activations_checkpointing_and_total():
    c = cfg("batch.micro_batch_size=2", "rollout.height=64", "rollout.width=64")
    on = plan(c, ZERO[3], EstimateConfig(num_gpus=1, prompt_tokens=10), sizes(1280, [640, 640]))
    off = plan(
        cfg("batch.micro_batch_size=2", "rollout.height=64", "rollout.width=64", "model.gradient_checkpointing=false"),
        ZERO[3],
        EstimateConfig(num_gpus=1, prompt_tokens=10),
        sizes(1280, [640, 640]),
    )
    seq = 10 + grid_tokens(64, 64)
    per_layer = 8 * 64 + 2 * 32 + 4 * 160
    assert on["components"]["activations"] == 2 * seq * (4 * 64 + per_layer) * 2
    assert off["components"]["activations"] == 2 * seq * 4 * per_layer * 2
    comp = on["components"]
    assert on["total_bytes"] == sum(comp[k] for k in on["persistent"]) + max(on["phases"].values())
    assert on["phases"]["rollout"] == comp["rollout_kv_cache"] + comp["rollout_gather"]


@pytest.mark.slow
def test_cli_json_and_over_budget_warning(tiny_model_dir, tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "glm_grpo_ds.commands.cli",
        "estimate-memory",
        "--config",
        str(ROOT / "launch/configs/tiny_cpu.yaml"),
        "--deepspeed",
        str(ROOT / "ds_configs/zero3.json"),
        "--num-gpus",
        "2",
        "--json",
        f"model.path={tiny_model_dir}",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    obj = json.loads(out.stdout)
    assert obj["total_bytes"] > 0 and obj["ar_weights"] > 0 and "WARNING" not in out.stderr
    tiny = subprocess.run(cmd + ["--gpu-memory-gb", "0.5"], capture_output=True, text=True)
    assert tiny.returncode == 0 and "WARNING: the plan needs" in tiny.stderr
    bad = subprocess.run(cmd[:-1] + ["lora.alfa=4"], capture_output=True, text=True)
    assert bad.returncode == 2 and "did you mean" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.parametrize("name", ["glm_image_lora_zero3.yaml", "glm_image_full_zero3.yaml"])
def test_real_glm_image_plan_fits_8x80(name):
    """The example configs fit 8 x 80 GB by the plan (real GLM-Image sizes from the built-in configs)."""
    c = load_config(ROOT / "launch" / "configs" / name, [])
    p = plan(c, ZERO[3], EstimateConfig(num_gpus=8, gpu_memory_gb=80))
    assert 9e9 < sum(p["components"].values()) and p["total_bytes"] < 80 * GIB


def test_host_ram_per_node_by_hand():
    offload = json.loads((ROOT / "ds_configs" / "zero3_offload.json").read_text())
    c = cfg("optimizer.name=adamw", "decoder.offload=true", "decoder.dtype=bf16")
    p = plan(c, offload, EstimateConfig(num_gpus=4), sizes(2000, lora=[1000, 1000]))
    h = p["host_node"]
    rank = 3 * GIB + 1 * GIB + p["host_bytes"]["master_weights"] + p["host_bytes"]["optimizer_states"] + 500 * 2
    assert h["ranks"] == 4 and h["per_rank"]["decoder_offloaded"] == 500 * 2 and sum(h["per_rank"].values()) == rank
    assert h["steady_bytes"] == 4 * rank and h["loading_peak_bytes"] == 4 * rank + 4 * 4000 * 4  # one fp32 tensor
    assert h["request_bytes"] == 32 * GIB  # 16 GiB x 1.25 rounded up to 16 GiB steps
    assert h["page_cache_bytes"] == (5010 + 500) * 2
    from glm_grpo_ds.memory_plan import format_plan

    assert "host RAM per node (4 ranks): steady 16.0 GiB" in format_plan(p) and "--mem=32G" in format_plan(p)
    on_cpu = plan(c, offload, EstimateConfig(num_gpus=4, device="cpu"), sizes(2000, lora=[1000, 1000]))
    assert on_cpu["host_node"]["per_rank"]["process"] == 0


def test_slurm_asks_for_the_planned_host_memory():
    """launch/slurm.sbatch's --mem is the planner's request for its default run: the LoRA config, ZeRO-3,
    8 GPUs per node (real GLM-Image sizes from the built-in configs)."""
    import re

    c = load_config(ROOT / "launch" / "configs" / "glm_image_lora_zero3.yaml", [])
    want = plan(c, ZERO[3], EstimateConfig(num_gpus=8))["host_node"]["request_bytes"] // GIB
    found = re.findall(r"^#SBATCH --mem=(\d+)G\b", (ROOT / "launch" / "slurm.sbatch").read_text(), re.M)
    assert found == [str(want)], (found, want)
