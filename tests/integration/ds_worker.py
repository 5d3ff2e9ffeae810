"""Runs inside real DeepSpeed ranks (launched by tests/integration/test_trainer_deepspeed.py).

    deepspeed --num_gpus 2 tests/integration/ds_worker.py SCENARIO OUT_DIR --deepspeed DS.json [key=value ...]

Scenarios (rank 0 writes OUT_DIR/result.pt):
  train  - record LoRA / base parameters and reference log-probs of a probe batch, train, record again
  grads  - full gradients of one update on a fixed rollout, for several micro-batch sizes
  dp     - per --option-sets entry, loss and gradients of one update on a fixed global rollout split over the ranks,
            each rank's advantages from every rank's share of the rewards as the trainer computes them
  options - per --option-sets entry, the gradients of one update with those loss options on, and of the same loss
            written out by hand (tests/integration/loss_by_hand.py), with every option on and off
  minibatch - one update of a 2-prompt rollout in batch.mini_batches=2, and the same as two updates of each group's
            halves by a twin trainer (the second with the pre-update log-probs): the gradients of each optimizer step,
            the weights
  sharded - the same rollout with ZeRO-3 parameters gathered once and left sharded
  memory - bytes of the model states DeepSpeed holds (testing.model_state) around one update
  before - reference / old log-probs in the rollout's gather vs in the update, and the bytes each gathers
  nonfinite - the real trainer (train.main) with the loss of the last rank made NaN from the
            second step on: exercises the skip / stop logic; exits with train.main's status
  sync   - the real trainer with its engine samplers counting what it asks of them (sample, sync_weights) and
            the optimizer steps, in order
  parts  - one step of a Run built by build_run, and one of a Run put together by hand from a fresh policy engine, a
            sampler and the first run's decoder and rewards: both steps' records
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from loss_by_hand import hand_gradients, shifted_sampler_logps  # tests/integration/loss_by_hand.py

from glm_grpo_ds.advantages import combine_advantages, group_advantages
from glm_grpo_ds.config import load_config
from glm_grpo_ds.ds import dist
from glm_grpo_ds.ds import engine as ds_engine
from glm_grpo_ds.rollout.backends import EngineSampler
from glm_grpo_ds.train import Trainer
from glm_grpo_ds.update import grpo_update, reference_logprobs

GATHER_REPEATS = 50
PROBE_PROMPTS = ["a red cube on a wooden table", "a much longer probe prompt about a lighthouse that says 'HI'"]


def named_full_params(trainer, predicate) -> dict[str, torch.Tensor]:
    model = ds_engine.unwrap(trainer.run.engine)
    named = [(n, p) for n, p in model.named_parameters() if predicate(n, p)]
    with ds_engine.gathered([p for _, p in named], ds_engine.is_zero3(trainer.run.engine)):
        return {n: p.detach().clone().cpu() for n, p in named}


def frozen(name, param) -> bool:
    return not param.requires_grad


def fixed_rollout(trainer, prompts, seed=1234, gather=True):
    """The same rollout on every rank (same prompts, same sampling seed)."""
    sampler = EngineSampler(
        trainer.run.engine,
        trainer.run.processor,
        trainer.run.cfg,
        trainer.run.device,
        gather=gather,
        base_copy=trainer.run.base_copy,
    )
    return sampler.sample(prompts, [seed], trainer.run.cfg.grpo.group_size).batch


def probe_ref_logps(trainer, batch):
    return reference_logprobs(
        trainer.run.engine, trainer.run.ref_engine, batch, trainer.run.cfg, [slice(0, len(batch))]
    ).cpu()


def grads_of_update(trainer, batch, advantages):
    named = [(n, p) for n, p in ds_engine.unwrap(trainer.run.engine).named_parameters() if p.requires_grad]
    captured = {}

    def on_boundary(engine):
        for n, p in named:
            g = ds_engine.full_grad(p)
            captured[n] = None if g is None else g.detach().clone().cpu()

    stats = grpo_update(
        trainer.run.engine, batch, advantages, trainer.run.cfg, trainer.run.ref_engine, on_boundary=on_boundary
    )
    return captured, stats


def synthetic_rewards(n: int) -> torch.Tensor:
    # deterministic, non-constant within every group
    return torch.sin(torch.arange(n, dtype=torch.float32) * 1.7) + 0.1 * torch.arange(n, dtype=torch.float32)


def trainer_advantages(trainer, own_rewards: torch.Tensor, mine: slice) -> torch.Tensor:
    """This rank's advantages as Trainer.step computes them: every rank's own rewards (here one synthetic reward per
    label of the run's rewards) gathered in rank order, combined over the global batch with the configured
    combination and estimator, this rank's slice ``mine`` taken."""
    g = trainer.run.cfg.grpo
    weights = trainer.run.reward_fn.weights
    per_reward = {label: dist.all_gather(own_rewards * (k + 1)) for k, label in enumerate(weights)}
    advantages, _ = combine_advantages(
        per_reward, weights, g.group_size, g.reward_combination, g.advantage_estimator, tie=g.rank_tie_tolerance
    )
    return advantages[mine]


def dp_result(a) -> dict:
    """One global rollout of 2 groups (sampled once, the same on every rank), rank r training on its share, per
    ``--option-sets`` entry (a Trainer of its own): the loss averaged over the ranks, rank 0's gradients of one update
    and every rank's advantages, computed from each rank's own rewards as the trainer does (trainer_advantages)."""
    result, batch = {}, None
    for i, options in enumerate(a.option_sets.split(";")):
        trainer = Trainer.from_config(load_config(a.config, a.overrides + options.split()), a.deepspeed)
        batch = fixed_rollout(trainer, PROBE_PROMPTS) if batch is None else batch
        n = len(batch) // trainer.run.world
        mine = slice(trainer.run.rank * n, (trainer.run.rank + 1) * n)
        adv = trainer_advantages(trainer, synthetic_rewards(len(batch))[mine], mine)  # this rank's rewards only
        grads, stats = grads_of_update(trainer, batch.select(mine), adv)
        loss = dist.all_reduce_mean(torch.tensor(stats["loss"])).item()
        record = logged_statistics(trainer, stats, len(batch))
        result[i] = {"loss": loss, "grads": grads, "advantages": dist.all_gather(adv), "record": record}
    return result


# what metrics.jsonl logs of an update, reduced over the ranks as the trainer's step record reduces it
LOGGED = ("kl", "entropy", "clip_frac_low", "clip_frac_high", "ratio_mean", "ratio_min", "ratio_max",
          "first_iteration_ratio_min", "first_iteration_ratio_max", "mismatch/logp_abs_mean", "mismatch/logp_abs_max",
          "mismatch/kl_k3", "mismatch/frac_beyond")  # fmt: skip


def logged_statistics(trainer, stats: dict, rows: int) -> dict:
    """The :data:`LOGGED` fields of the step record (observability/metrics.py ``step_record``, collective) of this
    rank's update statistics."""
    from glm_grpo_ds.observability.metrics import step_record

    timings = {"rollout": 1.0, "decode": 1.0, "reward": 1.0, "update": 1.0}
    g = trainer.run.cfg.grpo
    record = step_record(1, stats, torch.zeros(rows), {}, {}, timings, {}, 0, g.num_iterations, torch.device("cpu"))
    return {key: record[key] for key in LOGGED}


def options_result(a) -> dict:
    """Per ``--option-sets`` entry (a Trainer of its own): the gradients grpo_update produces on a fixed rollout
    whose sampler log-probs are shifted (loss_by_hand.shifted_sampler_logps), and those of the loss written out by
    hand at the same weights before the update, with the options on (``hand``) and off (``hand_off``)."""
    result, batch = {}, None
    for i, options in enumerate(a.option_sets.split(";")):
        trainer = Trainer.from_config(load_config(a.config, a.overrides + options.split()), a.deepspeed)
        cfg = trainer.run.cfg
        if batch is None:  # one rollout for every set (any fixed batch does: the update and the hand see the same)
            batch = shifted_sampler_logps(fixed_rollout(trainer, PROBE_PROMPTS[: cfg.batch.prompts_per_rank]))
        adv = group_advantages(synthetic_rewards(len(batch)), cfg.grpo.group_size)
        hand = hand_gradients(ds_engine.unwrap(trainer.run.engine), batch, adv, cfg.grpo)
        grads, stats = grads_of_update(trainer, batch, adv)
        masked = stats.get("off_policy/masked_fraction")
        result[i] = {"update": grads, "truncated": stats.get("correction/outside_fraction"), "masked": masked, **hand}
    return result


def minibatch_result(a) -> dict:
    """A trainer with ``batch.prompts_per_rank=2 batch.mini_batches=2`` runs one update of a fixed 2-prompt rollout
    (two optimizer steps); a twin (same seed, ``prompts_per_rank=1``, one mini-batch) runs it as two updates, of
    the first half of each group's samples, then of the second halves with the first update done and the log-probs
    from before it as the old ones. Each one's gradients at each optimizer step (``steps``), trainable weights after
    (``weights``) and update statistics."""
    from glm_grpo_ds.update import batched_logprobs

    out = {}
    for name, extra in (("split", ["batch.prompts_per_rank=2", "batch.mini_batches=2"]), ("twin", [])):
        trainer = Trainer.from_config(load_config(a.config, a.overrides + extra), a.deepspeed)
        engine, cfg = trainer.run.engine, trainer.run.cfg
        if name == "split":
            batch = fixed_rollout(trainer, PROBE_PROMPTS[:2])
            adv = group_advantages(synthetic_rewards(len(batch)), cfg.grpo.group_size)
        named = [(n, p) for n, p in ds_engine.unwrap(engine).named_parameters() if p.requires_grad]
        steps: list = []

        def on_boundary(engine, named=named, steps=steps):
            steps.append({n: ds_engine.full_grad(p).detach().clone().cpu() for n, p in named})

        if name == "split":
            stats = [grpo_update(engine, batch, adv, cfg, on_boundary=on_boundary)]
        else:
            groups = torch.arange(len(batch)).view(-1, 2, cfg.grpo.group_size // 2)  # [prompt, half, sample]
            half, rest = groups[:, 0].reshape(-1), groups[:, 1].reshape(-1)
            ds_engine.unwrap(engine).eval()  # the pre-update log-probs, as the update takes them (no dropout)
            old = batched_logprobs(engine, batch, cfg, [slice(0, len(batch))])
            ds_engine.unwrap(engine).train()
            stats = [grpo_update(engine, batch.select(half), adv[half], cfg, on_boundary=on_boundary)]
            stats.append(grpo_update(engine, batch.select(rest), adv[rest], cfg, on_boundary=on_boundary,
                                     old_logps=old[rest]))  # fmt: skip
        weights = named_full_params(trainer, lambda n, p: p.requires_grad)
        out[name] = {"steps": steps, "weights": weights, "stats": stats}
    return out


def run_with_nan_loss(a) -> int:
    """train.main with a NaN loss on the last rank only, from the second GRPO step on (the only
    injected fault; skipping, agreement across ranks and stopping are the trainer's own code)."""
    import glm_grpo_ds.train as train_mod
    import glm_grpo_ds.update as update_mod

    real_update, real_loss = train_mod.grpo_update, update_mod.policy_loss
    calls = [0]

    def nan_loss(*args, **kwargs):
        loss, stats = real_loss(*args, **kwargs)
        return loss * float("nan"), stats

    def update(*args, **kwargs):
        calls[0] += 1
        last = dist.rank() == dist.world_size() - 1
        update_mod.policy_loss = nan_loss if calls[0] >= 2 and last else real_loss
        return real_update(*args, **kwargs)

    train_mod.grpo_update = update
    return train_mod.main(["--config", a.config, "--deepspeed", a.deepspeed, *a.overrides])


def counted_run(a) -> dict:
    """The real trainer, its two engine samplers (training's, the evaluation's) recording what it asks of them:
    ``{"samplers": 2, "events": [("sample", i) | ("sync", i, step, optimizer steps done) | ("optimizer",)]}``."""
    import glm_grpo_ds.startup as startup

    events: list[tuple] = []
    created: list = []
    optimizer_steps = [0]
    step = ds_engine.step

    def counted_step(engine):
        done = step(engine)
        if done is not None:  # a gradient-accumulation boundary: the optimizer stepped (or skipped)
            optimizer_steps[0] += 1
            events.append(("optimizer",))
        return done

    class CountingSampler(EngineSampler):
        """The engine sampler itself, recording what the trainer asks of it."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            created.append(self)

        def sample(self, prompts, seeds, group_size, on_tokens=None):
            events.append(("sample", created.index(self)))
            return super().sample(prompts, seeds, group_size, on_tokens)

        def sync_weights(self, step: int) -> None:
            events.append(("sync", created.index(self), step, optimizer_steps[0]))
            super().sync_weights(step)

    ds_engine.step, startup.EngineSampler = counted_step, CountingSampler
    Trainer.from_config(load_config(a.config, a.overrides), a.deepspeed).train()
    return {"samplers": len(created), "events": events}


def run_from_parts(a) -> dict:
    """Step 1 of the Run build_run makes, then step 1 of a Run made here from parts: a fresh policy engine (the same
    seeds build_run uses), its sampler and experience maker, the first run's decoder and rewards, the prompt order,
    the rollout taken now (NoAhead), a monitor; no run life, publisher or tracker (a step does not use them)."""
    from dataclasses import replace

    from glm_grpo_ds.data import PromptOrder
    from glm_grpo_ds.experience import ExperienceMaker, NoAhead
    from glm_grpo_ds.model.glm_image import resolve_attn
    from glm_grpo_ds.model.policy import load_policy
    from glm_grpo_ds.monitoring.alarms import Monitor
    from glm_grpo_ds.runtime.seeding import derive_seed, rollout_seeds, seed_everything
    from glm_grpo_ds.startup import build_run

    cfg = load_config(a.config, a.overrides)
    built = build_run(cfg, a.deepspeed)
    by_build_run = Trainer(built).step(0)
    cfg = built.cfg  # the config build_run resolved (the model's own sampling settings filled in)
    seed_everything(derive_seed(cfg.seed, "init"))
    attn = resolve_attn(cfg.model.attn_implementation, False, built.dtype)
    model = load_policy(
        cfg.model.path, built.dtype, attn, cfg.lora, cfg.model.gradient_checkpointing,
        seed=derive_seed(cfg.seed, "lora"),
    )  # fmt: skip
    engine = ds_engine.initialize(model, built.engine.config, cfg.optimizer, cfg.total_optimizer_steps)
    device = built.device
    maker = ExperienceMaker(
        EngineSampler(engine, built.processor, cfg, device), built.experience.decoder, built.reward_fn, cfg, device
    )
    order = PromptOrder(built.prompt_order.rows, 1, 0, cfg.batch.prompts_per_rank, cfg.seed, cfg.data.shuffle, 0.0)
    seeds = lambda index: rollout_seeds(cfg.seed, index, order.places(0))
    parts = replace(
        built, engine=engine, experience=maker, eval_experience=maker, prompt_order=order,
        rollout=NoAhead(maker, order, seeds), monitor=Monitor([]), life=None, publisher=None, tracker=None,
    )  # fmt: skip
    return {"build_run": by_build_run, "parts": Trainer(parts).step(0)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument(
        "scenario",
        choices=[
            "train",
            "grads",
            "dp",
            "options",
            "minibatch",
            "sharded",
            "memory",
            "nonfinite",
            "before",
            "sync",
            "parts",
        ],  # fmt: skip
    )
    p.add_argument("out")
    p.add_argument("--deepspeed", required=True)
    p.add_argument("--config", default="launch/configs/tiny_cpu.yaml")
    p.add_argument("--micro-batch-sizes", default="1,2,8")
    p.add_argument("--option-sets", default="", help="options, dp: key=value overrides of each run, ; between the runs")
    p.add_argument("--local_rank", type=int, default=None)
    a, overrides = p.parse_known_args(argv)
    a.overrides = overrides
    out = Path(a.out)
    result: dict = {}
    if a.scenario == "nonfinite":
        return run_with_nan_loss(a)

    if a.scenario == "sync":
        result = counted_run(a)

    elif a.scenario == "parts":
        result = run_from_parts(a)

    elif a.scenario == "options":
        result = options_result(a)
    elif a.scenario == "minibatch":
        result = minibatch_result(a)

    elif a.scenario == "train":
        trainer = Trainer.from_config(load_config(a.config, a.overrides), a.deepspeed)
        probe = fixed_rollout(trainer, PROBE_PROMPTS)
        is_lora = trainer.run.cfg.lora is not None
        result["trainable_before"] = named_full_params(trainer, lambda n, p: p.requires_grad)
        result["base_before"] = named_full_params(trainer, frozen)
        # DeepSpeed 0.19.3-0.19.7 on gloo read a coalesced ZeRO-3 gather before all of it arrived: repeated
        # gathers of unchanged weights then disagree (50 gathers caught it in 3 runs of 3; one gather, in ~1 run of 4)
        result["regather_disagrees"] = sorted(
            {n for _ in range(GATHER_REPEATS) for n, t in named_full_params(trainer, frozen).items()
             if not torch.equal(t, result["base_before"][n])}
        )  # fmt: skip
        if trainer.run.cfg.grpo.beta > 0 or is_lora:
            result["ref_before"] = probe_ref_logps(trainer, probe)
        trainer.train()
        result["trainable_after"] = named_full_params(trainer, lambda n, p: p.requires_grad)
        # every rank's own (gathered) view of the trained weights: the multi-node test compares them
        out.mkdir(parents=True, exist_ok=True)
        torch.save(result["trainable_after"], out / f"trainable_rank{dist.rank()}.pt")
        result["base_after"] = named_full_params(trainer, lambda n, p: not p.requires_grad)
        if "ref_before" in result:
            result["ref_after"] = probe_ref_logps(trainer, probe)
        result["is_lora"] = is_lora

    elif a.scenario == "grads":
        for m in [int(x) for x in a.micro_batch_sizes.split(",")]:
            trainer = Trainer.from_config(
                load_config(a.config, a.overrides + [f"batch.micro_batch_size={m}"]), a.deepspeed
            )
            batch = fixed_rollout(trainer, PROBE_PROMPTS[: trainer.run.cfg.batch.prompts_per_rank])
            adv = group_advantages(synthetic_rewards(len(batch)), trainer.run.cfg.grpo.group_size)
            grads, stats = grads_of_update(trainer, batch, adv)
            result[m] = {"grads": grads, "loss": stats["loss"], "iterations": stats["iterations"]}

    elif a.scenario == "sharded":
        trainer = Trainer.from_config(load_config(a.config, a.overrides), a.deepspeed)
        gathered_batch = fixed_rollout(trainer, PROBE_PROMPTS[:1], gather=True)
        sharded_batch = fixed_rollout(trainer, PROBE_PROMPTS[:1], gather=False)
        again = fixed_rollout(trainer, PROBE_PROMPTS[:1], gather=True)  # hooks restored correctly
        result = {
            k: (b.completion_ids.cpu(), b.sampler_logps.cpu())
            for k, b in (("gathered", gathered_batch), ("sharded", sharded_batch), ("again", again))
        }

    elif a.scenario == "before":
        # the reference / old log-probs inside the rollout's gather vs through the engine in the update,
        # and what each gathers (DeepSpeed's comms logger)
        from glm_grpo_ds.update import batched_logprobs, logprobs_before_update

        trainer = Trainer.from_config(load_config(a.config, a.overrides), a.deepspeed)
        cfg, engine = trainer.run.cfg, trainer.run.engine
        prompts = PROBE_PROMPTS[: cfg.batch.prompts_per_rank]

        def gathered(counts):
            return sum(c["bytes"] for name, c in counts.items() if "gather" in name)

        def before_fn(policy, batch):
            return logprobs_before_update(policy, batch, cfg)

        g = cfg.grpo.group_size
        with ds_engine.counted_comms() as plain:
            EngineSampler(engine, trainer.run.processor, cfg, trainer.run.device).sample(prompts, [7], g)
        with ds_engine.counted_comms() as with_before:
            got = EngineSampler(engine, trainer.run.processor, cfg, trainer.run.device, before_fn).sample(
                prompts, [7], g
            )
        batch = got.batch
        slices = [slice(i, i + cfg.batch.micro_batch_size) for i in range(0, len(batch), cfg.batch.micro_batch_size)]
        with ds_engine.counted_comms() as ref_in_update:
            ref = reference_logprobs(engine, trainer.run.ref_engine, batch, cfg, slices)
        ds_engine.unwrap(engine).eval()
        old = batched_logprobs(engine, batch, cfg, slices)
        adv = group_advantages(synthetic_rewards(len(batch)), cfg.grpo.group_size)
        with ds_engine.counted_comms() as update:
            stats = grpo_update(
                engine, batch, adv, cfg, trainer.run.ref_engine, ref_logps=got.ref_logps, old_logps=got.old_logps
            )
        result = {
            "ref": (got.ref_logps.cpu(), ref.cpu()),
            "old": (got.old_logps.cpu(), old.cpu()),
            "first_ratio": (stats["iterations"][0]["ratio_min"], stats["iterations"][0]["ratio_max"]),
            "bytes": {
                "rollout": gathered(plain),
                "rollout_with_before": gathered(with_before),
                "reference_in_update": gathered(ref_in_update),
                "update": gathered(update),
            },
            "ar_bytes": ds_engine.parameter_bytes(engine),
            "world": trainer.run.world,
        }

    elif a.scenario == "memory":
        from glm_grpo_ds.ds.ds_config import read_ds_config
        from glm_grpo_ds.memory.plan import EstimateConfig, plan
        from glm_grpo_ds.testing.model_state import model_state_bytes

        cfg = load_config(a.config, a.overrides)
        trainer = Trainer.from_config(cfg, a.deepspeed)
        batch = fixed_rollout(trainer, PROBE_PROMPTS[: cfg.batch.prompts_per_rank])
        adv = group_advantages(synthetic_rewards(len(batch)), cfg.grpo.group_size)
        keys = ("parameters", "gradients", "master", "optimizer_states")
        seen = {}

        def per_rank(name):  # [world, 4] bytes of every rank
            b = model_state_bytes(trainer.run.engine)
            seen[name] = dist.all_gather(torch.tensor([[b[k] for k in keys]], dtype=torch.float64))

        grpo_update(
            trainer.run.engine, batch, adv, cfg, trainer.run.ref_engine, on_boundary=lambda e: per_rank("boundary")
        )
        per_rank("after")
        result = {name: [dict(zip(keys, row.tolist())) for row in t] for name, t in seen.items()}
        result["plan"] = plan(
            cfg, read_ds_config(a.deepspeed), EstimateConfig(num_gpus=trainer.run.world, num_nodes=1, device="cpu")
        )

    else:  # dp
        result = dp_result(a)

    if dist.rank() == 0:
        out.mkdir(parents=True, exist_ok=True)
        torch.save(result, out / "result.pt")
    dist.barrier()
    dist.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
