"""The rollout at the GPU's speed (issue #39), proven on the CPU with the tiny GLM-Image and real peft LoRA:

* LoRA merged for sampling (glm_grpo_ds/rollout/merged_lora.py): the base restored bitwise, the merged rollout
  within 1e-6 of the unmerged one in fp32 and within the documented bound in bf16;
* the capture-ready step (glm_grpo_ds/rollout/decode_loop.py): bitwise a plain eager loop's ids and log-probs,
  every state tensor at one address for the whole loop, no host sync, one graph without breaks;
* the decode attention (glm_grpo_ds/rollout/decode_attention.py): no repeated-KV buffer in the compiled step's
  graph, where transformers' sdpa path has one;
* on a CPU, rollout.cuda_graph says it runs uncaptured (the GPU timing script's CPU form:
  tests/integration/test_gpu_timing_lease.py).
"""

import logging
from functools import partial
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from glm_grpo_ds.config import SamplingConfig
from glm_grpo_ds.model.glm_image import ar_parts
from glm_grpo_ds.rollout import rollout
from glm_grpo_ds.rollout.decode_attention import decode_attention
from glm_grpo_ds.rollout.decode_loop import LoopOptions, decode_step, prefill
from glm_grpo_ds.rollout.generate import prepare_rows
from glm_grpo_ds.rollout.merged_lora import BaseCopy, lora_merged
from glm_grpo_ds.rollout.step_graph import replayed_step
from glm_grpo_ds.runtime import log
from glm_grpo_ds.sampling import draw_distribution, draw_ids, policy_logits, race_noise
from glm_grpo_ds.testing.tiny import lora_policy

PROMPTS = ["a red cube", "a lighthouse on a cliff at sunset with a sign that says 'KEEP OUT'"]
SAMPLING = SamplingConfig(temperature=0.9, top_k=12, top_p=0.9)
G = 4
ROOT = Path(__file__).resolve().parents[2]


def base_weights(policy) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in policy.named_parameters() if "base_layer" in n}


def sample(policy, processor, seed=0, merged=False, keep=None, options=None):
    gen = torch.Generator().manual_seed(seed)
    with lora_merged(policy, keep or BaseCopy()) if merged else torch.no_grad():
        return rollout(policy, processor, PROMPTS, G, 64, 64, SAMPLING, gen, loop=options)


def test_merged_sampling_restores_the_base_bitwise_and_samples_the_unmerged_policy_in_fp32(policy, processor):
    before = base_weights(policy)
    keep = BaseCopy("host")
    unmerged = sample(policy, processor)
    merged = sample(policy, processor, merged=True, keep=keep)
    again = sample(policy, processor, merged=True, keep=keep)  # the copy is made once and serves every rollout
    after = base_weights(policy)
    assert before.keys() == after.keys() and all(torch.equal(before[n], after[n]) for n in before)
    assert len(keep.saved) == 2 * 6 and keep.nbytes == sum(t.numel() * 4 for t in keep.saved.values())
    # the peft wrappers are back: the adapters act again
    assert sum(n.endswith(".lora_A") for n, _ in policy.named_modules()) == 12
    assert torch.equal(merged.completion_ids, unmerged.completion_ids)
    assert torch.equal(again.completion_ids, merged.completion_ids)
    assert (merged.sampler_logps - unmerged.sampler_logps).abs().max() <= 1e-6
    # a merge that forgot the adapters would sample the base model: a different policy (the control)
    with policy.disable_adapter():
        base = sample(policy, processor)
    assert (base.sampler_logps - unmerged.sampler_logps).abs().max() > 1e-3


BF16_MERGE_BOUND = 0.05  # documented in docs/memory-and-speed.md (tiny model, bf16, before a row's first new token)


def test_merged_sampling_in_bf16_stays_within_the_documented_bound(tiny_model_dir, processor):
    bf16 = lora_policy(tiny_model_dir, torch.bfloat16).eval()
    before = base_weights(bf16)
    unmerged = sample(bf16, processor)
    merged = sample(bf16, processor, merged=True)
    assert all(torch.equal(before[n], w) for n, w in base_weights(bf16).items())
    same = (merged.completion_ids == unmerged.completion_ids).long().cumprod(1).bool()
    gap = (merged.sampler_logps - unmerged.sampler_logps).abs()[same]
    assert same[:, 0].all() and gap.max() <= BF16_MERGE_BOUND


def test_merge_refuses_a_partitioned_weight(tiny_model_dir):
    model = lora_policy(tiny_model_dir)
    name, module = next((n, m) for n, m in model.named_modules() if hasattr(m, "lora_A"))
    module.get_base_layer().weight.data = torch.empty(0)  # what ZeRO-3 leaves outside a gather
    with pytest.raises(RuntimeError, match="partitioned .*gather_parameters: true"):
        with lora_merged(model, BaseCopy()):
            pass
    assert model.get_submodule(name) is module  # nothing swapped out stays swapped


class HostSyncs(TorchDispatchMode):
    """Counts the ops that read a tensor's value back to the host."""

    SYNCS = {"aten::_local_scalar_dense", "aten::item", "aten::nonzero", "aten::is_nonzero"}

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func._schema.name in self.SYNCS
        return func(*args, **(kwargs or {}))


def reference_loop(policy, rows, positions, grid, seed):
    """A plain eager decode loop (the loop before issue #39): new tensors each step, the slot a Python int."""
    body, lm_head, codebook = ar_parts(policy)
    lm = body.language_model
    s = prefill(policy, rows["input_ids"], rows["attention_mask"], positions, grid.num_tokens, SAMPLING)
    gen = torch.Generator().manual_seed(seed)
    dist, ids, logps = (s.logp, s.probs), [], []
    with decode_attention(lm):
        for k in range(grid.num_tokens - 1):
            slot = s.prompt_len + k
            token, logp = draw_ids(*dist, race_noise(dist[1], [gen]))
            ids.append(token), logps.append(logp)
            mask = (s.valid & (torch.arange(s.valid.shape[1]) <= slot))[:, None, None, :]
            hidden = lm(
                input_ids=token[:, None],
                attention_mask=mask,
                position_ids=s.positions[:, :, slot : slot + 1],
                past_key_values=s.cache,
                use_cache=True,
            ).last_hidden_state[:, -1]
            dist = draw_distribution(policy_logits(lm_head(hidden), codebook, 0.9), 12, 0.9)
    token, logp = draw_ids(*dist, race_noise(dist[1], [gen]))
    return torch.stack([*ids, token], 1), torch.stack([*logps, logp], 1)


def test_the_rows_positions_are_found_once_per_prompt_as_for_every_row(policy, processor, monkeypatch):
    """GLM-Image's get_rope_index loops over its rows (with nonzero/tolist host syncs in each): prepare_rows gives it
    the P prompts, not the P x G rows, and repeats the positions, equal to those of every row found alone."""
    from glm_grpo_ds.rollout.generate import _repeat_rows, build_prompt_inputs, prompt_position_ids

    body, _, _ = ar_parts(policy)
    seen, rope_index = [], body.get_rope_index
    monkeypatch.setattr(body, "get_rope_index", lambda ids, **kw: (seen.append(len(ids)), rope_index(ids, **kw))[1])
    rows, positions, grid = prepare_rows(policy, processor, PROMPTS, G, 64, 64, "cpu")
    assert seen == [len(PROMPTS)]
    every_row = prompt_position_ids(policy, _repeat_rows(build_prompt_inputs(processor, PROMPTS, 64, 64), G))
    assert torch.equal(positions[:, :, : every_row.shape[2]], every_row) and positions.shape[1] == len(PROMPTS) * G


@torch.no_grad()
def test_the_capture_ready_step_is_the_eager_loop_bitwise_at_fixed_addresses_without_host_syncs(policy, processor):
    rows, positions, grid = prepare_rows(policy, processor, PROMPTS, G, 64, 64, "cpu")
    body, lm_head, codebook = ar_parts(policy)
    lm = body.language_model
    state = prefill(policy, rows["input_ids"], rows["attention_mask"], positions, grid.num_tokens, SAMPLING)
    addresses = {name: t.data_ptr() for name, t in state.tensors().items()}
    gen, syncs = torch.Generator().manual_seed(3), HostSyncs()
    with decode_attention(lm):
        for k in range(grid.num_tokens - 1):
            with syncs:  # what the loop runs per token: the noise draw and the step
                race_noise(state.probs, [gen], out=state.noise)
                decode_step(lm, lm_head, codebook, (0.9, 12, 0.9), state)
            assert {name: t.data_ptr() for name, t in state.tensors().items()} == addresses, k
    assert syncs.count == 0
    assert int(state.slot) == state.prompt_len + grid.num_tokens - 1
    token, logp = draw_ids(state.logp, state.probs, race_noise(state.probs, [gen], out=state.noise))
    state.ids[:, -1], state.logps[:, -1] = token, logp
    ids, logps = reference_loop(policy, rows, positions, grid, seed=3)
    assert torch.equal(state.ids, ids) and torch.equal(state.logps, logps)
    # and the rollout's own loop (with rollout.cuda_graph on a CPU: the same step, uncaptured) is that loop too
    batch = rollout(
        policy,
        processor,
        PROMPTS,
        G,
        64,
        64,
        SAMPLING,
        torch.Generator().manual_seed(3),
        loop=LoopOptions(cuda_graph=True),
    )
    assert torch.equal(batch.completion_ids, ids) and torch.equal(batch.sampler_logps, logps)


def step_graph(policy, processor, attention):
    """The dynamo graphs of one decode step, with the decode loop's attention or transformers' sdpa."""
    rows, positions, grid = prepare_rows(policy, processor, PROMPTS[:1], G, 64, 64, "cpu")
    body, lm_head, codebook = ar_parts(policy)
    lm = body.language_model
    state = prefill(policy, rows["input_ids"], rows["attention_mask"], positions, grid.num_tokens, SAMPLING)
    race_noise(state.probs, [torch.Generator().manual_seed(0)], out=state.noise)
    torch._dynamo.reset()
    with torch.no_grad(), attention(lm):
        explained = torch._dynamo.explain(partial(decode_step, lm, lm_head, codebook, (0.9, 12, 0.9)))(state)
    return explained, state


def sdpa_of_transformers(lm):
    config = lm.config
    before, config._attn_implementation = config._attn_implementation, "sdpa"
    try:
        yield
    finally:
        config._attn_implementation = before


def repeated_kv_nodes(explained, state) -> list[str]:
    """Nodes whose value has the shape of K or V repeated to every query head over the whole cache."""
    cfg = state.cache.layers[0]
    heads = 4  # the tiny AR's query heads (2 key/value heads)
    shape = torch.Size([state.ids.shape[0], heads, state.valid.shape[1], cfg.keys.shape[-1]])
    return [
        str(node)
        for graph in explained.graphs
        for node in graph.graph.nodes
        if isinstance(node.meta.get("example_value"), torch.Tensor) and node.meta["example_value"].shape == shape
    ]


def test_one_graph_without_breaks_and_no_repeated_kv_buffer(policy, processor):
    import contextlib

    explained, state = step_graph(policy, processor, decode_attention)
    assert explained.graph_count == 1 and explained.graph_break_count == 0, explained.break_reasons
    assert repeated_kv_nodes(explained, state) == []
    # the control: transformers' sdpa path in the same step materialises K and V at every query head
    explained, state = step_graph(policy, processor, contextlib.contextmanager(sdpa_of_transformers))
    assert len(repeated_kv_nodes(explained, state)) >= 2 * 2  # K and V in each of the 2 layers


def test_the_grouped_decode_attention_is_the_repeated_kv_attention():
    """The 16-heads-as-rows trick against sdpa over K/V repeated per head (transformers' repeat_kv order)."""
    from glm_grpo_ds.rollout.decode_attention import grouped_decode_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, h, n, 8, generator=g) for h, n in ((8, 1), (2, 20), (2, 20)))
    mask = torch.rand(3, 1, 1, 20, generator=g) > 0.3
    ours, _ = grouped_decode_attention(None, q, k, v, mask, scaling=0.3)
    repeated = [t.repeat_interleave(4, dim=1) for t in (k, v)]
    theirs = torch.nn.functional.scaled_dot_product_attention(q, *repeated, attn_mask=mask, scale=0.3)
    torch.testing.assert_close(ours, theirs.transpose(1, 2), rtol=0, atol=1e-6)


def test_cuda_graph_on_a_cpu_says_it_runs_uncaptured(caplog):
    log._warned.discard("cuda_graph_off_gpu")
    with caplog.at_level(logging.WARNING, logger="glm_grpo"):
        step = replayed_step(lambda: None, torch.device("cpu"))
    assert step() is None
    assert "runs its static-buffer step uncaptured" in caplog.text


@pytest.mark.slow
def test_layers_compile_one_graph_per_region_type_for_all_layers(policy, processor):
    """compile_scope=layers: the norms and MLPs of every layer share one graph per module type (a recompile per
    layer would multiply them and, past dynamo's limit, fall back to eager), and sample what the eager loop does."""
    from torch._dynamo.utils import counters

    eager = sample(policy, processor)
    torch._dynamo.reset()
    counters.clear()
    compiled = sample(policy, processor, options=LoopOptions(compile=True, compile_scope="layers"))
    layer = policy.base_model.model.model.language_model.layers[0]
    kinds = {type(m) for n, m in layer.named_children() if n == "mlp" or n.endswith("layernorm")}
    assert counters["stats"]["unique_graphs"] == len(kinds) == 2
    assert torch.equal(compiled.completion_ids, eager.completion_ids)
    assert (compiled.sampler_logps - eager.sampler_logps).abs().max() <= 1e-5
    assert all("forward" not in vars(m) for m in layer.modules())  # the modules are plain again
