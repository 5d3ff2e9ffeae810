"""The offline text-rendering benchmark: the generated prompt set (glm_grpo_ds/data/text_prompts.py) and the two
per-region OCR scores (glm_grpo_ds/rewards/ocr.py ``ocr_word_accuracy``, ``ocr_region_ned``) on images with the
text drawn by PIL: right, misspelt, half missing, and none."""

import json

import pytest
import torch
from PIL import Image, ImageDraw, ImageFont

from glm_grpo_ds.commands.text_prompts import main as text_prompts_main
from glm_grpo_ds.data.text_prompts import text_prompts
from glm_grpo_ds.rewards import build_reward
from glm_grpo_ds.rewards.ocr import text_regions

PROMPT = 'A poster with the title "HELLO WORLD" and below it "FRESH BREAD"'


def drawn(*lines: str) -> torch.Tensor:
    img = Image.new("RGB", (480, 64 + 72 * len(lines)), "white")
    draw = ImageDraw.Draw(img)
    for i, line in enumerate(lines):
        draw.text((16, 24 + 72 * i), line, fill="black", font=ImageFont.load_default(size=44))
    x = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8).view(img.height, img.width, 3)
    return x.permute(2, 0, 1).float().div(255)


@pytest.fixture(scope="module")
def scores():
    pytest.importorskip("rapidocr_onnxruntime")
    images = [drawn("HELLO WORLD", "FRESH BREAD"), drawn("HELO WORLD", "FRESH BREAD"), drawn("HELLO WORLD"), drawn()]
    batch = torch.stack([torch.nn.functional.pad(x, (0, 0, 0, 208 - x.shape[1]), value=1.0) for x in images])
    samples = [{}] * 4
    words = build_reward("ocr_word_accuracy", {})(batch, [PROMPT] * 4, samples)
    ned = build_reward("ocr_region_ned", {})(batch, [PROMPT] * 4, samples)
    return words.tolist(), ned.tolist()


def test_word_accuracy_counts_the_regions_words(scores):
    words, _ = scores
    assert words[0] == 1.0  # all four words read
    assert words[1] == 0.75  # "HELO" is not "HELLO"
    assert words[2] == 0.5  # the second region is missing
    assert words[3] == 0.0  # nothing drawn, nothing read


def test_region_ned_is_per_region(scores):
    _, ned = scores
    assert ned[0] == 1.0
    assert ned[1] == pytest.approx((1 - 1 / 10 + 1.0) / 2, abs=0.02)  # one deletion in "HELLOWORLD" (spaces out)
    assert ned[2] == pytest.approx(0.5, abs=0.1)  # one region right, the other absent
    assert ned[3] == 0.0


def test_regions_and_the_generated_prompt_set(tmp_path):
    assert text_regions(PROMPT, {}) == ["HELLO WORLD", "FRESH BREAD"]
    assert text_regions("no quotes", {"text": ["A", "B C"]}) == ["A", "B C"]
    assert text_regions("no quotes", {}) is None
    rows = text_prompts(9, seed=3)
    assert rows == text_prompts(9, seed=3) and rows != text_prompts(9, seed=4)
    assert {r["category"] for r in rows} == {"one_region", "two_regions"}
    for r in rows:  # the quoted spans are the regions, in order
        assert text_regions(r["prompt"], {}) == r["text"]
    out = tmp_path / "p.jsonl"
    assert text_prompts_main([str(out), "--num", "5"]) == 0
    assert [json.loads(line) for line in out.read_text().splitlines()] == text_prompts(5, 0)
    assert text_prompts_main([str(out), "--num", "0"]) == 2
