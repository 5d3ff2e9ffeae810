"""The GRPO trainer under real DeepSpeed: 2 CPU ranks over gloo, real peft, real bitsandbytes,
the tiny GLM-Image pipeline. Each test launches `deepspeed --num_gpus N` on tests/integration/ds_worker.py
or on the trainer module itself."""

import pytest
import torch
from launching import common, worker  # noqa: E402  (tests/integration/launching.py)
from run_files import metrics  # noqa: E402  (tests/run_files.py)

pytestmark = [pytest.mark.slow, pytest.mark.distributed]  # 2-rank DeepSpeed jobs


# each run samples through one of the fast exact rollouts (a run of its own each cost ~40 s of a 2-core machine)
@pytest.mark.parametrize("ds_config,option", [("zero2.json", "merge_lora"), ("zero3.json", "fuse_lora")])
def test_lora_8bit_checkpointing_trains_only_the_adapter(ds_config, option, tiny_model_dir, tiny_data, tmp_path):
    """LoRA, 8-bit AdamW and gradient checkpointing on 2 ranks train the adapter alone. The rollouts sample with
    rollout.merge_lora under ZeRO-2 (the base restored from its copy) and rollout.fuse_lora under ZeRO-3 (the
    fused path reads the adapters inside the rollout's gather): the base stays bitwise what it was, and step 2's
    rollout (adapter B != 0 after step 1 at lr 1e-2) samples the trained policy, its sampler log-probs the
    trainer's unmerged ones to fp32 rounding (a path that left the adapters out: ~0.8). rollout.merge_lora under
    ZeRO-3: test_merged_lora_rollout_zero3_leaves_the_base_bitwise_and_samples_the_trained_adapter."""
    run_dir = tmp_path / "run"
    overrides = common(
        tiny_model_dir,
        tiny_data,
        run_dir,
        "max_steps=2",
        "rollout.height=64",
        "rollout.width=64",
        f"rollout.{option}=true",
        "optimizer.name=adamw_8bit",
        "optimizer.lr=1e-2",
        "model.gradient_checkpointing=true",
        "grpo.beta=0.04",
    )
    r = worker(2, "train", tmp_path / "w", ds_config, overrides)
    assert r["is_lora"]
    changed = [n for n in r["trainable_before"] if not torch.equal(r["trainable_before"][n], r["trainable_after"][n])]
    assert changed and all("lora_" in n for n in r["trainable_before"])
    assert any("lora_B" in n for n in changed)
    assert r["regather_disagrees"] == [], "gathers of unchanged frozen weights disagree (DeepSpeed < 0.19.8 on gloo)"
    for name, before in r["base_before"].items():
        assert before.numel() > 0, f"{name} was not gathered"
        assert torch.equal(before, r["base_after"][name]), f"base parameter {name} changed"
    assert torch.equal(r["ref_before"], r["ref_after"])  # adapters disabled == untouched base model

    rows = metrics(run_dir)
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        for key in (
            "loss",
            "reward_mean",
            "reward_std",
            "kl",
            "reward/pixel_mse",
            "clip_frac_low",
            "clip_frac_high",
            "ratio_mean",
            "grad_norm",
            "lr",
            "time/rollout",
            "time/decode",
            "time/reward",
            "time/update",
            "rollout_tokens_per_s",
            "peak_rss_mb",
        ):
            assert key in row and row[key] is not None, key
        assert torch.isfinite(torch.tensor(row["loss"]))
        # one update per rollout: the ratio is exactly 1 and nothing is clipped
        assert row["ratio_min"] == row["ratio_max"] == 1.0
        assert row["clip_frac_low"] == row["clip_frac_high"] == 0.0
    assert rows[1]["mismatch/logp_abs_max"] < 1e-4  # step 2 samples the trained adapter (4.8e-7 measured)
    adapter = run_dir / "final_adapter"
    assert (adapter / "adapter_config.json").is_file()
    from safetensors.torch import load_file

    weights = load_file(adapter / "adapter_model.safetensors")
    assert weights and all(t.numel() > 0 for t in weights.values())  # never empty under ZeRO-3
    assert (run_dir / "reward_curve.png").stat().st_size > 1000


def test_full_finetuning_with_frozen_reference_engine_zero3(tiny_model_dir, tiny_data, tmp_path):
    run_dir = tmp_path / "run"
    overrides = common(
        tiny_model_dir,
        tiny_data,
        run_dir,
        "lora=null",
        "max_steps=2",
        "rollout.height=64",
        "rollout.width=64",
        "grpo.beta=0.1",
        "optimizer.name=adamw",
        "optimizer.lr=1e-3",
    )
    r = worker(2, "train", tmp_path / "w", "zero3.json", overrides)
    assert not r["is_lora"]
    assert any(not torch.equal(r["trainable_before"][n], r["trainable_after"][n]) for n in r["trainable_before"])
    assert any(n.startswith("lm_head") for n in r["trainable_before"])
    for name, before in r["base_before"].items():  # vision tower and VQ model stay frozen
        assert torch.equal(before, r["base_after"][name]), name
    assert torch.equal(r["ref_before"], r["ref_after"])  # the reference engine never moves
    assert (run_dir / "final_model" / "config.json").is_file()
    rows = metrics(run_dir)
    assert rows[-1]["kl"] > 0  # after one update the policy differs from the reference


def _rel_close(a: torch.Tensor, b: torch.Tensor, rel: float) -> bool:
    return (a - b).norm().item() <= rel * max(a.norm().item(), b.norm().item(), 1e-30)


@pytest.mark.parametrize("lora,ds_config", [("lora", "zero3.json"), ("full", "zero3.json"), ("lora", "zero2.json")])
def test_gradients_do_not_depend_on_micro_batch_size(lora, ds_config, tiny_model_dir, tiny_data, tmp_path):
    overrides = common(
        tiny_model_dir,
        tiny_data,
        tmp_path / "run",
        "rollout.height=64",
        "rollout.width=64",
        "batch.prompts_per_rank=1",
        "grpo.group_size=8",
        "grpo.beta=0.04",
        "grpo.num_iterations=2",  # the second iteration's statistics are the moved policy's
        "optimizer.name=adamw",
    )
    if lora == "full":
        overrides.append("lora=null")
    r = worker(2, "grads", tmp_path / "w", ds_config, overrides, extra=["--micro-batch-sizes", "1,2,8"])
    ref = r[8]
    nonzero = [n for n, g in ref["grads"].items() if g is not None and g.abs().sum() > 0]
    assert nonzero
    for m in (1, 2):
        # with ratio 1 the surrogate is -mean(A) ~ 0 (advantages are zero-mean): compare absolutely
        assert r[m]["loss"] == pytest.approx(ref["loss"], rel=1e-5, abs=1e-6)
        for n in nonzero:
            # fp32 summation order: up to 2.4e-5 of a gradient's norm on an AMD EPYC (2026-12-01; under 1e-5 on the
            # Xeons before); a wrong normaliser or DeepSpeed's 1/accumulation left on is off by 1/2 and more
            assert _rel_close(r[m]["grads"][n], ref["grads"][n], 1e-4), (m, n)
        first = r[m]["iterations"][0]
        assert (
            first["ratio_min"] == first["ratio_max"] == 1.0 and first["clip_frac_low"] == first["clip_frac_high"] == 0.0
        )
        # each iteration's logged statistics: token-weighted over the micro-batches, extremes over all of them
        for it, (got, want) in enumerate(zip(r[m]["iterations"], ref["iterations"])):
            for key in ("kl", "entropy", "ratio_mean", "ratio_min", "ratio_max", "clip_frac_low", "clip_frac_high"):
                assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), (m, it, key)
    assert ref["iterations"][1]["ratio_max"] > 1.0 > ref["iterations"][1]["ratio_min"]  # the policy moved


ESTIMATORS = ("batch", "rloo")  # batch: one std over the global batch; rloo: leave-one-out within each group


def test_same_rollouts_same_loss_and_gradients_on_one_and_two_ranks(tiny_model_dir, tiny_data, tmp_path):
    """The same global rollout (2 groups of 4) trained on 1 rank or split over 2 gives the same advantages, loss,
    gradients and logged statistics (two iterations: the second's ratios are not 1), for each advantage estimator in
    ESTIMATORS (a Trainer each, one launch per world size). Every rank
    holds only its own share of the rewards and gets its advantages the trainer's way (ds_worker.trainer_advantages:
    all_gather, combine_advantages with the configured estimator over the global batch, this rank's slice), so a
    gather out of rank order or an estimator over one rank's rewards (batch's std) shows up as different advantages
    and gradients on 2 ranks."""
    base = common(
        tiny_model_dir,
        tiny_data,
        tmp_path / "run",
        "rollout.height=64",
        "rollout.width=64",
        "grpo.group_size=4",
        "batch.micro_batch_size=2",
        "grpo.beta=0.04",
        "grpo.num_iterations=2",  # the second iteration's ratios and clips are the moved policy's, not 1 and 0
        "optimizer.name=adamw",
    )
    sets = ["--option-sets", ";".join(f"grpo.advantage_estimator={e}" for e in ESTIMATORS)]
    one = worker(1, "dp", tmp_path / "w1", "zero3.json", base + ["batch.prompts_per_rank=2"], extra=sets)
    two = worker(2, "dp", tmp_path / "w2", "zero3.json", base + ["batch.prompts_per_rank=1"], extra=sets)
    assert not torch.allclose(one[0]["advantages"], one[1]["advantages"])  # the configured estimator is the one used
    for i, estimator in enumerate(ESTIMATORS):
        torch.testing.assert_close(
            two[i]["advantages"], one[i]["advantages"], rtol=1e-6, atol=1e-7, msg=lambda m, e=estimator: f"{e}: {m}"
        )
        assert two[i]["loss"] == pytest.approx(one[i]["loss"], rel=1e-5, abs=1e-6), estimator
        nonzero = [n for n, g in one[i]["grads"].items() if g is not None and g.abs().sum() > 0]
        assert nonzero, estimator
        for n in nonzero:
            assert _rel_close(two[i]["grads"][n], one[i]["grads"][n], 1e-5), (estimator, n)
        # what metrics.jsonl logs of the update (reduced over the ranks as the step record reduces it) too
        for key, value in one[i]["record"].items():
            assert two[i]["record"][key] == pytest.approx(value, rel=1e-5, abs=1e-7), (estimator, key)
        assert one[i]["record"]["ratio_max"] > 1.0 > one[i]["record"]["ratio_min"]  # the policy moved in iteration 2


def test_sharded_rollout_equals_gathered_rollout_zero3(tiny_model_dir, tiny_data, tmp_path):
    overrides = common(
        tiny_model_dir,
        tiny_data,
        tmp_path / "run",
        "rollout.height=32",
        "rollout.width=32",
        "grpo.group_size=2",
        "batch.micro_batch_size=2",
    )
    r = worker(2, "sharded", tmp_path / "w", "zero3.json", overrides)
    assert torch.equal(r["gathered"][0], r["sharded"][0]) and torch.equal(r["gathered"][0], r["again"][0])
    torch.testing.assert_close(r["gathered"][1], r["sharded"][1], rtol=0, atol=1e-5)


def test_num_iterations_two_first_ratio_is_one(tiny_model_dir, tiny_data, tmp_path):
    overrides = common(
        tiny_model_dir,
        tiny_data,
        tmp_path / "run",
        "rollout.height=64",
        "rollout.width=64",
        "grpo.num_iterations=2",
        "optimizer.name=adamw",
        "optimizer.lr=1e-2",
    )
    r = worker(2, "grads", tmp_path / "w", "zero3.json", overrides, extra=["--micro-batch-sizes", "4"])
    first, second = r[4]["iterations"]
    assert first["ratio_min"] == first["ratio_max"] == 1.0
    assert second["ratio_max"] != 1.0 or second["ratio_min"] != 1.0  # the update moved the policy


def test_mini_batches_are_the_updates_of_their_halves_one_after_the_other(tiny_model_dir, tiny_data, tmp_path):
    """batch.mini_batches=2 on a 2-prompt rollout: its two optimizer steps' gradients and the weights after equal a
    twin's two updates, of the first half of each group's samples and then of the second halves, the second with
    the pre-update log-probs as the old ones (its ratios off 1: the second step trains off-policy). A mini-batch
    normalised over the whole rollout (half the gradient), of whole prompts, or with old log-probs taken after the
    first step (ratio 1), would differ."""
    overrides = common(
        tiny_model_dir, tiny_data, tmp_path / "run", "rollout.height=64", "rollout.width=64", "grpo.group_size=4",
        "batch.micro_batch_size=2", "optimizer.name=adamw", "optimizer.lr=3e-2", "grpo.beta=0",
    )  # fmt: skip
    r = worker(1, "minibatch", tmp_path / "w", "zero2.json", overrides)
    split, twin = r["split"], r["twin"]
    assert len(split["steps"]) == len(twin["steps"]) == 2
    for a, b in zip(split["steps"], twin["steps"]):
        assert a.keys() == b.keys()
        for n in a:
            torch.testing.assert_close(a[n], b[n], rtol=1e-5, atol=1e-7)
    for n in split["weights"]:
        torch.testing.assert_close(split["weights"][n], twin["weights"][n], rtol=1e-5, atol=1e-7)
    first, second = split["stats"][0]["iterations"]
    assert first["ratio_min"] == first["ratio_max"] == 1.0 and second["ratio_max"] > 1.0 + 1e-4, second
    assert split["stats"][0]["iterations"][1]["ratio_max"] == twin["stats"][1]["ratio_max"]


def test_merged_lora_rollout_zero3_leaves_the_base_bitwise_and_samples_the_trained_adapter(
    tiny_model_dir, tiny_data, tmp_path
):
    """rollout.merge_lora in training under ZeRO-3, 2 ranks: the gathered weights it merges into are discarded with
    the gather (glm_grpo_ds/ds/gathering.py gather_discards_writes), so the base is bitwise what it was, and step 2's
    rollout (adapter B != 0 after step 1) samples the trained policy: its sampler log-probs equal the trainer's
    unmerged ones to fp32 rounding (4.8e-7 measured; a merge that left the adapters out: 0.82). The reference and
    the old log-probs (two iterations) are computed from the base gathered again: from the buffers the merge wrote
    into, step 2's first-iteration ratios were 0.77-1.27 (the adapter counted twice) and the reference was the
    policy. merge_lora under ZeRO-2 and fuse_lora under ZeRO-3: test_lora_8bit_checkpointing_trains_only_the_adapter."""
    run_dir = tmp_path / "run"
    overrides = common(
        tiny_model_dir,
        tiny_data,
        run_dir,
        "max_steps=2",
        "rollout.height=64",
        "rollout.width=64",
        "rollout.merge_lora=true",
        "optimizer.name=adamw",
        "optimizer.lr=1e-2",
        "grpo.beta=0.04",
        "grpo.num_iterations=2",
    )
    r = worker(2, "train", tmp_path / "w", "zero3.json", overrides)
    assert any(not torch.equal(b, r["trainable_after"][n]) for n, b in r["trainable_before"].items())
    for name, before in r["base_before"].items():
        assert torch.equal(before, r["base_after"][name]), f"base parameter {name} changed"
    rows = metrics(run_dir)
    # the old log-probs (two iterations) and the reference are computed from the base, not from the buffers the
    # merge wrote W + sBA into: at step 2 they read W + 2sBA (ratio != 1) and the policy (kl ~ 0)
    assert [row["first_iteration_ratio_min"] == row["first_iteration_ratio_max"] == 1.0 for row in rows] == [True] * 2
    assert rows[1]["mismatch/logp_abs_max"] < 1e-4
