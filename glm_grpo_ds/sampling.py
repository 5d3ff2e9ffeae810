"""The token distribution the AR policy samples from, shared by the sampler and the trainer.

Pure torch. ``process_logits`` turns raw ``lm_head`` logits into the logits of the distribution
that is actually sampled: visual-codebook mask, temperature (applied exactly once), optional
top-k / top-p. The rollout samples from it and records ``log_softmax`` of it; the teacher-forced
pass calls the *same* function, which is what makes the two log-probs equal (the invariant
``glm-grpo verify-logprobs`` checks).

Everything is computed in fp32 on one chunk of logits at a time: bf16 logits are upcast chunk by
chunk, so a ``[B, T, vocab]`` fp32 tensor never exists and the log-softmax is exact to fp32.
"""

from __future__ import annotations

import torch


def process_logits(
    logits: torch.Tensor, codebook_size: int, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0
) -> torch.Tensor:
    """``[..., V]`` raw logits -> fp32 logits of the sampling distribution (-inf = forbidden).

    Ids ``>= codebook_size`` (image start/end and the spare vision ids) are forbidden: the AR
    must fill the preview and target grids with codebook tokens and cannot end early.
    """
    x = logits.float()
    if codebook_size < x.shape[-1]:
        x = x.clone()
        x[..., codebook_size:] = float("-inf")
    if temperature != 1.0:
        x = x / temperature
    if top_k and top_k < codebook_size:
        kth = torch.topk(x, top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        cum = sorted_x.softmax(-1).cumsum(-1)
        # drop a token when the mass *before* it already reaches top_p (the top token always stays)
        drop_sorted = (cum - sorted_x.softmax(-1)) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return x


def logprobs_of(processed: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Log-prob of ``ids[...]`` under fp32 processed logits ``[..., V]`` -> ``[...]``."""
    return torch.log_softmax(processed, dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)


def sample(processed: torch.Tensor, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one id per row of ``[B, V]`` processed logits; return ``(ids [B], logprobs [B])``.

    The recorded log-prob is read from the very tensor the draw used.
    """
    logp = torch.log_softmax(processed, dim=-1)
    ids = torch.multinomial(logp.exp(), 1, generator=generator)  # [B, 1]
    return ids.squeeze(1), logp.gather(-1, ids).squeeze(1)
