"""The AR's token loop: a static-shaped, KV-cached decode of the visual-token grids, compilable.

    ids, logps = decode_tokens(ar, prompt_ids, prompt_mask, position_ids, num_tokens, sampling, [generator])
    ids, logps = decode_tokens(..., compile=True)   # the decode step through torch.compile

Called by :func:`glm_grpo_ds.rollout.rollout` (glm_grpo_ds/rollout/sampler.py; see there for the positions).
Why it looks like this: a decode step of a 9B model on a GPU, or of any model on a CPU at small widths, is bound
by per-step overhead (kernel launches, Python, growing tensors), not by its matmuls. So everything that changes
shape is fixed before the loop:

* one transformers ``StaticCache`` of ``cache_slots`` = prompt + generated tokens rounded up to a multiple of
  :data:`CACHE_BUCKET` (a few prompt lengths share one compiled graph); slots past the sequence stay masked;
* the 3D rotary positions and the key mask of every slot, built once; a step picks its slot's by a tensor
  index, not a Python slice, so every step sees the same shapes and nothing in the loop reads a value back to
  the host (no ``.item()``, no data-dependent shape);
* the step (language model, ``lm_head``, policy distribution: :func:`_step`) is a pure function of tensors,
  which ``torch.compile(fullgraph=True)`` turns into one graph per (rows, cache slots); a graph break is an
  error, not a silent slow path. The step also draws the token it feeds (``argmax(probs / noise)``, the
  algorithm of ``torch.multinomial`` itself); only the noise, drawn from the caller's generators, is eager.

The recorded log-probs are the policy distribution's (glm_grpo_ds/sampling.py), as the teacher-forced trainer
recomputes them (tests/integration/test_rollout_logprobs.py and test_decode_loop.py hold the two equal).

The prefill attention mask lets every valid prompt token see the valid tokens up to itself, as the model's
own mask does; a left-padding query row, whose output nobody reads, sees itself only, so no row of the
softmax is empty (an empty row is NaN in some sdpa kernels, and a NaN key or value would poison the cache).
"""

from __future__ import annotations

import contextlib

import torch

from ..config import SamplingConfig
from ..policy import ar_parts
from ..sampling import draw_distribution, draw_ids, policy_logits, race_noise

CACHE_BUCKET = 128  # cache slots are a multiple of this: prompt lengths within one bucket share a compiled graph


def cache_slots(prompt_len: int, num_tokens: int) -> int:
    """Slots of the static KV cache for a prompt of ``prompt_len`` and ``num_tokens`` generated tokens."""
    return -(-(prompt_len + num_tokens) // CACHE_BUCKET) * CACHE_BUCKET


def _step(lm, lm_head, codebook: int, sampling: tuple, dist, noise, slot, positions, valid, cache):
    """One decode step: draw the next token from ``dist`` = ``(policy log-probs, draw probabilities)`` with
    ``noise`` (:func:`glm_grpo_ds.sampling.draw_ids`), write it at cache slot ``slot`` (0-d tensor) and return
    ``(token [B], its log-prob [B], the following token's dist)``. ``positions`` ``[3, B, S]`` and ``valid``
    ``[B, S]`` cover every slot; the step reads its own column and masks the keys after it."""
    temperature, top_k, top_p = sampling
    token, logp = draw_ids(*dist, noise)
    keys = torch.arange(valid.shape[1], device=valid.device) <= slot
    mask = (valid & keys)[:, None, None, :]  # [B, 1, 1, S]: True = attend
    hidden = lm(
        input_ids=token[:, None],
        attention_mask=mask,
        position_ids=positions.index_select(2, slot.view(1)),
        past_key_values=cache,
        use_cache=True,
    ).last_hidden_state[:, -1]
    return token, logp, draw_distribution(policy_logits(lm_head(hidden), codebook, temperature), top_k, top_p)


_compiled_steps: dict[str, object] = {}


def compiled_step(device: torch.device):
    """:func:`_step` through ``torch.compile(fullgraph=True)``, built on first use; one graph per model, rows and
    cache slots. On a CPU the generated code calls its kernels from C++ (inductor's ``cpp_wrapper``: +9 % on
    the tiny model); a GPU gets the default wrapper, CUDA graphs not yet (untested here)."""
    if device.type not in _compiled_steps:
        options = {"cpp_wrapper": True} if device.type == "cpu" else {}
        _compiled_steps[device.type] = torch.compile(_step, fullgraph=True, dynamic=False, options=options)
    return _compiled_steps[device.type]


@contextlib.contextmanager
def sdpa_attention(lm):
    """The language model attends through torch's sdpa inside the block, whatever ``model.attn_implementation``
    says: the loop's masks are sdpa's boolean 4D masks (flash-attn takes 2D padding masks, eager attention
    additive ones), so no other kernel may read them."""
    config = lm.config
    before = config._attn_implementation
    config._attn_implementation = "sdpa"
    try:
        yield
    finally:
        config._attn_implementation = before


def unchecked_guards():
    """The decode loop's compiled steps after its first skip dynamo's guard evaluation (~70 us a step on the
    tiny model, a third of its compiled step). Safe here, not in general: the first step ran every guard and
    chose the graph, and nothing a guard checks (the model and its modes, the settings, every shape and
    dtype) changes inside one decode loop."""
    return torch.compiler.set_stance("default", skip_guard_eval_unsafe=True)


def prefill_mask(valid: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """``[B, 1, L, S]`` attention of the prompt's ``L`` query rows over the ``S`` cache slots (see the module
    docstring): valid keys up to the query, and a padding query its own slot only."""
    slots = torch.arange(valid.shape[1], device=valid.device)
    query = slots[:prompt_len, None]
    causal = slots[None, :] <= query  # [L, S]
    return ((valid[:, None, :] & causal[None]) | (slots[None, :] == query)[None])[:, None]


@torch.no_grad()
def decode_tokens(
    ar,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    position_ids: torch.Tensor,
    num_tokens: int,
    sampling: SamplingConfig,
    generators: list[torch.Generator | None],
    compile: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """KV-cached decode of ``num_tokens`` tokens after left-padded ``prompt_ids`` ``[B, L]``;
    ``position_ids`` ``[3, B, L + num_tokens]``; ``generators`` as :func:`glm_grpo_ds.sampling.draw_ids`.

    Returns ``(ids [B, n], logps [B, n])``; logps are fp32 log-probs of the drawn tokens under the
    policy distribution (mask + temperature, not truncated).
    """
    from transformers import StaticCache

    body, lm_head, codebook = ar_parts(ar)
    lm = body.language_model
    bsz, plen = prompt_ids.shape
    slots = cache_slots(plen, num_tokens)
    device = prompt_ids.device
    valid = torch.zeros(bsz, slots, dtype=torch.bool, device=device)
    valid[:, :plen] = prompt_mask.bool()
    valid[:, plen : plen + num_tokens] = True
    positions = position_ids.new_zeros(3, bsz, slots)
    positions[:, :, : plen + num_tokens] = position_ids
    cache = StaticCache(config=lm.config, max_cache_len=slots)
    settings = (sampling.temperature, sampling.top_k, sampling.top_p)

    step = compiled_step(device) if compile else _step
    # token k is drawn in the step that writes it to the cache (slot plen + k); the last one needs no forward
    step_slots = torch.arange(plen, plen + num_tokens - 1, device=device)
    ids = prompt_ids.new_empty(bsz, num_tokens)
    logps = torch.empty(bsz, num_tokens, dtype=torch.float32, device=device)
    with sdpa_attention(lm), contextlib.ExitStack() as stance:
        hidden = lm(
            input_ids=prompt_ids,
            attention_mask=prefill_mask(valid, plen),
            position_ids=positions[:, :, :plen],
            past_key_values=cache,
            use_cache=True,
        ).last_hidden_state[:, -1]
        dist = draw_distribution(policy_logits(lm_head(hidden), codebook, sampling.temperature), *settings[1:])
        for k in range(num_tokens - 1):
            noise = race_noise(dist[1], generators)
            ids[:, k], logps[:, k], dist = step(
                lm, lm_head, codebook, settings, dist, noise, step_slots[k], positions, valid, cache
            )
            if compile and k == 0:
                stance.enter_context(unchecked_guards())
    ids[:, -1], logps[:, -1] = draw_ids(*dist, race_noise(dist[1], generators))
    return ids, logps
