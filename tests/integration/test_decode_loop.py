"""The rollout's decode loop (glm_grpo_ds/rollout/decode_loop.py) on the tiny GLM-Image with LoRA adapters:
compiled == eager, both == the teacher-forced trainer, weight updates reach the compiled step, per-prompt
generator streams, and an eager-attention model still samples through sdpa's masks.

The compiled rollouts share one graph (16 rows, one cache bucket): ~20 s of compiling on 2 cores, once.
"""

import threading

import pytest
import torch

from glm_grpo_ds.config import SamplingConfig
from glm_grpo_ds.logprobs import completion_logprobs
from glm_grpo_ds.model.policy import load_ar
from glm_grpo_ds.rollout import rollout
from glm_grpo_ds.rollout.decode_loop import LoopOptions

PROMPTS = ["a red cube", "a lighthouse on a cliff at sunset with a sign that says 'KEEP OUT'"]
SAMPLING = SamplingConfig(temperature=0.9, top_k=12, top_p=0.9)  # the cut bites on the 16-id codebook
G = 8  # 2 prompts x 8 = 16 rows


def sample(policy, processor, compile, seed=0, prompts=PROMPTS, sampling=SAMPLING, generator=None):
    gen = generator if generator is not None else torch.Generator().manual_seed(seed)
    return rollout(policy, processor, prompts, G, 64, 64, sampling, gen, loop=LoopOptions(compile=compile))


def trainer_gap(policy, batch, sampling=SAMPLING) -> float:
    with torch.no_grad():
        return (completion_logprobs(policy, batch, sampling) - batch.sampler_logps).abs().max().item()


def test_compiled_step_samples_what_the_eager_loop_samples_and_the_trainer_recomputes(policy, processor):
    eager, compiled = sample(policy, processor, False), sample(policy, processor, True)
    assert torch.equal(compiled.completion_ids, eager.completion_ids)
    torch.testing.assert_close(compiled.sampler_logps, eager.sampler_logps, rtol=0, atol=1e-5)
    assert trainer_gap(policy, compiled) <= 1e-5 and trainer_gap(policy, eager) <= 1e-5
    # a different seed gives different grids (the generator reaches the compiled loop's draws)
    assert not torch.equal(sample(policy, processor, True, seed=1).completion_ids, compiled.completion_ids)


def test_compiled_step_sees_new_weights_and_new_settings(policy, processor):
    """After an optimizer step the graph must read the new adapter weights, and other sampling settings must
    not reuse a graph built for the old ones (the loop skips guards after its first step only)."""
    before = sample(policy, processor, True)
    lora_b = [p for name, p in policy.named_parameters() if "lora_B" in name]
    saved = [p.detach().clone() for p in lora_b]
    try:
        with torch.no_grad():
            for p in lora_b:
                p.mul_(-3.0)
        after = sample(policy, processor, True)
        assert not torch.equal(after.completion_ids, before.completion_ids)
        assert trainer_gap(policy, after) <= 1e-5
        greedy = SamplingConfig(temperature=0.5, top_k=1, top_p=1.0)
        hot = sample(policy, processor, True, sampling=greedy)
        assert trainer_gap(policy, hot, greedy) <= 1e-5
        assert (hot.completion_ids == hot.completion_ids[:1]).all(dim=1)[:G].all()  # top_k=1: one grid per prompt
    finally:
        with torch.no_grad():
            for p, value in zip(lora_b, saved):
                p.copy_(value)


def test_a_compiled_loop_skips_its_guards_on_the_main_thread_only(policy, processor):
    """dynamo's stance (skip guard evaluation) is the whole process's: a compiled loop on one step off's rollout
    thread must not switch off the guards of what the main thread runs compiled meanwhile (the DiT's blocks at
    another shape would reuse a graph), while a loop on the main thread still skips its own after its first step."""
    from torch._dynamo import eval_frame  # the stance itself (torch.compiler.set_stance writes it)

    seen: dict[str, set[bool]] = {"main": set(), "thread": set()}

    def sampled(where):
        def on_tokens(done, total):  # every 64 tokens inside the loop, and once after it
            seen[where].add(eval_frame._stance.skip_guard_eval_unsafe)

        gen = torch.Generator().manual_seed(0)
        options = LoopOptions(compile=True)
        return rollout(policy, processor, PROMPTS, G, 64, 64, SAMPLING, gen, loop=options, on_tokens=on_tokens)

    main, other = sampled("main"), {}
    thread = threading.Thread(target=lambda: other.update(batch=sampled("thread")))
    thread.start()
    thread.join()
    assert seen == {"main": {True, False}, "thread": {False}}  # main: skipped in the loop, restored after it
    assert torch.equal(other["batch"].completion_ids, main.completion_ids)  # the guards change no token


def test_prompts_of_other_lengths_in_one_cache_bucket_reuse_the_compiled_step(policy, processor):
    """One graph per (rows, cache slots), not per prompt length: a step that read the prompt length as a Python
    int compiled again for every length and stopped a run at dynamo's recompile limit (8) after 9 lengths."""
    from torch._dynamo.utils import counters

    sample(policy, processor, True)
    other = ["a blue sphere", "a small wooden boat on a calm lake"]  # another padded length, the same bucket
    graphs = counters["stats"]["unique_graphs"]
    batch = sample(policy, processor, True, prompts=other)
    assert batch.prompt_ids.shape[1] != sample(policy, processor, False).prompt_ids.shape[1]
    assert counters["stats"]["unique_graphs"] == graphs
    assert torch.equal(batch.completion_ids, sample(policy, processor, False, prompts=other).completion_ids)


def test_each_prompt_draws_from_its_own_generator(policy, processor):
    """Eval batches its prompts: with one generator per prompt, a prompt's grids are the ones it gets alone."""
    seeds = [11, 12]
    batched = sample(policy, processor, False, generator=[torch.Generator().manual_seed(s) for s in seeds])
    for i, (prompt, seed) in enumerate(zip(PROMPTS, seeds)):
        alone = sample(policy, processor, False, prompts=[prompt], seed=seed)
        assert torch.equal(batched.completion_ids[i * G : (i + 1) * G], alone.completion_ids), prompt
    with pytest.raises(ValueError, match="one generator or one per prompt"):
        sample(policy, processor, False, generator=[torch.Generator()] * 3)


def test_an_eager_attention_model_samples_through_sdpa(tiny_model_dir, processor):
    """The loop's boolean masks are sdpa's: a model loaded with eager attention (additive masks) must still
    sample what the sdpa model samples, and get its attention setting back afterwards."""
    sdpa, eager = load_ar(tiny_model_dir, "fp32", "sdpa"), load_ar(tiny_model_dir, "fp32", "eager")
    a, b = sample(sdpa, processor, False), sample(eager, processor, False)
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert eager.model.language_model.config._attn_implementation == "eager"
    assert trainer_gap(eager, b) <= 1e-5
