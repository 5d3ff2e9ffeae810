"""The decode loop's attention: grouped-query attention over the static KV cache without copying K and V.

    with decode_attention(lm):      # inside the rollout only (glm_grpo_ds/rollout/decode_loop.py)
        lm(input_ids=token[:, None], attention_mask=mask, ...)

GLM-Image's AR has 32 query heads and 2 key/value heads. transformers' sdpa path passes grouped heads to
torch's kernel (``enable_gqa``) only when there is no attention mask; with the decode loop's boolean mask (on
CUDA) and whenever the step is compiled, it calls ``repeat_kv`` instead, which materialises K and V at 32 heads
over the whole cache in every layer: at G=8 and 1 408 cache slots ~7.4 GB written and read per decode step,
more than a third of the step's weight read (issue #39).

For one query token per row the grouping needs no copy: the 16 query heads that share a key/value head are 16
query *rows* of one 2-head attention (transformers' ``repeat_kv`` gives query head ``h`` the kv head
``h // 16``, so ``query.view(B, 2, 16, D)`` lines each group up with its kv head). The boolean mask
``[B, 1, 1, S]`` broadcasts over the rows; the result is the same softmax over the same keys per query head,
computed by whatever sdpa kernel takes a mask (no ``enable_gqa``, no ``repeat_kv``). The prefill (many query
tokens, once per rollout) goes through transformers' own sdpa function.
"""

from __future__ import annotations

import contextlib

import torch

NAME = "glm_grpo_grouped_sdpa"  # the attention implementation's name in transformers' registry


def grouped_decode_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers attention interface: ``query`` ``[B, H, q, D]``, ``key`` / ``value`` ``[B, KV, S, D]``, a boolean
    ``attention_mask`` ``[B, 1, q, S]`` (True = attend) -> ``([B, q, H, D], None)``. One query token: the grouped
    rows described in the module docstring; more: transformers' sdpa."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    bsz, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    if q_len != 1 or kv_heads == heads:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling)
    rows = query.reshape(bsz, kv_heads, heads // kv_heads, dim)  # [B, KV, group, D]: a group's heads as rows
    out = torch.nn.functional.scaled_dot_product_attention(rows, key, value, attn_mask=attention_mask, scale=scaling)
    return out.reshape(bsz, 1, heads, dim), None


def _register() -> None:
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(NAME, grouped_decode_attention)
    # masks are built by the loop (4D booleans, returned as given); the entry keeps mask code that looks the
    # implementation up from failing
    AttentionMaskInterface.register(NAME, sdpa_mask)


@contextlib.contextmanager
def decode_attention(lm):
    """The language model ``lm`` attends through :func:`grouped_decode_attention` inside the block, whatever
    ``model.attn_implementation`` says: the loop's masks are sdpa's boolean 4D masks (flash-attn takes 2D padding
    masks, eager attention additive ones), so no other kernel may read them."""
    _register()
    config = lm.config
    before = config._attn_implementation
    config._attn_implementation = NAME
    try:
        yield
    finally:
        config._attn_implementation = before
