"""The rollout's draw (glm_grpo_ds/sampling.py) and the decode loop's static shapes
(glm_grpo_ds/rollout/decode_loop.py), against torch.multinomial and hand-written masks."""

import pytest
import torch

from glm_grpo_ds.rollout.decode_loop import CACHE_BUCKET, cache_slots, prefill_mask
from glm_grpo_ds.sampling import draw_ids, race_noise


def probs(rows=16, vocab=40, seed=0):
    p = torch.softmax(torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 2, -1)
    p[:, 30:] = 0  # forbidden ids (outside the codebook / the top-k cut) have probability 0
    return p / p.sum(-1, keepdim=True)


def test_the_race_draws_what_torch_multinomial_draws_with_the_same_generator():
    p = probs()
    logp = p.log()
    ours, theirs = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    for _ in range(300):
        ids, lp = draw_ids(logp, p, race_noise(p, [ours]))
        assert torch.equal(ids, torch.multinomial(p, 1, generator=theirs).squeeze(1))
        assert torch.equal(lp, logp.gather(1, ids[:, None]).squeeze(1))
        assert (ids < 30).all()


def test_one_generator_per_block_draws_as_each_block_alone():
    p = probs(rows=12)
    seeds = [5, 6, 7]
    noise = race_noise(p, [torch.Generator().manual_seed(s) for s in seeds])
    ids, _ = draw_ids(p.log(), p, noise)
    for i, s in enumerate(seeds):
        alone = torch.multinomial(p[4 * i : 4 * (i + 1)], 1, generator=torch.Generator().manual_seed(s)).squeeze(1)
        assert torch.equal(ids[4 * i : 4 * (i + 1)], alone)
    with pytest.raises(ValueError, match="equal blocks"):
        race_noise(p, [None] * 5)


def test_the_race_follows_the_distribution():
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0]]).expand(20000, 4)
    ids, _ = draw_ids(p.log(), p, race_noise(p, [torch.Generator().manual_seed(0)]))
    freq = torch.bincount(ids, minlength=4).float() / len(ids)
    assert freq[3] == 0 and torch.allclose(freq[:3], torch.tensor([0.5, 0.3, 0.2]), atol=0.015)


def test_cache_slots_round_up_to_the_bucket():
    assert CACHE_BUCKET == 128
    assert [cache_slots(p, n) for p, n in ((30, 98), (30, 99), (1, 1), (200, 1280))] == [128, 256, 128, 1536]


def test_prefill_mask_by_hand():
    # 2 rows, prompt of 3 slots (row 1 left-padded by one), 5 cache slots: slots 3-4 are generated later
    valid = torch.tensor([[1, 1, 1, 1, 0], [0, 1, 1, 1, 0]], dtype=torch.bool)
    m = prefill_mask(valid, 3)
    assert m.shape == (2, 1, 3, 5)
    expected0 = [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]]
    expected1 = [[1, 0, 0, 0, 0], [0, 1, 0, 0, 0], [0, 1, 1, 0, 0]]  # the padding query sees itself only
    assert m[0, 0].int().tolist() == expected0 and m[1, 0].int().tolist() == expected1
