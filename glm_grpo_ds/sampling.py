"""The token distributions of the AR policy, shared by the sampler and the trainer.

Pure torch. Two distributions, on purpose:

* the **policy** distribution, :func:`policy_logits`: raw ``lm_head`` logits with the
  visual-codebook mask and the temperature (applied exactly once). Every log-prob the loss uses -
  the sampler's record, the teacher-forced recomputation, old and reference log-probs, hence the
  importance ratio and the KL - is a log-prob under this distribution;
* the **draw** distribution, :func:`truncate`: the policy logits cut to the top-k / top-p support,
  used only to pick the token (:func:`sample`).

Why not take the ratio under the truncated distribution: the cut is a hard threshold on logits, and
in bf16 the KV-cached rollout logits and the full-sequence training logits differ slightly, so a
re-applied cut can exclude a token the sampler drew (log-prob -inf, ratio NaN, a skipped step;
measured on the tiny model in bf16: 3 to 11 of 6 072 tokens per setting). Every codebook token has a
finite policy log-prob, so the ratio is always defined and is exactly 1 on the first iteration.
This is TRL's choice too (temperature-scaled log-probs, no re-truncation); the cost is that
top-k / top-p make the draw off-policy by the policy mass the cut leaves out (a drawn token is 1/Z times likelier
under the cut; docs/training.md says how large), a bias that vanishes without them.

Everything is computed in fp32 on one chunk of logits at a time: bf16 logits are upcast chunk by
chunk, so a ``[B, T, vocab]`` fp32 tensor never exists and the log-softmax is exact to fp32.
"""

from __future__ import annotations

import torch


def policy_logits(logits: torch.Tensor, codebook_size: int, temperature: float = 1.0) -> torch.Tensor:
    """``[..., V]`` raw logits -> fp32 logits of the policy distribution (-inf = forbidden).

    Ids ``>= codebook_size`` (image start/end and the spare vision ids) are forbidden: the AR
    must fill the preview and target grids with codebook tokens and cannot end early.
    """
    x = logits.float()
    if codebook_size < x.shape[-1]:
        x = x.clone()
        x[..., codebook_size:] = float("-inf")
    if temperature != 1.0:
        x = x / temperature
    return x


def truncate(x: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Policy logits -> draw logits: keep the ``top_k`` largest (0 = all) and the smallest set whose
    probability reaches ``top_p`` (1 = all; the top token always stays)."""
    if top_k and top_k < x.shape[-1]:
        kth = torch.topk(x, top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        probs = sorted_x.softmax(-1)
        # drop a token when the mass *before* it already reaches top_p
        drop_sorted = (probs.cumsum(-1) - probs) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return x


def logprobs_of(policy: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Log-prob of ``ids[...]`` under fp32 policy logits ``[..., V]`` -> ``[...]``."""
    return torch.log_softmax(policy, dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)


def entropy_of(policy: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of the distribution of fp32 policy logits ``[..., V]`` -> ``[...]``, differentiable.

    ``logsumexp(x) - sum(softmax(x) * x)``, with forbidden ids (-inf) contributing 0 (as ``-p log p`` does at p = 0)
    and no NaN in the value or its gradient.
    """
    finite = torch.where(torch.isfinite(policy), policy, torch.zeros_like(policy))
    return torch.logsumexp(policy, dim=-1) - (torch.softmax(policy, dim=-1) * finite).sum(-1)


def draw_distribution(policy: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, V]`` policy logits -> ``(policy log-probs, draw probabilities)``, both ``[B, V]`` fp32.

    The draw probabilities are the top-k / top-p truncation's (the policy's own without a cut). Pure
    tensor work with no host synchronisation, compiled inside the rollout's decode step
    (glm_grpo_ds/rollout/decode_loop.py).
    """
    logp = torch.log_softmax(policy, dim=-1)
    draw = torch.log_softmax(truncate(policy, top_k, top_p), dim=-1) if (top_k or top_p < 1.0) else logp
    return logp, draw.exp()


def race_noise(
    probs: torch.Tensor, generators: list[torch.Generator | None], out: torch.Tensor | None = None
) -> torch.Tensor:
    """Exp(1) noise ``[B, V]`` for :func:`draw_ids`, drawn eagerly (it takes generators; the rest can compile).

    ``generators`` split the rows into ``len(generators)`` equal consecutive blocks, each drawn from its own
    generator: one for the whole batch, or one per prompt, so a prompt's draws do not depend on which prompts
    share the batch. Each block consumes its generator exactly as ``torch.multinomial`` on that block would.
    ``out``: a contiguous ``[B, V]`` tensor to draw into in place (the decode loop's static noise buffer; the
    same values as without it).
    """
    per = probs.shape[0] // len(generators)
    if per * len(generators) != probs.shape[0]:
        raise ValueError(f"{len(generators)} generators do not split {probs.shape[0]} rows into equal blocks")
    out = torch.empty_like(probs, memory_format=torch.contiguous_format) if out is None else out
    for i, g in enumerate(generators):
        out[i * per : (i + 1) * per].exponential_(generator=g)
    return out


def draw_ids(logp: torch.Tensor, probs: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One id per row, ``argmax(probs / noise)`` with :func:`race_noise`: an exact draw from ``probs`` (the
    exponential race), and the algorithm ``torch.multinomial`` itself runs for one sample, so with the same
    generator the ids are the same (tests/unit/test_sampling_draw.py). Returns ``(ids [B], their policy
    log-probs [B])``. No generator and no host synchronisation: it compiles."""
    ids = (probs / noise).argmax(-1, keepdim=True)
    return ids.squeeze(1), logp.gather(-1, ids).squeeze(1)


def sample(
    policy: torch.Tensor, top_k: int = 0, top_p: float = 1.0, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one id per row of ``[B, V]`` policy logits from their top-k / top-p truncation; return
    ``(ids [B], policy log-probs of the ids [B])``."""
    logp, probs = draw_distribution(policy, top_k, top_p)
    return draw_ids(logp, probs, race_noise(probs, [generator]))
