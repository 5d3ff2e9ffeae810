"""The AR's token loop: a static-shaped, KV-cached decode of the visual-token grids, compilable.

    ids, logps = decode_tokens(ar, prompt_ids, prompt_mask, position_ids, num_tokens, sampling, [generator])
    ids, logps = decode_tokens(..., LoopOptions(compile=True))       # the decode step through torch.compile
    ids, logps = decode_tokens(..., LoopOptions(cuda_graph=True))    # captured once, replayed per token (CUDA)

Called by :func:`glm_grpo_ds.rollout.rollout` (glm_grpo_ds/rollout/generate.py; see there for the positions).
Why it looks like this: a decode step of a 9B model on a GPU, or of any model on a CPU at small widths, is bound
by per-step overhead (kernel launches, Python, growing tensors), not by its matmuls. So everything that changes
shape is fixed before the loop:

* one transformers ``StaticCache`` of ``cache_slots`` = prompt + generated tokens rounded up to a multiple of
  :data:`CACHE_BUCKET` (a few prompt lengths share one compiled graph); slots past the sequence stay masked;
* the 3D rotary positions and the key mask of every slot, built once; a step picks its slot's by a tensor
  index, not a Python slice, so every step sees the same shapes and nothing in the loop reads a value back to
  the host (no ``.item()``, no data-dependent shape);
* the step (language model, ``lm_head``, policy distribution: :func:`decode_step`) works in place on a
  :class:`DecodeState` whose tensors keep their addresses for the whole loop (its cache slot is a device
  counter advanced in place), so ``torch.compile(fullgraph=True)`` turns it into one graph per (rows, cache
  slots) (a graph break is an error, not a silent slow path) and a CUDA graph can capture it
  (glm_grpo_ds/rollout/step_graph.py);
* attention over the cache groups the query heads of each key/value head as rows instead of copying K and V
  to every head (glm_grpo_ds/rollout/decode_attention.py).

The step also draws the token it feeds (``argmax(probs / noise)``, the algorithm of ``torch.multinomial``
itself); only the noise, drawn from the caller's generators into the state's noise buffer, is eager.

The recorded log-probs are the policy distribution's (glm_grpo_ds/sampling.py), as the teacher-forced trainer
recomputes them (tests/integration/test_rollout_logprobs.py and test_decode_loop.py hold the two equal).

The prefill attention mask lets every valid prompt token see the valid tokens up to itself, as the model's
own mask does; a left-padding query row, whose output nobody reads, sees itself only, so no row of the
softmax is empty (an empty row is NaN in some sdpa kernels, and a NaN key or value would poison the cache).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from ..config import SamplingConfig
from ..model.glm_image import ar_parts
from ..sampling import draw_distribution, draw_ids, policy_logits, race_noise
from .decode_attention import decode_attention
from .step_graph import ReplayedStep, compiled_layers, replayed_step, report_setup

CACHE_BUCKET = 128  # cache slots are a multiple of this: prompt lengths within one bucket share a compiled graph
REPORT_EVERY = 64  # tokens between on_tokens calls (progress)


def cache_slots(prompt_len: int, num_tokens: int) -> int:
    """Slots of the static KV cache for a prompt of ``prompt_len`` and ``num_tokens`` generated tokens."""
    return -(-(prompt_len + num_tokens) // CACHE_BUCKET) * CACHE_BUCKET


@dataclass
class DecodeState:
    """Every tensor a decode step reads or writes, allocated once per rollout: no step changes an address, so a
    step can be captured as a CUDA graph (glm_grpo_ds/rollout/step_graph.py). ``logp`` / ``probs`` ``[B, V]``:
    the next token's policy log-probs and draw probabilities; ``noise`` ``[B, V]``: its race noise, written by
    the caller before each step; ``slot``: the 0-d cache slot it goes to (advanced in place); ``start``: the 0-d
    slot of the first generated token (a tensor, not ``prompt_len``: a compiled step would hold an int as a
    constant and compile again for every prompt length, failing at dynamo's recompile limit); ``ids`` /
    ``logps`` ``[B, n]``: the output; ``positions`` ``[3, B, S]`` / ``valid`` ``[B, S]``: every slot's."""

    logp: torch.Tensor
    probs: torch.Tensor
    noise: torch.Tensor
    slot: torch.Tensor
    start: torch.Tensor
    ids: torch.Tensor
    logps: torch.Tensor
    positions: torch.Tensor
    valid: torch.Tensor
    cache: object
    prompt_len: int

    def tensors(self) -> dict[str, torch.Tensor]:
        """The state's tensors by name (the cache's key/value tensors included): what must keep its address."""
        named = {k: v for k, v in vars(self).items() if isinstance(v, torch.Tensor)}
        for i, layer in enumerate(self.cache.layers):
            named[f"cache.{i}.keys"], named[f"cache.{i}.values"] = layer.keys, layer.values
        return named


def decode_step(lm, lm_head, codebook: int, sampling: tuple, s: DecodeState) -> None:
    """One decode step, in place on ``s``: draw the next token from ``(s.logp, s.probs)`` with ``s.noise``
    (:func:`glm_grpo_ds.sampling.draw_ids`), record it and its log-prob in ``s.ids`` / ``s.logps``, write it at
    cache slot ``s.slot`` (its keys masked after the slot), put the following token's distribution in
    ``s.logp`` / ``s.probs`` and advance ``s.slot``. Reads nothing back to the host."""
    temperature, top_k, top_p = sampling
    token, logp = draw_ids(s.logp, s.probs, s.noise)
    column = (s.slot - s.start).view(1)
    s.ids.index_copy_(1, column, token[:, None])
    s.logps.index_copy_(1, column, logp[:, None])
    keys = torch.arange(s.valid.shape[1], device=s.valid.device) <= s.slot
    mask = (s.valid & keys)[:, None, None, :]  # [B, 1, 1, S]: True = attend
    hidden = lm(
        input_ids=token[:, None],
        attention_mask=mask,
        position_ids=s.positions.index_select(2, s.slot.view(1)),
        past_key_values=s.cache,
        use_cache=True,
    ).last_hidden_state[:, -1]
    next_logp, next_probs = draw_distribution(policy_logits(lm_head(hidden), codebook, temperature), top_k, top_p)
    s.logp.copy_(next_logp)
    s.probs.copy_(next_probs)
    s.slot.add_(1)


_compiled_steps: dict[str, object] = {}


def compiled_step(device: torch.device):
    """:func:`decode_step` through ``torch.compile(fullgraph=True)``, built on first use; one graph per model, rows and
    cache slots. On a CPU the generated code calls its kernels from C++ (inductor's ``cpp_wrapper``: +9 % on
    the tiny model)."""
    if device.type not in _compiled_steps:
        options = {"cpp_wrapper": True} if device.type == "cpu" else {}
        _compiled_steps[device.type] = torch.compile(decode_step, fullgraph=True, dynamic=False, options=options)
    return _compiled_steps[device.type]


def unchecked_guards():
    """The decode loop's compiled steps after its first skip dynamo's guard evaluation (~70 us a step on the
    tiny model, a third of its compiled step). Safe here, not in general: the first step ran every guard and
    chose the graph, and nothing a guard checks (the model and its modes, the settings, every shape and
    dtype) changes inside one decode loop. The stance is the whole process's, so only a loop on the main thread
    takes it (:class:`TokenSteps`): a rollout on another thread (rollout.one_step_off) keeps its guards."""
    return torch.compiler.set_stance("default", skip_guard_eval_unsafe=True)


def prefill_mask(valid: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """``[B, 1, L, S]`` attention of the prompt's ``L`` query rows over the ``S`` cache slots (see the module
    docstring): valid keys up to the query, and a padding query its own slot only."""
    slots = torch.arange(valid.shape[1], device=valid.device)
    query = slots[:prompt_len, None]
    causal = slots[None, :] <= query  # [L, S]
    return ((valid[:, None, :] & causal[None]) | (slots[None, :] == query)[None])[:, None]


@dataclass(frozen=True)
class LoopOptions:
    """How the decode loop runs its step (the ``rollout`` config section's ``compile``, ``compile_scope``,
    ``cuda_graph``); every choice samples the same tokens from the same noise."""

    compile: bool = False
    compile_scope: str = "step"  # "step": the whole step in one graph; "layers": norms and MLPs (step_graph.py)
    cuda_graph: bool = False


_setup_reported: set[tuple] = set()


class TokenSteps:
    """Decodes one token per call as the rollout's loop does: the race noise drawn from ``generators`` into
    ``state.noise``, then the step. ``replayed``: the step's :class:`~glm_grpo_ds.rollout.step_graph.ReplayedStep`
    (a CUDA graph), else None. Made by :func:`token_steps`."""

    def __init__(self, run, state: DecodeState, generators, stance: contextlib.ExitStack | None):
        self.run, self.state, self.generators, self._stance = run, state, generators, stance
        self.replayed = run if isinstance(run, ReplayedStep) else None

    def __call__(self) -> None:
        race_noise(self.state.probs, self.generators, out=self.state.noise)
        self.run()
        if self._stance is not None:  # a whole compiled step: its first call ran every guard
            if threading.current_thread() is threading.main_thread():
                # dynamo's stance is the process's: set on one step off's rollout thread, it would also skip the
                # guards of what the main thread runs compiled meanwhile (the DiT's blocks at another shape)
                self._stance.enter_context(unchecked_guards())
            self._stance = None


@contextlib.contextmanager
def token_steps(ar, state: DecodeState, sampling: SamplingConfig, generators, options=LoopOptions(), step=None):
    """A :class:`TokenSteps` over ``state`` with ``options`` (compiled whole or by layers, captured on CUDA) and
    the decode attention inside the block: the one place that turns the options into a running step, for the
    rollout, ``glm-grpo profile decode-timing`` and the decode-step counts. ``step``: another compiled form of
    :func:`decode_step` to run instead (the counts' kernel-profiled compile; its guards are the caller's)."""
    body, lm_head, codebook = ar_parts(ar)
    lm = body.language_model
    settings = (sampling.temperature, sampling.top_k, sampling.top_p)
    whole_step = options.compile and options.compile_scope == "step" and step is None
    if step is None:
        step = compiled_step(state.ids.device) if whole_step else decode_step
    run = partial(step, lm, lm_head, codebook, settings, state)
    if options.cuda_graph:
        run = replayed_step(run, state.ids.device)
    regions = compiled_layers(lm) if options.compile and options.compile_scope == "layers" else contextlib.nullcontext()
    with decode_attention(lm), regions, contextlib.ExitStack() as stance:
        yield TokenSteps(run, state, generators, stance if whole_step else None)


@torch.no_grad()
def decode_tokens(
    ar,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    position_ids: torch.Tensor,
    num_tokens: int,
    sampling: SamplingConfig,
    generators: list[torch.Generator | None],
    options: LoopOptions = LoopOptions(),
    on_tokens: Callable[[int, int], None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """KV-cached decode of ``num_tokens`` tokens after left-padded ``prompt_ids`` ``[B, L]``;
    ``position_ids`` ``[3, B, L + num_tokens]``; ``generators`` as :func:`glm_grpo_ds.sampling.draw_ids`;
    ``on_tokens(done, total)`` every :data:`REPORT_EVERY` tokens (host-side counts only).

    Returns ``(ids [B, n], logps [B, n])``; logps are fp32 log-probs of the drawn tokens under the
    policy distribution (mask + temperature, not truncated).
    """
    state = prefill(ar, prompt_ids, prompt_mask, position_ids, num_tokens, sampling)
    with token_steps(ar, state, sampling, generators, options) as advance:
        for k in range(num_tokens - 1):
            advance()
            if on_tokens is not None and (k + 1) % REPORT_EVERY == 0:
                on_tokens(k + 1, num_tokens)
    if advance.replayed is not None:
        key = (state.ids.device.type, options, tuple(prompt_ids.shape))
        what = "CUDA graph" + (" (compiled)" if options.compile else "")
        report_setup(what, advance.replayed.setup_s, key not in _setup_reported)
        _setup_reported.add(key)
    # the last token needs no forward: drawn from the distribution the last step left
    token, logp = draw_ids(state.logp, state.probs, race_noise(state.probs, generators, out=state.noise))
    state.ids[:, -1], state.logps[:, -1] = token, logp
    if on_tokens is not None:
        on_tokens(num_tokens, num_tokens)
    return state.ids, state.logps


def prefill(
    ar,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    position_ids: torch.Tensor,
    num_tokens: int,
    sampling: SamplingConfig,
) -> DecodeState:
    """The prompt through the model into a new static cache: the :class:`DecodeState` of the first token."""
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
    with decode_attention(lm):
        hidden = lm(
            input_ids=prompt_ids,
            attention_mask=prefill_mask(valid, plen),
            position_ids=positions[:, :, :plen],
            past_key_values=cache,
            use_cache=True,
        ).last_hidden_state[:, -1]
    logp, probs = draw_distribution(
        policy_logits(lm_head(hidden), codebook, sampling.temperature), sampling.top_k, sampling.top_p
    )
    return DecodeState(
        logp=logp.contiguous(),
        probs=probs.contiguous(),
        noise=torch.empty_like(probs),
        slot=torch.tensor(plen, device=device),
        start=torch.tensor(plen, device=device),
        ids=prompt_ids.new_empty(bsz, num_tokens),
        logps=torch.empty(bsz, num_tokens, dtype=torch.float32, device=device),
        positions=positions,
        valid=valid,
        cache=cache,
        prompt_len=plen,
    )
