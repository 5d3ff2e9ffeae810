"""The GRPO update of one rollout: reference / old log-probs, then micro-batched loss and backward.

Gradient of an optimizer step = gradient of its mini-batch's loss (the whole rollout at ``batch.mini_batches`` 1),
whatever the micro-batch size: every micro-batch loss is divided by the *whole* mini-batch's normaliser
(``loss_normalizer`` in grpo.py) and DeepSpeed's own 1/gradient_accumulation_steps scaling is turned off. Across
ranks DeepSpeed averages gradients; every rank holds the same number of sequences and tokens (fixed-size grids), so
the average equals the gradient over the union of all ranks' rollouts. One exception, as TRL's:
``grpo.top_entropy_quantile < 1`` picks its tokens by a threshold over each micro-batch's tokens (gathered across
ranks), so which tokens train, and the gradient, move with ``batch.micro_batch_size`` and the rank count.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch

from .corrections import correction_sums, mismatch_sums, sampler_correction
from .ds import dist as ds_dist
from .ds import engine as ds_engine
from .entropy_control import EntropyControl
from .grpo import (
    LossSettings,
    high_entropy_mask,
    high_entropy_threshold,
    loss_normalizer,
    policy_loss,
    trained_token_weights,
)
from .logprobs import completion_logprobs
from .observability.step_status import NO_STATUS
from .observability.update_stats import UpdateStats
from .rollout import RolloutBatch


def without_preview_loss(batch: RolloutBatch) -> RolloutBatch:
    """The batch with the preview grid's tokens masked out of the loss (``grpo.preview_in_loss=false``)."""
    mask = batch.completion_mask.clone()
    mask[:, : batch.grid.num_preview] = 0
    return dataclasses.replace(batch, completion_mask=mask)


def policy_token_weights(
    batch: RolloutBatch, entropy: torch.Tensor, grpo_cfg, selection: dict | None = None
) -> torch.Tensor | None:
    """``[N, n]`` weights of the policy term per token, None when all are 1: the top-entropy selection
    (``grpo.top_entropy_quantile``, over every rank's tokens of this micro-batch: collective, each rank calls it
    once per micro-batch) times the preview grid's weight (``grpo.preview_weight``). ``selection``: a dict that
    receives the top-entropy ``threshold`` and this rank's ``kept`` / ``tokens`` counts (the metrics)."""
    weights = None
    if grpo_cfg.top_entropy_quantile < 1:
        mask = batch.completion_mask.bool()
        # the threshold over every rank's tokens of this micro-batch, as TRL's: ranks hold equally shaped
        # micro-batches (fixed grids), so NaN marks the masked-out ones (not a negative number: a peaked
        # distribution's fp32 entropy can be a little below 0, e.g. -1.5e-5, and is a token all the same)
        gathered = ds_dist.all_gather(torch.where(mask, entropy.detach(), float("nan")))
        pool = gathered[~torch.isnan(gathered)]
        threshold = high_entropy_threshold(pool, grpo_cfg.top_entropy_quantile) if pool.numel() else None
        kept = high_entropy_mask(entropy, mask, grpo_cfg.top_entropy_quantile, pool, threshold)
        if selection is not None and threshold is not None:
            selection.update(threshold=threshold, kept=kept.sum(), tokens=mask.sum())
        weights = kept.to(entropy.dtype)
    if grpo_cfg.preview_weight != 1.0:
        position = torch.ones_like(entropy, requires_grad=False)
        position[:, : batch.grid.num_preview] = grpo_cfg.preview_weight
        weights = position if weights is None else weights * position
    return weights


def micro_batches(n: int, size: int) -> list[slice]:
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


@torch.no_grad()
def mini_batch_order(rows: int, group_size: int, mini_batches: int) -> torch.Tensor | None:
    """The rollout's rows (group by group) in the order whose k-th ``rows / mini_batches`` are the k-th mini-batch:
    the k-th K-th of every group's samples, so a step's k-th optimizer step trains the same samples of the same
    prompts on any number of ranks (a rank holds whole groups). None, the rows in order, when K is 1 or does not
    divide G (data/prompt_order.py then places whole prompts by mini-batch where K divides the prompts per rank)."""
    if mini_batches == 1 or group_size % mini_batches or rows % group_size:
        return None
    per = group_size // mini_batches  # each group's samples in each mini-batch
    return torch.arange(rows).view(rows // group_size, mini_batches, per).transpose(0, 1).reshape(-1)


def batched_logprobs(model, batch: RolloutBatch, cfg, slices: list[slice]) -> torch.Tensor:
    return torch.cat(
        [completion_logprobs(model, batch.select(s), cfg.grpo.sampling, cfg.grpo.logprob_chunk_size) for s in slices]
    )


def reference_logprobs(engine, ref_engine, batch: RolloutBatch, cfg, slices: list[slice], reference=None):
    """Log-probs under the reference: LoRA's ``reference`` (glm_grpo_ds/model/reference.py: the policy with its
    adapters off, plus the copy of the last reset), the policy with its adapters off when None, or the separate
    reference engine (full fine-tuning)."""
    if ref_engine is not None:
        return batched_logprobs(ref_engine, batch, cfg, slices)
    with reference_forward(ds_engine.unwrap(engine), reference):
        return batched_logprobs(engine, batch, cfg, slices)


def reference_forward(policy, reference=None):
    """The context a LoRA policy's passes are the reference's in: ``reference.forward()``, or the adapters off."""
    if reference is not None:
        return reference.forward()
    return policy.disable_adapter() if hasattr(policy, "disable_adapter") else contextlib.nullcontext()


@torch.no_grad()
def logprobs_before_update(
    policy, batch: RolloutBatch, cfg, reference=None
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Inside the rollout's parameter gather (the engine sampler's ``before_update``, glm_grpo_ds/rollout/
    backends.py), the teacher-forced log-probs ``(ref, old)`` the update would otherwise compute with the engine
    before its first step: ``ref`` (the LoRA policy with its adapters off, ``cfg.reference_in_rollout``) and
    ``old`` (``cfg.old_logprobs_in_rollout``: more than one update per rollout, on-policy); None for what is not needed
    here (full fine-tuning's reference is another engine, computed in the update). ``reference``: the run's LoRA
    reference (glm_grpo_ds/model/reference.py; None: the adapters off).
    Under ZeRO-3 every forward of the engine gathers the AR again, module by module; here the whole AR is
    already gathered for sampling, so these passes gather nothing (docs/memory-and-speed.md). The policy
    is the one that sampled and the update has not run, and the engine sampler runs this with the
    training forwards' linear (``ds.engine.training_linear``), so the values are bitwise those of
    :func:`grpo_update`'s own passes through the engine (tests/integration/test_logprobs_in_gather.py)."""
    slices = micro_batches(len(batch), cfg.batch.micro_batch_size)
    ref = old = None
    if cfg.reference_in_rollout:
        with reference_forward(policy, reference):
            ref = batched_logprobs(policy, batch, cfg, slices)
    if cfg.old_logprobs_in_rollout:
        old = batched_logprobs(policy, batch, cfg, slices)
    return ref, old


def missing_logprobs(engine, ref_engine, batch: RolloutBatch, cfg, slices, ref, old, reference=None) -> tuple:
    """``(ref, old)`` with what the rollout did not compute filled in with the engine: the reference when the KL
    term needs it (``grpo.beta > 0``), the pre-update log-probs when there is more than one update per rollout
    (iterations or mini-batches). One update needs no old log-probs: the policy that sampled is the current one, so
    old = logp.detach()."""
    policy = ds_engine.unwrap(engine)
    policy.eval()  # the no-grad passes need no dropout / checkpointing
    if ref is None and cfg.grpo.beta > 0:
        ref = reference_logprobs(engine, ref_engine, batch, cfg, slices, reference)
    if old is None and cfg.updates_per_step > 1:
        old = batched_logprobs(engine, batch, cfg, slices)
    policy.train()
    return ref, old


def loss_weights(
    micro: RolloutBatch, entropy: torch.Tensor, old_logp: torch.Tensor, grpo_cfg, selection: dict | None = None
) -> tuple:
    """``(token_weights, is_weights)`` of one micro-batch for :func:`glm_grpo_ds.grpo.policy_loss`: which tokens
    the policy term weighs how (:func:`policy_token_weights`; collective with top-entropy selection) and the
    sampler correction's importance weights (``grpo.sampler_correction``); None where they are all 1.
    ``selection``: receives the top-entropy selection's numbers (:func:`policy_token_weights`)."""
    g = grpo_cfg
    is_weights = sampler_correction(
        old_logp,
        micro.sampler_logps,
        micro.completion_mask,
        g.sampler_correction,
        g.sampler_correction_max,
        g.sampler_correction_min,
    )
    return policy_token_weights(micro, entropy, g, selection), is_weights


def loss_settings(grpo_cfg) -> LossSettings:
    """The grpo section's settings of :func:`glm_grpo_ds.grpo.policy_loss`, built once per run: each field is the
    grpo key of its name."""
    return LossSettings(**{field.name: getattr(grpo_cfg, field.name) for field in dataclasses.fields(LossSettings)})


def grpo_update(
    engine,
    batch,
    advantages,
    cfg,
    ref_engine=None,
    on_boundary=None,
    ref_logps=None,
    old_logps=None,
    status=NO_STATUS,
    loss: LossSettings | None = None,
    entropy_control: EntropyControl | None = None,
    reference=None,
) -> dict:
    """Run ``grpo.num_iterations`` passes over one rollout, each ``batch.mini_batches`` optimizer steps on the
    rollout's mini-batches (:func:`mini_batch_order`) in order; return its statistics (observability/
    update_stats.py, one entry per optimizer step; ``skipped``: optimizer steps DeepSpeed skipped because the
    gradients were not finite). ``ref_logps`` / ``old_logps``: computed during the rollout, else here.
    ``on_boundary(engine)`` runs after the last backward of each optimizer step, before it (tests read the gradients
    there); ``status``: the step status (observability/
    step_status.py), told each micro-batch done; ``loss``: the run's loss settings (:func:`loss_settings` of
    ``cfg.grpo`` when None); ``entropy_control``: ``grpo.entropy_target``'s adaptive coefficient, which sets each
    optimizer step's bonus and is updated after it (collective: every rank's trained tokens' entropy);
    ``reference``: a LoRA run's reference (glm_grpo_ds/model/reference.py; None: the adapters off)."""
    g = cfg.grpo
    settings = loss_settings(g) if loss is None else loss
    batch = batch if g.preview_in_loss else without_preview_loss(batch)
    order = mini_batch_order(len(batch), g.group_size, cfg.batch.mini_batches)
    if order is not None:  # each mini-batch a K-th of every group: the k-th holds the same samples on any world size
        batch, advantages = batch.select(order), advantages[order.to(advantages.device)]
        ref_logps, old_logps = (None if t is None else t[order.to(t.device)] for t in (ref_logps, old_logps))
    slices = micro_batches(len(batch), cfg.batch.micro_batch_size)
    status.phase("update", total=g.num_iterations * len(slices), unit="micro-batches")
    ref, old = missing_logprobs(engine, ref_engine, batch, cfg, slices, ref_logps, old_logps, reference)
    stats = UpdateStats()
    one = _OptimizerStep(engine, batch, advantages, ref, old, cfg, stats, status, on_boundary)
    applied = []  # the adaptive entropy coefficient of each optimizer step
    minis = micro_batches(len(batch), len(batch) // cfg.batch.mini_batches)
    for it in range(g.num_iterations):
        for rows in minis:
            if entropy_control is not None:
                applied.append(entropy_control.applied)
                settings = dataclasses.replace(settings, entropy_coef=applied[-1])
            trained = one.run(rows, it == 0, settings)
            stats.end_iteration()
            if entropy_control is not None:
                world = ds_dist.all_reduce_sum(trained)  # no trained token anywhere: NaN, the controller holds
                entropy_control.update((world[0] / world[1]).item() if world[1] > 0 else float("nan"))
    result = stats.result()
    if entropy_control is not None:  # the same on every rank: the record's mean over ranks is the value
        result["entropy_coef"] = sum(applied) / len(applied)  # what the steps' bonus took
        result["entropy_control/coef"] = entropy_control.coef  # the controller's after them (TRL's entropy_coef)
    return result


@dataclasses.dataclass
class _OptimizerStep:
    """One optimizer step of :func:`grpo_update` over a mini-batch of its rollout: what every step reads."""

    engine: torch.nn.Module
    batch: RolloutBatch
    advantages: torch.Tensor
    ref: torch.Tensor | None
    old: torch.Tensor | None
    cfg: object
    stats: UpdateStats
    status: object
    on_boundary: object

    def run(self, rows: slice, first: bool, settings: LossSettings) -> torch.Tensor:
        """The backward passes of the mini-batch ``batch[rows]``, its micro-batches each divided by the mini-batch's
        normaliser (their losses add up to the mini-batch's), each followed by the engine's step (the last one the
        optimizer step, after ``on_boundary``). ``first``: the first pass over the rollout, where the sampler's
        numbers are compared with the trainer's. Returns this rank's ``[sum of H x w, sum of w]`` over the trained
        tokens (the adaptive entropy coefficient's measure)."""
        g, mini = self.cfg.grpo, self.batch.select(rows)
        norm = loss_normalizer(mini.completion_mask, g.aggregation)  # the mini-batch's: micro-batch losses add up
        total_tokens = mini.completion_mask.sum().clamp(min=1.0)  # each micro-batch's share of the entropy bonus
        trained = torch.zeros(2, dtype=torch.float64, device=mini.completion_mask.device)
        parts = micro_batches(len(mini), self.cfg.batch.micro_batch_size)
        for j, part in enumerate(parts):
            sel = slice(rows.start + part.start, rows.start + part.stop)  # the rows of the whole rollout
            micro = self.batch.select(sel)
            mask = micro.completion_mask
            # through the engine's forward (not the unwrapped model): ZeRO-3 accumulation needs it
            logp, entropy = completion_logprobs(self.engine, micro, g.sampling, g.logprob_chunk_size, with_entropy=True)
            old_logp = logp.detach() if self.old is None else self.old[sel]
            if first:  # the sampler's numbers vs the trainer's for the same policy: the ratio should be 1
                self._compare_sampler(old_logp, micro)
            selection: dict = {}
            token_weights, is_weights = loss_weights(micro, entropy, old_logp, g, selection)
            self.stats.add_selection(selection)
            value, loss_stats = policy_loss(
                logp, old_logp, self.advantages[sel], mask, settings, ref_logp=None if self.ref is None else
                self.ref[sel], normalizer=norm, token_weights=token_weights, is_weights=is_weights, entropy=entropy,
                entropy_share=mask.sum() / total_tokens, sampler_logp=micro.sampler_logps,
            )  # fmt: skip
            weights = trained_token_weights(mask, token_weights)  # the tokens the bonus acts on
            trained += torch.stack([(entropy.detach() * weights).sum(), weights.sum()]).double()
            ds_engine.backward(self.engine, value)
            if j == len(parts) - 1 and self.on_boundary is not None:
                self.on_boundary(self.engine)
            self.stats.add(value, loss_stats, ds_engine.step(self.engine))
            self.status.advance()  # after stats.add's .item()s: the micro-batch is done on the device too
        return trained

    def _compare_sampler(self, old_logp: torch.Tensor, micro: RolloutBatch) -> None:
        g, mask = self.cfg.grpo, micro.completion_mask
        self.stats.add_mismatch(mismatch_sums(old_logp, micro.sampler_logps, mask, g.mismatch_threshold))
        self.stats.add_correction(
            correction_sums(
                old_logp, micro.sampler_logps, mask, g.sampler_correction, g.sampler_correction_max,
                g.sampler_correction_min,
            )
        )  # fmt: skip
