"""The GRPO update of one rollout: reference / old log-probs, then micro-batched loss and backward.

Gradient of a step = gradient of the full-batch loss, whatever the micro-batch size: every
micro-batch loss is divided by the *whole* rollout's normaliser (``grpo.loss_normalizer``) and
DeepSpeed's own 1/gradient_accumulation_steps scaling is turned off. Across ranks DeepSpeed
averages gradients; every rank holds the same number of sequences and tokens (fixed-size grids),
so the average equals the gradient over the union of all ranks' rollouts.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import defaultdict

import torch

from .ds import dist as ds_dist
from .ds import engine as ds_engine
from .grpo import high_entropy_mask, loss_normalizer, mismatch_sums, policy_loss, sampler_correction
from .logprobs import completion_logprobs
from .observability.step_status import NO_STATUS
from .rollout import RolloutBatch

# the loss statistics averaged over tokens (policy_loss's stats), and the first iteration's sampler-vs-trainer ones
TOKEN_MEANS = ("clip_frac_low", "clip_frac_high", "ratio_mean", "kl", "entropy")
MISMATCH_KEYS = ("mismatch/logp_abs_mean", "mismatch/logp_abs_max", "mismatch/kl_k3", "mismatch/frac_beyond")


def without_preview_loss(batch: RolloutBatch) -> RolloutBatch:
    """The batch with the preview grid's tokens masked out of the loss (``grpo.preview_in_loss=false``)."""
    mask = batch.completion_mask.clone()
    mask[:, : batch.grid.num_preview] = 0
    return dataclasses.replace(batch, completion_mask=mask)


def policy_token_weights(batch: RolloutBatch, entropy: torch.Tensor, grpo_cfg) -> torch.Tensor | None:
    """``[N, n]`` weights of the policy term per token, None when all are 1: the top-entropy selection
    (``grpo.top_entropy_quantile``, over every rank's tokens of this micro-batch: collective, each rank calls it
    once per micro-batch) times the preview grid's weight (``grpo.preview_weight``)."""
    weights = None
    if grpo_cfg.top_entropy_quantile < 1:
        mask = batch.completion_mask.bool()
        # the threshold over every rank's tokens of this micro-batch, as TRL's: ranks hold equally shaped
        # micro-batches (fixed grids), so padding with -1 (entropies are >= 0) marks the masked-out ones
        gathered = ds_dist.all_gather(torch.where(mask, entropy.detach(), -1.0))
        pool = gathered[gathered >= 0]
        weights = high_entropy_mask(entropy, mask, grpo_cfg.top_entropy_quantile, pool).to(entropy.dtype)
    if grpo_cfg.preview_weight != 1.0:
        position = torch.ones_like(entropy, requires_grad=False)
        position[:, : batch.grid.num_preview] = grpo_cfg.preview_weight
        weights = position if weights is None else weights * position
    return weights


def micro_batches(n: int, size: int) -> list[slice]:
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


@torch.no_grad()
def batched_logprobs(model, batch: RolloutBatch, cfg, slices: list[slice]) -> torch.Tensor:
    return torch.cat(
        [completion_logprobs(model, batch.select(s), cfg.grpo.sampling, cfg.grpo.logprob_chunk_size) for s in slices]
    )


def reference_logprobs(engine, ref_engine, batch: RolloutBatch, cfg, slices: list[slice]) -> torch.Tensor:
    """Log-probs under the frozen reference: the policy with adapters disabled (LoRA), or the
    separate reference engine (full fine-tuning)."""
    if ref_engine is not None:
        return batched_logprobs(ref_engine, batch, cfg, slices)
    peft_model = ds_engine.unwrap(engine)
    ctx = peft_model.disable_adapter() if hasattr(peft_model, "disable_adapter") else contextlib.nullcontext()
    with ctx:
        return batched_logprobs(engine, batch, cfg, slices)


@torch.no_grad()
def logprobs_before_update(policy, batch: RolloutBatch, cfg) -> dict[str, torch.Tensor]:
    """Inside the rollout's parameter gather (experience.sample_batch ``in_gather``), the teacher-forced
    log-probs the update would otherwise compute with the engine before its first step: ``ref`` (the LoRA
    policy with its adapters off, ``cfg.reference_in_rollout``) and ``old`` (``grpo.num_iterations > 1``);
    full fine-tuning's reference is another engine, computed in the update.
    Under ZeRO-3 every forward of the engine gathers the AR again, module by module; here the whole AR is
    already gathered for sampling, so these passes gather nothing (docs/memory-and-speed.md). The policy
    is the one that sampled and the update has not run, and experience.sample_batch runs this with the
    training forwards' linear (``ds.engine.training_linear``), so the values are bitwise those of
    :func:`grpo_update`'s own passes through the engine (tests/integration/test_logprobs_in_gather.py)."""
    slices = micro_batches(len(batch), cfg.batch.micro_batch_size)
    out = {}
    if cfg.reference_in_rollout:
        with policy.disable_adapter():
            out["ref"] = batched_logprobs(policy, batch, cfg, slices)
    if cfg.grpo.num_iterations > 1:
        out["old"] = batched_logprobs(policy, batch, cfg, slices)
    return out


def grpo_update(
    engine,
    batch: RolloutBatch,
    advantages: torch.Tensor,
    cfg,
    ref_engine=None,
    on_boundary=None,
    before=None,
    status=NO_STATUS,
) -> dict:
    """Run ``grpo.num_iterations`` optimizer steps on one rollout; return token-weighted stats
    (averaged over iterations, with the per-iteration ones under ``"iterations"``).

    ``before``: the :func:`logprobs_before_update` of this batch, computed during the rollout; what it
    lacks is computed here with the engine.

    ``on_boundary(engine)`` runs after the last backward of each step, before the optimizer step
    (gradients are then complete; tests read them there).

    ``out["skipped"]`` counts the optimizer steps DeepSpeed skipped because the gradients were not
    finite (see :func:`glm_grpo_ds.ds.engine.step`); their parameters are unchanged.

    ``status``: the step status (glm_grpo_ds/observability/step_status.py), told each micro-batch done.
    """
    grpo_cfg = cfg.grpo
    if not grpo_cfg.preview_in_loss:
        batch = without_preview_loss(batch)
    slices = micro_batches(len(batch), cfg.batch.micro_batch_size)
    status.phase("update", total=grpo_cfg.num_iterations * len(slices), unit="micro-batches")
    norm = loss_normalizer(batch.completion_mask, grpo_cfg.aggregation)
    total_tokens = batch.completion_mask.sum()  # each micro-batch's share of the entropy bonus is its tokens / these
    policy = ds_engine.unwrap(engine)
    policy.eval()  # the no-grad passes below need no dropout / checkpointing
    before = before or {}
    ref = before.get("ref")
    if ref is None and grpo_cfg.beta > 0:
        ref = reference_logprobs(engine, ref_engine, batch, cfg, slices)
    # One update per rollout: the policy that sampled is the current one, so old = logp.detach()
    # (ratio exactly 1). More updates need the pre-update log-probs of the trainer's own forward.
    old = before.get("old")
    if old is None and grpo_cfg.num_iterations > 1:
        old = batched_logprobs(engine, batch, cfg, slices)
    policy.train()

    iterations = []
    skipped = 0
    mismatch: dict[str, float] = defaultdict(float)
    for it in range(grpo_cfg.num_iterations):
        sums: dict[str, float] = defaultdict(float)
        ratio_mins, ratio_maxs = [], []
        for j, rows in enumerate(slices):
            micro = batch.select(rows)
            # through the engine's forward (not the unwrapped model): ZeRO-3 accumulation needs it
            logp, entropy = completion_logprobs(
                engine, micro, grpo_cfg.sampling, grpo_cfg.logprob_chunk_size, with_entropy=True
            )
            old_logp = logp.detach() if old is None else old[rows]
            mask = micro.completion_mask
            if it == 0:  # the sampler's numbers vs the trainer's for the same policy: the ratio should be 1
                for key, value in mismatch_sums(
                    old_logp, micro.sampler_logps, mask, grpo_cfg.mismatch_threshold
                ).items():
                    mismatch[key] = max(mismatch[key], value.item()) if key == "max" else mismatch[key] + value.item()
            loss, loss_stats = policy_loss(
                logp,
                old_logp,
                advantages[rows],
                mask,
                ref_logp=None if ref is None else ref[rows],
                beta=grpo_cfg.beta,
                epsilon_low=grpo_cfg.epsilon_low,
                epsilon_high=grpo_cfg.epsilon_high,
                aggregation=grpo_cfg.aggregation,
                normalizer=norm,
                importance_sampling_level=grpo_cfg.importance_sampling_level,
                token_weights=policy_token_weights(micro, entropy, grpo_cfg),
                is_weights=sampler_correction(
                    old_logp,
                    micro.sampler_logps,
                    mask,
                    grpo_cfg.sampler_correction,
                    grpo_cfg.sampler_correction_max,
                    grpo_cfg.sampler_correction_min,
                ),
                entropy=entropy,
                entropy_coef=grpo_cfg.entropy_coef,
                entropy_share=mask.sum() / total_tokens.clamp(min=1.0),
            )
            ds_engine.backward(engine, loss)
            if j == len(slices) - 1 and on_boundary is not None:
                on_boundary(engine)
            applied = ds_engine.step(engine)
            skipped += applied is False
            tokens = loss_stats["num_tokens"].item()
            sums["loss"] += loss.item()  # micro-batch losses add up to the rollout's loss
            sums["tokens"] += tokens
            for key in TOKEN_MEANS:
                sums[key] += loss_stats[key].item() * tokens
            ratio_mins.append(loss_stats["ratio_min"].item())
            ratio_maxs.append(loss_stats["ratio_max"].item())
            status.advance()  # after the .item()s above: the micro-batch is done on the device too
        tokens = max(sums["tokens"], 1.0)
        iteration = {key: sums[key] / tokens for key in TOKEN_MEANS}
        iteration.update(loss=sums["loss"], ratio_min=min(ratio_mins), ratio_max=max(ratio_maxs), tokens=sums["tokens"])
        iterations.append(iteration)
    # Reported: the mean over iterations (ratio extremes over all of them); per-iteration kept.
    out = {key: sum(it[key] for it in iterations) / len(iterations) for key in iterations[0]}
    out["ratio_min"] = min(it["ratio_min"] for it in iterations)
    out["ratio_max"] = max(it["ratio_max"] for it in iterations)
    out["iterations"] = iterations
    out["skipped"] = skipped
    n = max(mismatch["tokens"], 1.0)
    out.update(
        {
            "mismatch/logp_abs_mean": mismatch["abs"] / n,
            "mismatch/logp_abs_max": mismatch["max"],
            "mismatch/kl_k3": mismatch["k3"] / n,
            "mismatch/frac_beyond": mismatch["beyond"] / n,
        }
    )
    return out


def skipped_update(num_iterations: int) -> dict:
    """What :func:`grpo_update` returns for an update not run at all: every optimizer step skipped,
    no statistic (NaN, written as null)."""
    nan = float("nan")
    iteration = dict.fromkeys(("loss", *TOKEN_MEANS, "ratio_min"), nan)
    iteration.update(ratio_max=nan, tokens=0.0)
    mismatch = dict.fromkeys(MISMATCH_KEYS, nan)
    return dict(iteration, iterations=[dict(iteration)] * num_iterations, skipped=num_iterations, **mismatch)
