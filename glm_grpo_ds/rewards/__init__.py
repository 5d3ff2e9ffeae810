"""Rewards: one file per reward and a registry (their weighted combination into advantages: advantages.py).

A reward is a callable ``reward(images, prompts, samples) -> Tensor[N]``:

* ``images``: float ``[N, 3, H, W]`` in [0, 1] on the rank's device;
* ``prompts``: N strings;
* ``samples``: N dicts with the dataset row's fields (``target_image``, ``text``, ``index`` and
  any extra JSONL keys).

NaN means "undefined for this sample" (no target image, no text to render). A reward declares the
sample field it needs as ``needs = SampleNeed(...)`` (rewards/base.py); a prompt file where no row has
it is refused at startup. Configure rewards by
name with weights and arguments (``rewards: [{name: ocr, weight: 2.0}, {name: lpips, args: {net: vgg}}]``),
or load your own with ``name: python:package.module:function`` / ``name: path/to/file.py:function``.
Built-ins: pixel_mse, lpips, ssim, ocr, ocr_word_accuracy, ocr_region_ned, clip, preference, aesthetic, colour_layout
(see each module's docstring),
and remote (a reward served by ``glm-grpo reward-server`` on other GPUs / nodes: remote/: client.py, serving.py,
protocol.py).
"""

from .registry import (
    REWARDS,
    RewardError,
    RewardSet,
    build_reward,
    build_rewards,
    builtin_names,
    check_reward_inputs,
    check_reward_specs,
    reward_needs,
)

__all__ = [
    "REWARDS",
    "RewardError",
    "RewardSet",
    "build_reward",
    "build_rewards",
    "builtin_names",
    "check_reward_inputs",
    "check_reward_specs",
    "reward_needs",
]
