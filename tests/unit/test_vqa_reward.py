"""The ``vqa`` reward (rewards/vqa.py) on a tiny Qwen2-VL with random weights (testing/tiny_vlm.py): P("Yes") equals
transformers' own generate() first-step distribution, a batch scores each image as it alone is scored (left padding,
the last position each row's own), its arguments are refused in one line, and the memory plan sizes the judge."""

import pytest
import torch

from glm_grpo_ds.memory.reward_models import reward_models, vlm_size
from glm_grpo_ds.rewards.registry import RewardError, build_reward
from glm_grpo_ds.rewards.vqa import QUESTION, VQAReward
from glm_grpo_ds.testing.tiny_vlm import build_tiny_vlm

# prompts of different lengths: a batch pads them; 64x64 and 2 images of a third size share a batch
PROMPTS = ["a red cube", "two blue balls on the left of a green box", "x"]


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory):
    return build_tiny_vlm(tmp_path_factory.mktemp("tiny_vlm"))


@pytest.fixture(scope="module")
def judge(vlm_dir):
    return VQAReward(str(vlm_dir), batch_size=3)


def _images(n: int) -> torch.Tensor:
    return torch.rand(n, 3, 64, 64, generator=torch.Generator().manual_seed(0))


def test_the_score_is_the_probability_generate_gives_the_answer(judge):
    images = _images(3)
    got = judge(images, PROMPTS)
    texts = judge.texts(PROMPTS)
    inputs = judge.processor(text=texts, images=list(images), padding=True, return_tensors="pt", do_rescale=False)
    out = judge.model.module.generate(
        **inputs, max_new_tokens=1, do_sample=False, output_logits=True, return_dict_in_generate=True
    )
    want = out.logits[0].float().softmax(-1)[:, judge.answer_id]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    assert got.shape == (3,) and ((0 < got) & (got < 1)).all() and len(set(got.tolist())) == 3


def test_a_batch_scores_each_image_as_alone_and_the_question_asks_the_prompt(judge, vlm_dir):
    images = _images(3)
    alone = torch.cat([judge(images[i : i + 1], PROMPTS[i : i + 1]) for i in range(3)])
    torch.testing.assert_close(judge(images, PROMPTS), alone, rtol=1e-5, atol=1e-7)
    small = VQAReward(str(vlm_dir), batch_size=2)  # a batch of 2 and one of 1
    torch.testing.assert_close(small(images, PROMPTS), alone, rtol=1e-5, atol=1e-7)
    assert 'Does this figure show "a red cube"?' in judge.texts(PROMPTS)[0]
    other = VQAReward(str(vlm_dir), question="Is {prompt} shown? Yes or no.", answer="No")
    assert "Is a red cube shown?" in other.texts(PROMPTS)[0] and other.answer_id != judge.answer_id
    assert not torch.allclose(other(images, PROMPTS), alone)


def test_arguments_are_refused_in_one_line(vlm_dir, tmp_path):
    with pytest.raises(RewardError, match="reward vqa needs args model"):
        VQAReward.check_args({})
    with pytest.raises(RewardError, match="no config.json"):
        VQAReward.check_args({"model": str(tmp_path)})
    with pytest.raises(RewardError, match="has no {prompt}"):
        VQAReward.check_args({"model": str(vlm_dir), "question": "Is it good?"})
    with pytest.raises(RewardError, match="batch_size 0"):
        VQAReward.check_args({"model": str(vlm_dir), "batch_size": 0})
    VQAReward.check_args({"model": str(vlm_dir), "question": QUESTION})
    assert isinstance(build_reward("vqa", {"model": str(vlm_dir)}), VQAReward)


def test_the_memory_plan_sizes_the_judge_from_its_config(vlm_dir, judge):
    n, b, source = vlm_size(str(vlm_dir))
    assert n == sum(p.numel() for p in judge.model.module.parameters()) and b == 4 and "config.json" in source
    qwen, qb, assumed = vlm_size("/nowhere/Qwen2.5-VL-7B-Instruct")
    assert (qwen, qb) == (8_292_166_656, 2) and "assumed Qwen2.5-VL-7B-Instruct" in assumed  # its card's 8.29B

    class Spec:
        name, args = "vqa", {"model": str(vlm_dir), "offload": True}

    (planned,) = reward_models([Spec()])
    assert (planned.where, planned.params, planned.bytes) == ("offload", n, 4 * n)
