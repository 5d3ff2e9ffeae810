"""Teacher-forced per-token log-probs of a rollout's sampled tokens (with gradients when asked).

One forward of the AR over prompt + generated ids, with the rollout's explicit 3D position ids;
``logits_to_keep`` restricts ``lm_head`` to the positions that predict generated tokens. Those
logits then go through the same :func:`~glm_grpo_ds.sampling.policy_logits` (codebook mask,
temperature; never the top-k / top-p cut) whose log-probs the sampler recorded, in chunks of
``chunk_size`` tokens. Under autograd the fp32 part of each chunk (upcast, mask,
temperature, log-softmax) is checkpointed and recomputed in backward, so fp32 logits exist for one
chunk at a time, never as ``[B, T, vocab]``; what stays alive for backward is the model-dtype
logits of the generated positions (bf16 on GPU: 2 bytes x B x n x vocab).

``model`` is called like a transformers model, so it may be the DeepSpeed engine itself: under
ZeRO-3 the engine's own ``forward`` must run for gradient accumulation across micro-batches to
work (calling the inner module directly makes every micro-batch overwrite the previous one's
gradient partition).
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from .config import SamplingConfig
from .model.glm_image import ar_parts, resolve_sampling
from .rollout import RolloutBatch
from .sampling import entropy_of, logprobs_of, policy_logits

DEFAULT_CHUNK = 256


def completion_logprobs(
    model, batch: RolloutBatch, sampling: SamplingConfig, chunk_size: int = DEFAULT_CHUNK, with_entropy: bool = False
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``[N, n]`` fp32 log-probs of ``batch.completion_ids`` under ``model``; with ``with_entropy`` also the
    ``[N, n]`` entropy of the policy distribution at each position (:func:`glm_grpo_ds.sampling.entropy_of`).

    Gradients flow when grad mode is on (call under ``torch.no_grad()`` for old / reference
    log-probs). ``model``: a GlmImageForConditionalGeneration, a peft wrapper, or a DeepSpeed engine.
    """
    _, _, codebook = ar_parts(model)
    sampling = resolve_sampling(sampling, model)  # unset knobs: the model's own (as the rollout did)
    plen, n = batch.prompt_len, batch.completion_ids.shape[1]
    ids = batch.input_ids
    # the hidden state at position p predicts token p + 1: positions plen-1 .. plen+n-2
    keep = torch.arange(plen - 1, plen + n - 1, device=ids.device)
    raw = model(
        input_ids=ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
        logits_to_keep=keep,
    ).logits  # [N, n, vocab], model dtype

    def chunk_logprobs(chunk: torch.Tensor, chunk_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        logits = policy_logits(chunk, codebook, sampling.temperature)
        return (
            (logprobs_of(logits, chunk_ids), entropy_of(logits)) if with_entropy else (logprobs_of(logits, chunk_ids),)
        )

    out = []
    for start in range(0, n, chunk_size):
        chunk = raw[:, start : start + chunk_size]
        chunk_ids = batch.completion_ids[:, start : start + chunk_size]
        if torch.is_grad_enabled() and chunk.requires_grad:
            out.append(checkpoint(chunk_logprobs, chunk, chunk_ids, use_reentrant=False))
        else:
            out.append(chunk_logprobs(chunk, chunk_ids))
    parts = [torch.cat(part, dim=1) for part in zip(*out)]
    return tuple(parts) if with_entropy else parts[0]
