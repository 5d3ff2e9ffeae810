"""`glm-grpo estimate-memory` as a user runs it (in-process, the real GLM-Image sizes from the built-in
configs): every default in --help, the reward models in the printed plan, exit 3 when the plan does not
fit unless --allow-over-budget, exit 2 on a bad config."""

import argparse
import json
from pathlib import Path

from glm_grpo_ds.commands import estimate_memory

ROOT = Path(__file__).resolve().parents[2]
RUN = [
    "--config",
    str(ROOT / "launch/configs/glm_image_lora.yaml"),
    "--deepspeed",
    str(ROOT / "ds_configs/zero3.json"),
]


def test_help_shows_every_default():
    """Every option with a default says it in --help (store_true flags: "off")."""
    ap = estimate_memory.build_parser()
    text = " ".join(ap.format_help().split())
    with_defaults = [
        a for a in ap._actions if a.option_strings and a.default not in (None, argparse.SUPPRESS) and a.dest != "help"
    ]
    assert {a.dest for a in with_defaults} == {
        "num_gpus",
        "num_nodes",
        "gpu_memory_gb",
        "prompt_tokens",
        "device",
        "json",
        "allow_over_budget",
    }
    for action in with_defaults:
        shown = "off" if action.default is False else str(action.default)
        assert f"{action.option_strings[0]}" in text and f"(default: {shown}" in " ".join(
            (action.help % {"default": action.default} if "%(default)" in action.help else action.help).split()
        ), action.dest
    assert "(default: 8)" in text and "(default: 80.0)" in text and "(default: 128)" in text


def test_fits_exit_0_and_names_the_reward_models(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)  # paths are shown relative to the working directory
    assert estimate_memory.main(RUN + ["--num-gpus", "8"]) == 0
    out, err = capsys.readouterr()
    assert "WARNING" not in err
    # the LoRA config's rewards: ocr on the CPU, aesthetic's CLIP ViT-L/14 + head on every GPU
    assert "reward models (the config's rewards" in out and "cpu: RapidOCR" in out
    assert "aesthetic" in out and "CLIP 427.6M fp32" in out and "whole on every GPU: aesthetic" in out
    # the plan's last line: the fastest shipped DeepSpeed config that fits (ZeRO-2 at 8 x 80 GiB), the README's
    # recommended stage; the line before it: the step's planned time, the image decode included
    assert out.splitlines()[-1].startswith("fastest that fits: ds_configs/zero2.json (ZeRO-2, 44.5 GiB of 80)")
    timed = out.splitlines()[-2]
    assert timed.startswith("planned time per step on one H200: ~181 s = rollout 24.7 s + image decode 136.6 s")
    decode = "16 images x 60 DiT forwards (30 steps, 30 guided) - 15 (the first unconditional pass once per group)"
    assert f"{decode} x 0.1445 s" in timed and "not counted: rewards" in timed
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert "--deepspeed ds_configs/zero2.json data.train_file=/data/prompts.jsonl" in readme


def test_over_budget_exits_3_unless_allowed(capsys):
    assert estimate_memory.main(RUN + ["--gpu-memory-gb", "10", "--json"]) == estimate_memory.OVER_BUDGET == 3
    out, err = capsys.readouterr()
    obj = json.loads(out)
    assert (
        obj["fits"] is False
        and obj["headroom_bytes"] < 0
        and [r["name"] for r in obj["rewards"]]
        == [
            "ocr",
            "aesthetic",
        ]
    )
    assert "WARNING: the plan needs" in err and "exit 3" in err
    assert estimate_memory.main(RUN + ["--gpu-memory-gb", "10", "--allow-over-budget"]) == 0
    assert "WARNING: the plan needs" in capsys.readouterr().err


def test_bad_config_exits_2(capsys):
    assert estimate_memory.main(RUN + ["lora.alfa=4"]) == 2
    err = capsys.readouterr().err
    assert "did you mean" in err and "Traceback" not in err
    # a reward it cannot name is no plan either (its model is counted)
    assert estimate_memory.main(RUN + ["rewards=[{name: aesthetc}]"]) == 2
    assert "rewards[0].name: unknown reward 'aesthetc'; did you mean aesthetic" in capsys.readouterr().err


def _fastest(capsys, config: str, ds: str, gpus: int, *extra: str) -> tuple[int, dict]:
    argv = ["--config", str(ROOT / "launch/configs" / config), "--deepspeed", str(ROOT / "ds_configs" / ds)]
    code = estimate_memory.main(argv + ["--num-gpus", str(gpus), "--gpu-memory-gb", "80", "--json", *extra])
    return code, json.loads(capsys.readouterr().out)["fastest_that_fits"]


def test_names_the_fastest_zero_stage_that_fits(capsys, monkeypatch):
    """The same run planned at every ds_configs/*.json: ZeRO-0/1/2 before ZeRO-3, no offload before offload, the
    smaller plan within a class; the exit status is still the given config's."""
    monkeypatch.chdir(ROOT)  # paths are shown relative to the working directory
    # the LoRA config on one 80 GiB GPU: ZeRO-2 fits (45.7 GiB), so ZeRO-3 is not the fastest; 8-bit AdamW
    # refuses the offloaded optimizer of zero3_offload.json
    code, f = _fastest(capsys, "glm_image_lora.yaml", "zero3.json", 1)
    assert code == 0 and f["deepspeed"].endswith("ds_configs/zero2.json") and not f["given_is_fastest"]
    assert f["line"].startswith("fastest that fits: ds_configs/zero2.json (ZeRO-2, 45.7 GiB of 80); ZeRO-3 gathers")
    assert "the update 4.85 s at ZeRO-2 against 20.2 s at ZeRO-3" in f["line"]
    assert "8-bit" in next(r for r in f["candidates"] if r["deepspeed"].endswith("zero3_offload.json"))["refused"]
    code, f = _fastest(capsys, "glm_image_lora.yaml", "zero1.json", 1)  # ZeRO-1: ZeRO-2's speed class
    assert code == 0 and f["given_is_fastest"] and f["line"] == "fastest that fits: this one (ZeRO-1, 46.6 GiB of 80)"
    # full fine-tuning of the 10.1 B AR on 8 GPUs: ZeRO-2 needs 85.0 GiB, so ZeRO-3 is the one; a given ZeRO-2
    # does not fit (exit 3) and the line names ZeRO-3
    code, f = _fastest(capsys, "glm_image_full.yaml", "zero2.json", 8)
    assert code == 3 and f["deepspeed"].endswith("ds_configs/zero3.json")
    assert "(ZeRO-3, 54.4 GiB of 80); this one does not fit; nothing faster fits: " in f["line"]
    # ... and on one 80 GiB GPU only with offload: offload_param puts the weights', the reference's and (with
    # offload_optimizer) the gradients' partitions on the host (81.8 GiB planned before the planner read it)
    code, f = _fastest(capsys, "glm_image_full.yaml", "zero3.json", 1, "--allow-over-budget")
    assert code == 0 and f["deepspeed"].endswith("ds_configs/zero3_offload.json") and not f["given_is_fastest"]
    assert f["line"].startswith("fastest that fits: ds_configs/zero3_offload.json (ZeRO-3 + offload, 35.2 GiB of 80);")
    # ... and on one 32 GiB GPU nothing does
    code, f = _fastest(capsys, "glm_image_full.yaml", "zero3.json", 1, "--allow-over-budget", "--gpu-memory-gb", "32")
    assert code == 0 and f["deepspeed"] is None and not f["given_is_fastest"]
    assert f["line"] == (
        "fastest that fits: none at 32 GiB per GPU (the smallest plan: ds_configs/zero3_offload.json, "
        "ZeRO-3 + offload, 35.2 GiB)"
    )


def test_the_planned_rollout_reads_the_prompt_tokens_of_the_kv_cache(capsys):
    """--prompt-tokens sizes the KV cache the planned decode step reads: longer prompts, a slower planned rollout."""
    times = []
    for tokens in ("128", "4096"):
        argv = ["--config", str(ROOT / "launch/configs/glm_image_lora.yaml"), "--deepspeed"]
        argv += [str(ROOT / "ds_configs/zero2.json"), "--num-gpus", "8", "--json", "--prompt-tokens", tokens]
        assert estimate_memory.main(argv) == 0
        times.append(json.loads(capsys.readouterr().out)["step_time"]["rollout_s"])
    assert times[1] > times[0]


def test_over_budget_names_each_setting_that_plans_less_with_its_saving(capsys):
    """The shipped LoRA config at ZeRO-2 on 8 GPUs of 44 GiB (it plans 44.5): each change of this run planned again
    alone, largest saving first, with whether it fits alone. Not the fixed list it printed (it told a LoRA run to use
    LoRA and named decoder.offload, which saves nothing where the decode is the peak); every figure is the
    planner's own."""
    from glm_grpo_ds.config import load_config
    from glm_grpo_ds.ds.ds_config import read_ds_config
    from glm_grpo_ds.memory.levers import candidate_changes
    from glm_grpo_ds.memory.plan import GIB, EstimateConfig, plan
    from glm_grpo_ds.memory.sizes import model_sizes

    config, zero2 = str(ROOT / "launch/configs/glm_image_lora.yaml"), str(ROOT / "ds_configs/zero2.json")
    assert estimate_memory.main(["--config", config, "--deepspeed", zero2, "--gpu-memory-gb", "44"]) == 3
    err = capsys.readouterr().err
    cfg = load_config(config, [])
    est, raw = EstimateConfig(8, 1, 44.0), read_ds_config(zero2)
    sizes = model_sizes(cfg)
    given = plan(cfg, raw, est, sizes)
    saved = {}
    for change, _ in candidate_changes(cfg, given):
        p = plan(load_config(config, [change]), raw, est, sizes)
        saved[change] = ((given["total_bytes"] - p["total_bytes"]) / GIB, p["headroom_bytes"] >= 0)
    assert "model.gradient_checkpointing=true" not in saved  # on already
    assert "decoder.offload=true" in saved and "decoder.offload=true -" not in err  # saves nothing at a decode peak
    named = [c for c, (gib, _) in sorted(saved.items(), key=lambda kv: -kv[1][0]) if gib >= 0.05]
    assert named and err.index(named[0]) < err.index(named[-1])
    for change in named:
        gib, fits = saved[change]
        assert f"{change} -{gib:.1f} GiB{' (fits alone)' if fits else ''}: " in err, (change, err)
    assert "use LoRA" not in err


def test_a_smaller_batch_lever_keeps_the_micro_batch_a_divisor_of_the_sequences():
    """Halving was offered blindly: micro 5 of 10 sequences became 2 (refused by the config: the change vanished);
    2 prompts x G=8 at micro 16 down to 1 prompt left micro 16 above its 8 sequences."""
    from glm_grpo_ds.config import load_config
    from glm_grpo_ds.memory.levers import candidate_changes

    base = ["model.path=/m", "data.train_file=/d.jsonl", "rewards=[{name: pixel_mse}]"]
    cfg = load_config(None, [*base, "grpo.group_size=5", "batch.prompts_per_rank=2", "batch.micro_batch_size=5"])
    changes = dict(candidate_changes(cfg, {"rewards": []}))
    assert "batch.micro_batch_size=2" in changes and "batch.prompts_per_rank=1" in changes  # 10 = 2 x 5; 5 of 5
    cfg = load_config(None, [*base, "grpo.group_size=8", "batch.prompts_per_rank=2", "batch.micro_batch_size=16"])
    changes = dict(candidate_changes(cfg, {"rewards": []}))
    assert "batch.micro_batch_size=8" in changes and "batch.prompts_per_rank=1 batch.micro_batch_size=8" in changes
    for change in changes:  # each loads: none is dropped by the config's own check
        load_config(None, [*base, "grpo.group_size=8", "batch.prompts_per_rank=2", "batch.micro_batch_size=16",
                           *change.split()])  # fmt: skip
    # with mini-batches a micro-batch divides a mini-batch's sequences: G=12 in 2 mini-batches of 6 at micro 6 -> 3
    # (4 divides 12, not 6, and was refused by the config, the lever dropped without a word)
    given = [
        *base,
        "grpo.group_size=12",
        "batch.prompts_per_rank=2",
        "batch.micro_batch_size=6",
        "batch.mini_batches=4",
    ]
    changes = dict(candidate_changes(load_config(None, given), {"rewards": []}))
    assert "batch.micro_batch_size=3" in changes and "batch.prompts_per_rank=1 batch.micro_batch_size=3" in changes
    for change in changes:
        load_config(None, [*given, *change.split()])
