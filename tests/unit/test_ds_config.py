"""ds_configs: "auto" filled from the TrainConfig, unknown "auto" and bad combinations refused."""

import json
from pathlib import Path

import pytest
import torch

from glm_grpo_ds.config import load_config
from glm_grpo_ds.ds.ds_config import DeepSpeedConfigError, fill_ds_config, read_ds_config

ROOT = Path(__file__).resolve().parents[2]
CFG = load_config(
    None,
    [
        "model.path=/m",
        "data.train_file=/d.txt",
        "rewards=[{name: pixel_mse}]",
        "batch.prompts_per_rank=2",
        "grpo.group_size=8",
        "batch.micro_batch_size=4",
        "optimizer.max_grad_norm=0.5",
    ],
)


@pytest.mark.parametrize("name", ["zero1.json", "zero2.json", "zero3.json"])
def test_shipped_configs_fill(name):
    ds = fill_ds_config(
        read_ds_config(ROOT / "ds_configs" / name), CFG, world_size=4, hidden_size=64, dtype=torch.bfloat16
    )
    assert ds["train_micro_batch_size_per_gpu"] == 4
    assert ds["gradient_accumulation_steps"] == 4  # 2 prompts x G=8 = 16 sequences / 4
    assert ds["train_batch_size"] == 4 * 4 * 4
    assert ds["gradient_clipping"] == 0.5 and ds["bf16"]["enabled"] is True
    assert "auto" not in json.dumps(ds)
    if name == "zero3.json":
        z = ds["zero_optimization"]
        assert z["reduce_bucket_size"] == 64 * 64 and z["stage3_param_persistence_threshold"] == 640


def test_unknown_auto_is_refused():
    with pytest.raises(DeepSpeedConfigError, match=r'"auto" is not supported for optimizer.params.lr'):
        fill_ds_config({"optimizer": {"params": {"lr": "auto"}}}, CFG, 1, 64, torch.float32)


def test_explicit_batch_key_must_agree():
    with pytest.raises(DeepSpeedConfigError, match="train_micro_batch_size_per_gpu=2 disagrees"):
        fill_ds_config({"train_micro_batch_size_per_gpu": 2}, CFG, 1, 64, torch.float32)


def test_8bit_optimizer_with_offload_is_a_clear_error():
    raw = read_ds_config(ROOT / "ds_configs" / "zero3_offload.json")
    with pytest.raises(DeepSpeedConfigError, match="adamw_8bit with zero_optimization.offload_optimizer"):
        fill_ds_config(raw, CFG, 1, 64, torch.bfloat16)
    adamw = load_config(
        None, ["model.path=/m", "data.train_file=/d.txt", "rewards=[{name: pixel_mse}]", "optimizer.name=adamw"]
    )
    ds = fill_ds_config(raw, adamw, 1, 64, torch.bfloat16)
    assert ds["optimizer"]["type"] == "AdamW"  # DeepSpeed's CPU Adam runs the offloaded optimizer


def test_invalid_json_names_file_and_position(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"zero_optimization": {"stage": 3,}}')
    with pytest.raises(DeepSpeedConfigError, match=r"bad.json is not valid JSON: .* at line 1, column \d+"):
        read_ds_config(bad)
