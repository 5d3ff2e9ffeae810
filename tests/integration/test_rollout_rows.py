"""More rows per decode step (issue #51 item 3), on the CPU in fp32 with the tiny GLM-Image and real peft LoRA: a
rollout of four prompts of different lengths (so each is left-padded by its own amount) x G rows, one generator per
prompt, samples for every row the tokens that prompt gets when it is sampled alone (no padding) with an identically
seeded generator, and the log-probs within verify-logprobs' fp32 tolerance; with the eager loop and with the whole
step compiled. So a row does not depend on its batch-mates, and several prompts' groups can share one decode batch
(``batch.prompts_per_rank`` x G rows) without changing what a prompt samples. Measured on 2 cores: the eager rows
equal the alone rows bitwise (log-probs too), the compiled ones within 4.8e-7; ~26 s with one thread (4 rollouts
alone ~4 s, the batched eager one ~2 s, the compiled one ~20 s, nearly all of it its compile).
"""

import pytest
import torch

from glm_grpo_ds.commands.verify_logprobs import VerifyConfig
from glm_grpo_ds.config import SamplingConfig
from glm_grpo_ds.rollout import rollout
from glm_grpo_ds.rollout.decode_loop import LoopOptions

# four prompts of four token lengths: the batched rollout left-pads all but the longest, each by its own amount
PROMPTS = [
    "a red cube",
    "a lighthouse on a cliff at sunset with a sign that says 'KEEP OUT'",
    "two cats",
    "a bowl of ripe oranges on a wooden table",
]
SAMPLING = SamplingConfig(temperature=0.9, top_k=12, top_p=0.9)
G = 4  # 4 prompts x 4 = 16 rows in one decode batch
SEEDS = [21, 22, 23, 24]
TOLERANCE = VerifyConfig.DEFAULT_TOLERANCE["fp32"]  # what glm-grpo verify-logprobs accepts in fp32


def generators():
    return [torch.Generator().manual_seed(s) for s in SEEDS]


def sample(policy, processor, prompts, gens, options=LoopOptions()):
    return rollout(policy, processor, prompts, G, 64, 64, SAMPLING, gens, loop=options)


@pytest.fixture(scope="module")
def alone(policy, processor):
    """Each prompt's G rows sampled alone (eager loop, no padding), its generator seeded as in the batch."""
    return [sample(policy, processor, [p], [g]) for p, g in zip(PROMPTS, generators())]


def assert_rows_are_their_prompts_alone(batched, alone):
    padding = (batched.prompt_mask == 0).sum(dim=1)[::G].tolist()
    assert len(set(padding)) == len(PROMPTS) and min(padding) == 0, padding  # each prompt padded by its own amount
    assert len(batched) == len(PROMPTS) * G and batched.prompts == [p for p in PROMPTS for _ in range(G)]
    for i, one in enumerate(alone):
        rows = slice(i * G, (i + 1) * G)
        assert bool(one.prompt_mask.all())  # alone: no padding
        assert torch.equal(batched.completion_ids[rows], one.completion_ids), PROMPTS[i]
        gap = (batched.sampler_logps[rows] - one.sampler_logps).abs().max().item()
        assert gap <= TOLERANCE, (PROMPTS[i], gap)
    # the rows of a group differ, and no two groups are copies: the generators reach the draws
    ids = batched.completion_ids
    assert not torch.equal(ids[0], ids[1])
    assert all(not torch.equal(ids[i * G : (i + 1) * G], ids[j * G : (j + 1) * G]) for i in range(4) for j in range(i))


def test_each_row_samples_what_its_prompt_samples_alone(policy, processor, alone):
    assert_rows_are_their_prompts_alone(sample(policy, processor, PROMPTS, generators()), alone)


def test_each_row_samples_what_its_prompt_samples_alone_with_the_whole_step_compiled(policy, processor, alone):
    compiled = sample(policy, processor, PROMPTS, generators(), LoopOptions(compile=True))
    assert_rows_are_their_prompts_alone(compiled, alone)
