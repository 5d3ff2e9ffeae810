"""The ``vqa`` reward (rewards/vqa.py) on tiny Qwen2-VL and Gemma 3 models with random weights (testing/tiny_vlm.py):
P("Yes") equals transformers' own generate() first-step distribution, a batch scores each image as it alone is
scored (left padding, the last position each row's own; one image list per prompt; no second BOS after Gemma's
template), its arguments and a model without a chat template are refused in one line, and the memory plan sizes
the judge."""

import json
import shutil

import pytest
import torch

from glm_grpo_ds.memory.reward_models import reward_models, vlm_size
from glm_grpo_ds.rewards.registry import RewardError, build_reward
from glm_grpo_ds.rewards.vqa import QUESTION, VQAReward
from glm_grpo_ds.testing.tiny_vlm import FAMILIES, build_tiny_vlm

# prompts of different lengths: a batch pads them; 64x64 and 2 images of a third size share a batch
PROMPTS = ["a red cube", "two blue balls on the left of a green box", "x"]


@pytest.fixture(scope="module")
def vlm_dirs(tmp_path_factory):
    return {family: build_tiny_vlm(tmp_path_factory.mktemp(family), family) for family in FAMILIES}


@pytest.fixture(scope="module")
def vlm_dir(vlm_dirs):
    return vlm_dirs["qwen2_vl"]


@pytest.fixture(scope="module", params=list(FAMILIES))
def judge(request, vlm_dirs):
    return VQAReward(str(vlm_dirs[request.param]), batch_size=3)


def _images(n: int) -> torch.Tensor:
    return torch.rand(n, 3, 64, 64, generator=torch.Generator().manual_seed(0))


def test_the_score_is_the_probability_generate_gives_the_answer(judge):
    images = _images(3)
    got = judge(images, PROMPTS)
    inputs = judge.inputs(images, judge.texts(PROMPTS))
    bos = judge.processor.tokenizer.bos_token_id
    if bos is not None:  # Gemma's template writes the BOS: the tokenizer adds no second one
        assert [
            (row[mask.bool()] == bos).sum().item() for row, mask in zip(inputs["input_ids"], inputs["attention_mask"])
        ] == [1, 1, 1]
    out = judge.model.module.generate(
        **inputs, max_new_tokens=1, do_sample=False, output_logits=True, return_dict_in_generate=True
    )
    want = out.logits[0].float().softmax(-1)[:, judge.answer_id]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    assert got.shape == (3,) and ((0 < got) & (got < 1)).all() and len(set(got.tolist())) == 3


def test_a_batch_scores_each_image_as_alone_and_the_question_asks_the_prompt(judge):
    images = _images(3)
    alone = torch.cat([judge(images[i : i + 1], PROMPTS[i : i + 1]) for i in range(3)])
    torch.testing.assert_close(judge(images, PROMPTS), alone, rtol=1e-5, atol=1e-7)
    judge.batch_size = 2  # a batch of 2 and one of 1
    torch.testing.assert_close(judge(images, PROMPTS), alone, rtol=1e-5, atol=1e-7)
    judge.batch_size = 3
    assert 'Does this figure show "a red cube"?' in judge.texts(PROMPTS)[0]


def test_the_question_and_answer_are_the_users(vlm_dir):
    judge, images = VQAReward(str(vlm_dir)), _images(3)
    other = VQAReward(str(vlm_dir), question="Is {prompt} shown? Yes or no.", answer="No")
    assert "Is a red cube shown?" in other.texts(PROMPTS)[0] and other.answer_id != judge.answer_id
    assert not torch.allclose(other(images, PROMPTS), judge(images, PROMPTS))


def test_a_rows_own_questions_are_each_asked_and_averaged(vlm_dir):
    """A row's ``questions`` (TIFA / DSG style): its reward is the mean over them of P("Yes"), each asked as written
    (the same as a judge whose template is the question itself); a row without them is asked the template."""
    judge, images = VQAReward(str(vlm_dir), batch_size=2), _images(3)
    own = [["Is it red?", "Is it round?"], None, ["Is there a car?"]]
    samples = [{"questions": q} if q else {} for q in own]
    got = judge(images, PROMPTS, samples)
    plain = VQAReward(str(vlm_dir), question="{prompt}")
    each = [plain(images[i : i + 1].expand(len(q), -1, -1, -1), q) for i, q in enumerate(own) if q]
    torch.testing.assert_close(got[[0, 2]], torch.stack([e.mean() for e in each]), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(got[1], judge(images[1:2], PROMPTS[1:2])[0], rtol=1e-5, atol=1e-7)
    with pytest.raises(RewardError, match="row 7's questions must be a non-empty list"):
        judge(images[:1], PROMPTS[:1], [{"questions": "Is it red?", "index": 7}])


def test_image_size_scores_the_images_resized_first(vlm_dir):
    """image_size 40: the 64x96 images are scored as the same images resized (bicubic, antialiased) to 40 on their
    longer side would be; 0 leaves them as rendered."""
    images = torch.rand(2, 3, 64, 96, generator=torch.Generator().manual_seed(1))
    small = VQAReward(str(vlm_dir), image_size=40)
    resized = torch.nn.functional.interpolate(images, size=(27, 40), mode="bicubic", antialias=True)
    as_is = VQAReward(str(vlm_dir))
    torch.testing.assert_close(small(images, PROMPTS[:2]), as_is(resized, PROMPTS[:2]), rtol=1e-5, atol=1e-7)
    assert not torch.allclose(as_is(images, PROMPTS[:2]), as_is(resized, PROMPTS[:2]))


def test_arguments_are_refused_in_one_line(vlm_dir, tmp_path):
    with pytest.raises(RewardError, match="reward vqa needs args model"):
        VQAReward.check_args({})
    with pytest.raises(RewardError, match="no config.json"):
        VQAReward.check_args({"model": str(tmp_path)})
    with pytest.raises(RewardError, match="has no {prompt}"):
        VQAReward.check_args({"model": str(vlm_dir), "question": "Is it good?"})
    with pytest.raises(RewardError, match="batch_size 0"):
        VQAReward.check_args({"model": str(vlm_dir), "batch_size": 0})
    with pytest.raises(RewardError, match="image_size -1"):
        VQAReward.check_args({"model": str(vlm_dir), "image_size": -1})
    VQAReward.check_args({"model": str(vlm_dir), "question": QUESTION})
    assert isinstance(build_reward("vqa", {"model": str(vlm_dir)}), VQAReward)
    base = tmp_path / "base"  # an instruction-less checkpoint: refused when built, not at its first score
    shutil.copytree(vlm_dir, base)
    for name in ("chat_template.jinja", "chat_template.json"):
        (base / name).unlink(missing_ok=True)
    config = json.loads((base / "processor_config.json").read_text())
    (base / "processor_config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "chat_template"}))
    tok = json.loads((base / "tokenizer_config.json").read_text())
    (base / "tokenizer_config.json").write_text(json.dumps({k: v for k, v in tok.items() if k != "chat_template"}))
    with pytest.raises(RewardError, match="has no chat template"):
        VQAReward(str(base))
    with pytest.raises(RewardError, match="has no chat template"):  # and train --check says so before the job runs
        VQAReward.check_args({"model": str(base)})
    (base / "tokenizer_config.json").write_text(json.dumps(tok | {"chat_template": "{{ messages }}"}))  # one too
    VQAReward.check_args({"model": str(base)})


def test_the_memory_plan_sizes_the_judge_from_its_config(vlm_dir):
    n, b, source = vlm_size(str(vlm_dir))
    judge = VQAReward(str(vlm_dir))
    assert n == sum(p.numel() for p in judge.model.module.parameters()) and b == 4 and "config.json" in source
    qwen, qb, assumed = vlm_size("/nowhere/Qwen2.5-VL-7B-Instruct")
    assert (qwen, qb) == (8_292_166_656, 2) and "assumed Qwen2.5-VL-7B-Instruct" in assumed  # its card's 8.29B
    assert vlm_size("org/na me")[0] == qwen  # not a Hub id: no traceback (the reward's check says what is wrong)

    class Spec:
        name, args = "vqa", {"model": str(vlm_dir), "offload": True}

    (planned,) = reward_models([Spec()])
    assert (planned.where, planned.params, planned.bytes) == ("offload", n, 4 * n)


def test_the_judge_keeps_no_kv_cache(judge):
    """One forward reads one position: a KV cache would hold every layer's keys and values for nothing (the memory
    plan's judge forward counts none)."""
    caches = []
    hook = judge.model.module.register_forward_hook(lambda module, args, out: caches.append(out.past_key_values))
    try:
        judge(_images(3), PROMPTS)
    finally:
        hook.remove()
    assert caches == [None]


def test_the_judges_scoring_activations_by_hand(vlm_dirs):
    """memory/reward_models.vlm_scoring per image: the pixels in the model's dtype + the larger of the tower's and
    the language model's working set, one layer's (no_grad), by hand for Qwen2.5-VL-7B, Qwen2-VL-7B (its tower's width
    is embed_dim, its hidden_size the merger's output, its MLP embed_dim x mlp_ratio) and the tiny Gemma 3 (a
    fixed-size tower)."""
    from transformers import AutoConfig, Qwen2_5_VLConfig, Qwen2VLConfig

    from glm_grpo_ds.memory.reward_models import QUESTION_TOKENS, QWEN25_VL_7B, vlm_scoring

    q = QUESTION_TOKENS
    conf = Qwen2_5_VLConfig(**QWEN25_VL_7B)
    conf.dtype = torch.bfloat16
    # 1024 px: ceil(1024 / 28)^2 = 1369 tokens, 4 x 1369 patches of 3 x 2 x 14^2 pixels; the language model's
    # (1369 + q) x (2 x 3584 + 3 x 18944) + the tower's output 1369 x 3584 beats the tower's
    # 5476 x (2 x 1280 + 3 x 3420)
    pixels = 4 * 1369 * 3 * 2 * 14**2
    language = (1369 + q) * (2 * 3584 + 3 * 18944) + 1369 * 3584
    assert 5476 * (2 * 1280 + 3 * 3420) < language
    assert vlm_scoring(conf, 8, 1024) == (8 * 2 * (pixels + language), 1369)
    assert vlm_scoring(conf, 1, 448) == (2 * (4 * 256 * 1176 + (256 + q) * 64_000 + 256 * 3584), 256)
    # Qwen2-VL-7B's published widths with a 4-layer language model of width 64 (MLP 128): the tower decides,
    # 4 x 1369 patches x (2 x 1280 + 3 x 5120)
    vision = dict(embed_dim=1280, hidden_size=3584, mlp_ratio=4, num_heads=16, depth=32)
    text = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4)
    qwen2 = Qwen2VLConfig(vision_config=vision, text_config=text)
    qwen2.dtype = torch.bfloat16
    tower = 5476 * (2 * 1280 + 3 * 5120)
    assert vlm_scoring(qwen2, 2, 1024) == (2 * 2 * (pixels + tower), 1369)
    gemma = AutoConfig.from_pretrained(vlm_dirs["gemma3"])  # fp32, a 28 px tower of 7 px patches: 16 patches, 4 tokens
    tower, language = 16 * (2 * 32 + 3 * 64), (4 + q) * (2 * 32 + 3 * 64) + 4 * 32
    assert vlm_scoring(gemma, 1, 1024) == (4 * (3 * 28**2 + max(tower, language)), 4)


def test_every_image_text_to_text_judge_is_planned_or_said_not_estimated():
    """estimate-memory and the startup plan never fail on a judge transformers loads: each model_type's default
    config gets a scoring figure (the Qwen-VL family, Gemma 3, PaliGemma) or None, which the plan lists as not
    estimated, naming the model_type."""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    from glm_grpo_ds.memory.reward_models import DYNAMIC_TOWERS, FIXED_TOWERS, vlm_scoring

    planned = {}
    for model_type in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        if model_type in CONFIG_MAPPING:
            planned[model_type] = vlm_scoring(CONFIG_MAPPING[model_type](), 8, 1024)
    known = {t for t, got in planned.items() if got is not None}
    assert known == set(DYNAMIC_TOWERS + FIXED_TOWERS) & set(planned) and {"qwen2_5_vl", "gemma3"} <= known
    assert all(nbytes > 0 and tokens > 0 for nbytes, tokens in (planned[t] for t in known))
