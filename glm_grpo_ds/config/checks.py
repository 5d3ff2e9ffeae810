"""Checks the config sections share: how a section reports its problems, and the problems of a decode's
settings, which the training decode (``decoder.*``), the evaluation decode (``eval.*``) and
``glm-grpo decode-agreement``'s candidates all have."""

from __future__ import annotations

import math


def raise_problems(problems: list[str]) -> None:
    """The one way a config section reports problems: ValueError with one line per problem (TrainConfig.validate
    raises its ConfigError, a ValueError, the same way for the whole config)."""
    if problems:
        raise ValueError("\n".join(problems))


def need(problems: list[str], ok: bool, msg: str) -> None:
    """``msg`` joins ``problems`` unless ``ok``: a section's check written as the rule it keeps."""
    if not ok:
        problems.append(msg)


def decode_problems(
    num_inference_steps: int | None, guidance_scale: float | None, prefix: str, guidance_steps: int | None = None
) -> list[str]:
    """The problems of a decode's settings (decoder.*, eval.*; None = the pipeline's own, fine)."""
    problems = []
    if num_inference_steps is not None and num_inference_steps < 1:
        problems.append(f"{prefix}num_inference_steps must be >= 1, got {num_inference_steps}")
    if guidance_scale is not None and not 0 < guidance_scale < math.inf:
        problems.append(f"{prefix}guidance_scale must be > 0 and finite (<= 1: no guidance pass), got {guidance_scale}")
    if guidance_steps is not None:
        steps = num_inference_steps
        if guidance_steps < 1 or (steps is not None and guidance_steps > steps):
            problems.append(
                f"{prefix}guidance_steps must be between 1 and num_inference_steps ({steps}), got {guidance_steps} "
                "(null = guidance on every step; guidance_scale 1 = on none)"
            )
        elif guidance_scale is not None and guidance_scale <= 1:
            problems.append(
                f"{prefix}guidance_steps={guidance_steps} limits a guidance that guidance_scale={guidance_scale:g} "
                "turns off: set guidance_scale > 1 or drop guidance_steps"
            )
    return problems
