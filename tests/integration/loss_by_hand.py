"""The GRPO loss of one update written out by hand, for tests/integration/ds_worker.py's ``options`` scenario: the
gradients grpo_update should produce with the loss options on (top-entropy selection, preview weight, token-level
truncated sampler correction, entropy bonus, preview left out of the loss, off-policy sequence mask), computed here
in the test's own terms from the model's log-probs and entropies, without glm_grpo_ds.grpo's policy_loss or
glm_grpo_ds.update's loss_weights (their maths has unit tests of its own: tests/unit/test_grpo_*; this is what
checks the wiring).

One iteration, beta 0, aggregation token_mean, one row per micro-batch; every rank (one here) sees the whole batch.
"""

from __future__ import annotations

import dataclasses

import torch

from glm_grpo_ds.logprobs import completion_logprobs

SAMPLER_SHIFT = 1.5  # the sampler log-probs move by SAMPLER_SHIFT * sin(position): pi_old / pi_sampler up to e^1.5


def shifted_sampler_logps(batch):
    """``batch`` with its sampler log-probs moved by ``SAMPLER_SHIFT * sin(position)`` on the completion's tokens:
    the weights pi_old / pi_sampler then run from e^-1.5 to e^1.5 (~0.22 to ~4.5), so a cap of 3 truncates some."""
    position = torch.arange(batch.sampler_logps.shape[1], dtype=batch.sampler_logps.dtype)
    shift = SAMPLER_SHIFT * torch.sin(position).unsqueeze(0) * batch.completion_mask.to(batch.sampler_logps.dtype)
    return dataclasses.replace(batch, sampler_logps=batch.sampler_logps + shift)


def _loss_mask(batch, grpo_cfg, options: bool) -> torch.Tensor:
    """``[N, n]`` float: the completion's tokens, the preview grid's zeroed with ``grpo.preview_in_loss=false``."""
    mask = batch.completion_mask.to(torch.float32).clone()
    if options and not grpo_cfg.preview_in_loss:
        mask[:, : batch.grid.num_preview] = 0.0
    return mask


def _row_weights(entropy, m, num_preview: int, grpo_cfg) -> torch.Tensor:
    """``[1, n]``: 1 where the token's entropy is at least the row's masked entropies' 1 - q quantile (torch.quantile,
    linear; all tokens when q = 1), times preview_weight on the first ``num_preview`` positions."""
    h = entropy.detach()
    keep = torch.ones_like(h)
    if grpo_cfg.top_entropy_quantile < 1:
        cut = torch.quantile(h[m > 0].float(), 1.0 - grpo_cfg.top_entropy_quantile)
        keep = (h >= cut).to(h.dtype)
    position = torch.ones_like(h)
    position[:, :num_preview] = grpo_cfg.preview_weight
    return keep * position


def _row_correction(logp, sampler_logp, grpo_cfg) -> torch.Tensor:
    """``[1, n]``: min(pi_old / pi_sampler, cap) per token (token_truncate; old = this forward's log-probs, as one
    iteration has them), 1 with no correction."""
    mode = grpo_cfg.sampler_correction
    if mode == "none":
        return torch.ones_like(logp)
    assert mode == "token_truncate" and grpo_cfg.sampler_correction_min is None, mode
    return torch.exp(logp.detach() - sampler_logp).clamp(max=grpo_cfg.sampler_correction_max)


def _row_kept(logp, sampler_logp, advantage, m, grpo_cfg) -> float:
    """0 when off-policy sequence masking drops the row (a negative advantage and a mean of log pi_sampler - log pi
    over its loss tokens above grpo.off_policy_mask_threshold), else 1."""
    bound = grpo_cfg.off_policy_mask_threshold
    if bound is None or advantage >= 0:
        return 1.0
    return float(((sampler_logp - logp.detach()) * m).sum() / m.sum() <= bound)


def row_loss(logp, entropy, row, advantage, m, total, grpo_cfg, options: bool = True) -> torch.Tensor:
    """The loss of a one-row micro-batch (scalar, with grad) from its log-probs and entropies ``[1, n]``: with
    ``ratio = exp(logp - logp.detach())`` (1 in value, its gradient that of logp), ``m`` the row's loss mask, ``w``
    the token weights, ``c`` the correction and ``N`` = ``total`` the masked tokens of the whole batch,

        k sum_t[-A w_t c_t ratio_t m_t] / N  -  entropy_coef * (sum_t H_t m_t w_t / sum_t m_t w_t) * (sum_t m_t / N)

    with ``k`` the off-policy sequence mask's 0 or 1 for the row (:func:`_row_kept`).

    ``options=False``: the same formula with every option off (w = c = 1, no bonus)."""
    ratio = torch.exp(logp - logp.detach())
    if not options:
        return (-advantage * ratio * m).sum() / total
    w = _row_weights(entropy, m, row.grid.num_preview, grpo_cfg)
    c = _row_correction(logp, row.sampler_logps, grpo_cfg)
    policy = (-advantage * w * c * ratio * m).sum() / total * _row_kept(logp, row.sampler_logps, advantage, m, grpo_cfg)
    bonus = (entropy * m * w).sum() / (m * w).sum() * (m.sum() / total)
    return policy - grpo_cfg.entropy_coef * bonus


def hand_gradients(model, batch, advantages, grpo_cfg) -> dict[str, dict[str, torch.Tensor | None]]:
    """``{"hand": ..., "hand_off": ...}``: the gradients of :func:`row_loss` summed over the one-row micro-batches,
    with the options on and off (the preview then in the loss), by parameter name (None: unused). Through
    ``torch.autograd.grad``: nothing lands in ``.grad`` or in DeepSpeed's accumulation hooks, and the weights stay
    those the update then starts from."""
    g = grpo_cfg
    model.train()  # as grpo_update's passes (dropout is 0: the same numbers as in eval mode)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    masks = {"hand": _loss_mask(batch, g, True), "hand_off": _loss_mask(batch, g, False)}
    sums: dict[str, list] = {key: [None] * len(named) for key in masks}
    for i in range(len(batch)):
        row = batch.select(slice(i, i + 1))
        logp, entropy = completion_logprobs(model, row, g.sampling, g.logprob_chunk_size, with_entropy=True)
        for key, mask in masks.items():
            m, total = mask[i : i + 1], mask.sum().clamp(min=1.0)
            loss = row_loss(logp, entropy, row, advantages[i], m, total, g, options=key == "hand")
            grads = torch.autograd.grad(loss, params, allow_unused=True, retain_graph=key == "hand")
            sums[key] = [s if d is None else (d if s is None else s + d) for s, d in zip(sums[key], grads)]
    return {key: {n: None if s is None else s.detach().cpu() for (n, _), s in zip(named, v)} for key, v in sums.items()}
