"""ds_configs: "auto" filled from the TrainConfig (Hugging Face-style optimizer / scheduler sections too),
unknown "auto", values that contradict the training config and bad combinations refused."""

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
    with pytest.raises(DeepSpeedConfigError, match=r'"auto" is not supported for zero_optimization.sub_group_size'):
        fill_ds_config({"zero_optimization": {"sub_group_size": "auto"}}, CFG, 1, 64, torch.float32)


def _adamw(*overrides):
    return load_config(
        None,
        ["model.path=/m", "data.train_file=/d.txt", "rewards=[{name: pixel_mse}]", "optimizer.name=adamw", *overrides],
    )


# The optimizer / scheduler sections of the Hugging Face DeepSpeed integration's examples.
HF_STYLE = {
    "optimizer": {
        "type": "AdamW",
        "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
    },
    "scheduler": {
        "type": "WarmupDecayLR",
        "params": {
            "warmup_min_lr": "auto",
            "warmup_max_lr": "auto",
            "warmup_num_steps": "auto",
            "total_num_steps": "auto",
        },
    },
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_clipping": "auto",
}


def test_hf_style_optimizer_and_scheduler_auto_are_filled_from_the_config():
    cfg = _adamw(
        "optimizer.lr=3e-4", "optimizer.betas=[0.9, 0.95]", "optimizer.weight_decay=0.1", "optimizer.schedule=linear"
    )
    ds = fill_ds_config(HF_STYLE, cfg, 1, 64, torch.float32)
    assert ds["optimizer"] == {
        "type": "AdamW",
        "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1},
    }
    # the trainer's own schedule runs (ds/optimizer.build_scheduler): DeepSpeed must not build the JSON's
    assert "scheduler" not in ds
    assert "auto" not in json.dumps(ds)


def test_json_values_that_contradict_the_config_are_listed_one_per_line():
    raw = {
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.999], "eps": 1e-6, "weight_decay": 0}},
        "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 100, "total_num_steps": "auto"}},
        "gradient_clipping": 0.3,
    }
    with pytest.raises(DeepSpeedConfigError) as err:
        fill_ds_config(raw, _adamw("optimizer.lr=1e-2"), 1, 64, torch.float32, "my_ds.json")
    head, *lines = str(err.value).splitlines()
    assert head.startswith("my_ds.json contradicts the training config")
    assert lines == [
        "gradient_clipping=0.3 but optimizer.max_grad_norm gives 1.0",
        "optimizer.params.lr=0.0003 but optimizer.lr=0.01",
        "optimizer.params.eps=1e-06 but optimizer.eps=1e-08",
        "scheduler.type=WarmupCosineLR but optimizer.schedule=constant: the trainer runs the config's schedule; "
        "remove the JSON's scheduler section (types that match a schedule: WarmupLR (constant), WarmupDecayLR "
        "(linear), WarmupCosineLR (cosine))",
        "scheduler.params.warmup_num_steps=100 but optimizer.warmup_steps = 0",
    ]


def test_json_optimizer_with_an_8bit_config_is_refused():
    with pytest.raises(DeepSpeedConfigError, match=r"optimizer.type=AdamW but optimizer.name=adamw_8bit"):
        fill_ds_config(HF_STYLE, CFG, 1, 64, torch.float32)
    other = {"optimizer": {"type": "Lamb", "params": {"lr": "auto"}}}
    with pytest.raises(DeepSpeedConfigError, match=r"optimizer.type=Lamb but optimizer.name=adamw: use type AdamW"):
        fill_ds_config(other, _adamw(), 1, 64, torch.float32)


def test_precision_that_contradicts_the_model_dtype_is_refused():
    with pytest.raises(DeepSpeedConfigError, match=r"bf16.enabled=true but model.dtype gives false"):
        fill_ds_config({"bf16": {"enabled": True}}, CFG, 1, 64, torch.float32)
    assert fill_ds_config({"bf16": {"enabled": True}}, CFG, 1, 64, torch.bfloat16)["bf16"]["enabled"] is True


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


def test_a_json_refusing_untested_optimizers_is_refused_with_a_bitsandbytes_optimizer_under_zero():
    """DeepSpeed's initialize asserts on zero_allow_untested_optimizer=false with an optimizer outside its tested list
    (bitsandbytes'), under ZeRO only: a traceback after the job queued, past `--check`."""
    raw = {"zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": False}
    with pytest.raises(DeepSpeedConfigError, match=r"^x.json: zero_allow_untested_optimizer=false refuses optimizer"):
        fill_ds_config(raw, CFG, 1, 64, torch.float32, "x.json")
    assert fill_ds_config(raw, _adamw(), 1, 64, torch.float32)["zero_allow_untested_optimizer"] is False  # tested
    stage0 = {"zero_optimization": {"stage": 0}, "zero_allow_untested_optimizer": False}  # no ZeRO: no assert
    assert fill_ds_config(stage0, CFG, 1, 64, torch.float32)["zero_allow_untested_optimizer"] is False


@pytest.mark.parametrize("option", ["compile", "cuda_graph", "merge_lora", "fuse_lora"])
def test_compiled_captured_or_merged_rollout_needs_the_gathered_rollout_under_zero3(option):
    base = ["model.path=/m", "data.train_file=/d.txt", "rewards=[{name: pixel_mse}]", f"rollout.{option}=true"]
    sharded = load_config(None, [*base, "rollout.gather_parameters=false"])
    zero3 = read_ds_config(ROOT / "ds_configs" / "zero3.json")
    with pytest.raises(
        DeepSpeedConfigError, match=f"rollout.{option}=true with ZeRO-3 needs rollout.gather_parameters"
    ):
        fill_ds_config(zero3, sharded, 1, 64, torch.float32)
    fill_ds_config(zero3, load_config(None, base), 1, 64, torch.float32)  # gathered: fine
    fill_ds_config(read_ds_config(ROOT / "ds_configs" / "zero2.json"), sharded, 1, 64, torch.float32)  # no hooks


def test_invalid_json_names_file_and_position(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"zero_optimization": {"stage": 3,}}')
    with pytest.raises(DeepSpeedConfigError, match=r"bad.json is not valid JSON: .* at line 1, column \d+"):
        read_ds_config(bad)


@pytest.mark.parametrize(
    "text, message",
    [
        (
            '{"zero_optimization": {"stage": 2, "offload_optimizer": true}}',
            r"zero_optimization.offload_optimizer must be a JSON object like",
        ),
        (
            '{"zero_optimization": {"stage": 3, "offload_param": "cpu"}}',
            r"zero_optimization.offload_param must be a JSON object",
        ),
        ('{"zero_optimization": 2}', r"zero_optimization must be a JSON object, got 2"),
        ('{"optimizer": "AdamW"}', r'optimizer must be a JSON object, got "AdamW"'),
        ('{"bf16": true}', r"bf16 must be a JSON object, got true"),
        # DeepSpeed reads "3" as ZeRO-3; compared with 3, the text passed the checks of what ZeRO-3 cannot run
        ('{"zero_optimization": {"stage": "3"}}', r'zero_optimization.stage must be the number 0, 1, 2 or 3, got "3"'),
    ],
)
def test_sections_of_the_wrong_kind_are_one_line_naming_the_key(tmp_path, text, message):
    path = tmp_path / "ds.json"
    path.write_text(text)
    with pytest.raises(DeepSpeedConfigError, match=rf"{path}: {message}"):
        read_ds_config(path)


@pytest.mark.parametrize(
    "zero, message",
    [
        ('"stag": 2', r"zero_optimization.stag: not a key DeepSpeed knows \(misspelled\? remove it\)"),
        ('"allgather_bucket_size": "big"', r'zero_optimization.allgather_bucket_size: Input should .* \(got "big"\)'),
        ('"overlap_comm": "maybe"', r"zero_optimization.overlap_comm: Input should be a valid boolean"),
        # a deprecated key beside its replacement: DeepSpeed asserts, which passed every except on the way out
        ('"cpu_offload": true, "offload_optimizer": {"device": "cpu"}', r"zero_optimization: .*cpu_offload"),
    ],
)  # fmt: skip
def test_what_deepspeed_would_refuse_in_zero_optimization_is_one_line_before_anything_runs(tmp_path, zero, message):
    """DeepSpeed's own model of the section reads it (``"auto"`` keys left to the trainer): these passed every check,
    the preflight's included, and failed deepspeed.initialize in a traceback after overwrite_output_dir=true had
    deleted the earlier run; a bucket size of "big" crashed the memory planner itself."""
    path = tmp_path / "ds.json"
    path.write_text('{"zero_optimization": {"stage": 2, "reduce_bucket_size": "auto", ' + zero + "}}")  # auto: ours
    with pytest.raises(DeepSpeedConfigError, match=rf"^{path}: DeepSpeed refuses {message}") as caught:
        read_ds_config(path)
    assert "\n" not in str(caught.value)


def test_a_key_given_twice_is_refused_as_deepspeed_refuses_it_in_a_file(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text('{"zero_optimization": {"stage": 2, "stage": 3}}')  # the second won: ZeRO-3, silently
    with pytest.raises(
        DeepSpeedConfigError,
        match=rf"^{path}: Duplicate keys in DeepSpeed config: \[.stage.\] \(JSON keeps the last silently\): keep one",
    ):
        read_ds_config(path)


def test_an_unreadable_file_is_one_line(tmp_path):
    (tmp_path / "latin1.json").write_bytes('{"comment": "caf\xe9"}'.encode("latin-1"))
    with pytest.raises(DeepSpeedConfigError, match=r"latin1.json cannot be read \(UnicodeDecodeError"):
        read_ds_config(tmp_path / "latin1.json")
    with pytest.raises(DeepSpeedConfigError, match=r"cannot be read \(IsADirectoryError"):
        read_ds_config(tmp_path)


def test_mini_batches_make_more_optimizer_steps_of_fewer_micro_batches():
    """batch.mini_batches=2: each optimizer step accumulates half the rollout's micro-batches, the run has twice the
    optimizer steps (the lr schedule's length), and a split that leaves a part micro-batch is refused in one line."""
    from glm_grpo_ds.config import ConfigError

    base = ["model.path=/m", "data.train_file=/d.txt", "rewards=[{name: pixel_mse}]", "batch.prompts_per_rank=2"]
    base += ["grpo.group_size=8", "batch.micro_batch_size=4", "max_steps=10", "grpo.num_iterations=3"]
    cfg = load_config(None, [*base, "batch.mini_batches=2"])
    ds = fill_ds_config(read_ds_config(ROOT / "ds_configs" / "zero2.json"), cfg, 4, 64, torch.float32)
    assert ds["gradient_accumulation_steps"] == 2 and ds["train_batch_size"] == 4 * 2 * 4  # 16 / 2 / 4
    assert (cfg.updates_per_step, cfg.total_optimizer_steps) == (6, 60)
    assert cfg.old_logprobs_in_rollout and load_config(None, [*base[:-1], "batch.mini_batches=2"]).updates_per_step == 2
    assert not load_config(None, base[:-1]).old_logprobs_in_rollout  # one update per rollout: old = current
    with pytest.raises(ConfigError, match=r"^batch.mini_batches=3 x batch.micro_batch_size=4 must divide the "
                       r"sequences per rank per step \(batch.prompts_per_rank x grpo.group_size = 16\)$"):  # fmt: skip
        load_config(None, [*base, "batch.mini_batches=3"])


@pytest.mark.parametrize(
    "key, meant", [("zero_optimisation", "zero_optimization"), ("bf_16", "bf16"), ("fp_16", "fp16")]
)
def test_a_misspelled_section_deepspeed_would_ignore_is_refused(tmp_path, key, meant):
    """DeepSpeed ignores a top-level key it does not know: "zero_optimisation" without any "auto" in it trained at
    ZeRO-0, the check's line saying ZeRO-0 among its ok lines. DeepSpeed's own names (bfloat16 too) still read."""
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({key: {"stage": 3} if "zero" in key else {"enabled": True}}))
    with pytest.raises(
        DeepSpeedConfigError, match=rf'^{path}: "{key}" is not a key DeepSpeed knows; did you mean "{meant}"'
    ):
        read_ds_config(path)
    for name in ("zero1.json", "zero2.json", "zero3.json", "zero3_offload.json"):
        read_ds_config(ROOT / "ds_configs" / name)
    path.write_text(json.dumps({"bfloat16": {"enabled": True}, "fp16": {"enabled": False}}))
    read_ds_config(path)
