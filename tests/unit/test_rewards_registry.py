"""Reward registry, plugins and the weighted combination."""

import pytest
import torch

from glm_grpo_ds.config import RewardSpec
from glm_grpo_ds.rewards import build_rewards
from glm_grpo_ds.rewards.registry import build_reward


def test_unknown_reward_lists_close_matches():
    with pytest.raises(ValueError, match="unknown reward 'pixel_mes'.*did you mean pixel_mse"):
        build_reward("pixel_mes", {})


def test_file_plugin_and_weighted_sum(tmp_path):
    plugin = tmp_path / "my_reward.py"
    plugin.write_text(
        "import torch\n"
        "def brightness(images, prompts, samples):\n    return images.mean(dim=(1, 2, 3))\n"
        "def make_const(value):\n    return lambda images, prompts, samples: torch.full((images.shape[0],), value)\n"
    )
    combined = build_rewards([
        RewardSpec(name=f"{plugin}:brightness", weight=2.0),
        RewardSpec(name=f"{plugin}:make_const", weight=0.5, args={"value": 3.0}),
    ])
    images = torch.stack([torch.full((3, 4, 4), 0.25), torch.full((3, 4, 4), 0.5)])
    total, per = combined(images, ["a", "b"], [{}, {}])
    torch.testing.assert_close(total, torch.tensor([2 * 0.25 + 1.5, 2 * 0.5 + 1.5]))
    assert set(per) == {f"{plugin}:brightness", f"{plugin}:make_const"}


def test_python_module_plugin():
    fn = build_reward("python:math:fabs", {})
    assert fn(-2.0) == 2.0
    with pytest.raises(ValueError, match="cannot import"):
        build_reward("python:no_such_module_xyz:f", {})


def test_pixel_mse_and_nan_is_refused_for_now(tmp_path):
    from PIL import Image

    Image.new("RGB", (8, 8), (255, 0, 0)).save(tmp_path / "red.png")
    combined = build_rewards([RewardSpec(name="pixel_mse")])
    red = torch.zeros(1, 3, 8, 8)
    red[:, 0] = 1.0
    total, _ = combined(red, ["p"], [{"target_image": str(tmp_path / "red.png")}])
    assert total.item() == pytest.approx(0.0, abs=1e-6)
    black = torch.zeros(1, 3, 8, 8)
    total, _ = combined(black, ["p"], [{"target_image": str(tmp_path / "red.png")}])
    assert total.item() == pytest.approx(-1 / 3, abs=1e-6)
    with pytest.raises(ValueError, match="pixel_mse is undefined"):
        combined(black, ["p"], [{}])
