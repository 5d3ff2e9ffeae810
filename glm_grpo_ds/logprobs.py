"""Teacher-forced per-token log-probs of a rollout's sampled tokens (with gradients when asked).

One forward of the AR body over prompt + generated ids, with the rollout's explicit 3D position
ids, gives hidden states; only the positions that predict generated tokens go through ``lm_head``,
in chunks of ``chunk_size`` tokens, through the same :func:`~glm_grpo_ds.sampling.process_logits`
the sampler used. Under autograd the fp32 part of each chunk (upcast, mask, temperature,
log-softmax) is checkpointed and recomputed in backward, so fp32 logits exist for one chunk at a
time, never as ``[B, T, vocab]``; what stays alive for backward is the model-dtype logits of the
generated positions (bf16 on GPU: 2 bytes x B x n x vocab). ``lm_head`` itself runs outside the
checkpoint: under ZeRO-3 its partitioned weight is not re-gathered for a recompute in backward.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from .config import SamplingConfig
from .policy import ar_parts
from .rollout import RolloutBatch
from .sampling import logprobs_of, process_logits

DEFAULT_CHUNK = 256


def completion_logprobs(
    ar,
    batch: RolloutBatch,
    sampling: SamplingConfig,
    chunk_size: int = DEFAULT_CHUNK,
) -> torch.Tensor:
    """``[N, n]`` fp32 log-probs of ``batch.completion_ids`` under the current ``ar``.

    Gradients flow when grad mode is on (call under ``torch.no_grad()`` for old / reference
    log-probs). ``ar`` may be plain, peft-wrapped or a DeepSpeed engine's module.
    """
    body, lm_head, codebook = ar_parts(ar)
    plen, n = batch.prompt_len, batch.completion_ids.shape[1]
    hidden = body(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
    ).last_hidden_state
    # hidden state at position p predicts token p + 1: positions plen-1 .. plen+n-2
    hidden = hidden[:, plen - 1 : plen + n - 1]

    def chunk_logprobs(raw: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        logits = process_logits(raw, codebook, sampling.temperature, sampling.top_k, sampling.top_p)
        return logprobs_of(logits, ids)

    out = []
    for start in range(0, n, chunk_size):
        raw = lm_head(hidden[:, start : start + chunk_size])  # [B, chunk, vocab], model dtype
        ids = batch.completion_ids[:, start : start + chunk_size]
        if torch.is_grad_enabled() and raw.requires_grad:
            out.append(checkpoint(chunk_logprobs, raw, ids, use_reentrant=False))
        else:
            out.append(chunk_logprobs(raw, ids))
    return torch.cat(out, dim=1)
