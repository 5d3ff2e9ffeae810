"""Rewards: one file per reward, a registry, and the weighted combination.

A reward is a callable ``reward(images, prompts, samples) -> Tensor[N]``:

* ``images``: float ``[N, 3, H, W]`` in [0, 1] on the rank's device;
* ``prompts``: N strings;
* ``samples``: N dicts with the dataset row's fields (``target_image``, ``text``, and any extra
  JSONL keys).

Configure them by name with weights and arguments (``rewards: [{name: pixel_mse, weight: 1.0}]``),
or load your own with ``name: python:package.module:function`` / ``name: path/to/file.py:function``.
"""

from .registry import CombinedReward, build_rewards, register_reward

__all__ = ["CombinedReward", "build_rewards", "register_reward"]
