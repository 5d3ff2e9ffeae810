"""colour_layout reward: prompt grammar, hand-computed scores, best reward under a limited palette."""

import pytest
import torch

from glm_grpo_ds.rewards import build_reward
from glm_grpo_ds.rewards.colour_layout import best_reward, prompt_cells, prompt_target

RED, BLUE = torch.tensor([1.0, 0, 0]), torch.tensor([0, 0, 1.0])


def _image(cells):
    """[1, 3, 32*rows, 32*cols] from a rows x cols list of RGB tensors."""
    grid = torch.stack([torch.stack(row) for row in cells])  # [h, w, 3]
    return grid.permute(2, 0, 1).repeat_interleave(32, 1).repeat_interleave(32, 2).unsqueeze(0)


def test_layouts():
    assert prompt_cells("Red image", 2, 2) == [["red", "red"], ["red", "red"]]
    assert prompt_cells("red on the left, blue on the right", 2, 4) == [["red", "red", "blue", "blue"]] * 2
    assert prompt_cells("red on top, blue at the bottom", 2, 1) == [["red"], ["blue"]]
    sq = prompt_cells("a red square on a blue background", 4, 4)
    assert [row.count("red") for row in sq] == [0, 2, 2, 0]
    with pytest.raises(ValueError, match="not a colour layout"):
        prompt_cells("a cat", 2, 2)


def test_reward_hand_computed():
    reward = build_reward("colour_layout", {})
    prompt = "red on the left, blue on the right"
    exact = _image([[RED, BLUE], [RED, BLUE]])
    swapped = _image([[BLUE, RED], [BLUE, RED]])
    # one cell magenta (1,0,1) instead of red: error 1/3 on 1 of 4 cells -> 1 - 1/12
    one_off = _image([[torch.tensor([1.0, 0, 1]), BLUE], [RED, BLUE]])
    grey = torch.full((1, 3, 64, 64), 0.5)
    values = reward(torch.cat([exact, swapped, one_off, grey]), [prompt] * 4, [{}] * 4)
    torch.testing.assert_close(values, torch.tensor([1.0, 1 - 2 / 3, 1 - 1 / 12, 0.5]))
    assert torch.equal(prompt_target(prompt, 64, 64), exact[0])


def test_each_prompt_s_target_is_built_once_and_every_row_scored_against_its_own(monkeypatch):
    """A group's G rows share a prompt: its target is built (and copied to the device) once, not per row, and rows
    of two prompts in any order each meet their own."""
    from glm_grpo_ds.rewards import colour_layout

    built = []
    monkeypatch.setattr(colour_layout, "prompt_target", lambda p, h, w: (built.append(p), prompt_target(p, h, w))[1])
    left_red, left_blue = "red on the left, blue on the right", "blue on the left, red on the right"
    red_blue, blue_red = _image([[RED, BLUE], [RED, BLUE]]), _image([[BLUE, RED], [BLUE, RED]])
    images = torch.cat([red_blue, blue_red, blue_red, red_blue, red_blue])
    values = build_reward("colour_layout", {})(images, [left_red, left_blue, left_red, left_blue, left_red], [{}] * 5)
    torch.testing.assert_close(values, torch.tensor([1.0, 1.0, 1 - 2 / 3, 1 - 2 / 3, 1.0]))
    assert built == [left_red, left_blue]


def test_best_reward_with_a_limited_palette():
    palette = torch.tensor([[1.0, 0, 0], [0, 0, 0]])  # red and black only
    assert best_reward("red image", palette, 64, 64) == 1.0
    # blue cells: black is closest (error 1/3); half the cells blue -> 1 - 1/6
    assert best_reward("red on top, blue at the bottom", palette, 64, 64) == pytest.approx(1 - 1 / 6)
