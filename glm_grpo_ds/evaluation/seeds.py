"""The one seed scheme of every evaluation: prompt row i of an evaluation seeded ``s`` draws its tokens from the
stream seeded ``derive_seed(s, "eval-rollout", i)`` (the sampling backend's generator on its device,
rollout/backends.py) and its decoder noise from ``derive_seed(s, "eval-decode", i)``.

Training's evaluation (``eval.seed``, evaluation/in_training.py) and ``glm-grpo evaluate`` (``--seed``, default
``eval.seed``; evaluation/paired.py) both use it, so for the same seed, prompts and sample count the final in-run
evaluation and ``glm-grpo evaluate`` of that run's adapter draw the same samples (up to the floating-point rounding
of differently padded batches). A prompt's seeds depend on (seed, row) only: not on the step, the training
``seed``, the rank count or which prompts share its batch. Tested in tests/integration/test_evaluate_command.py.
"""

from __future__ import annotations

from ..runtime.seeding import derive_seed

# recorded in glm-grpo evaluate's settings: a stored batch sampled under another scheme is not reused
SCHEME = "eval-rollout/eval-decode"


def rollout_seeds(seed: int, rows) -> list[int]:
    """One sampling seed per row (each row's samples from its own stream, whatever else shares the batch)."""
    return [derive_seed(seed, "eval-rollout", row.index) for row in rows]


def decode_seed(seed: int, row_index: int) -> int:
    """The decoder noise seed of row ``row_index``'s samples (the same for all of them)."""
    return derive_seed(seed, "eval-decode", row_index) % 2**31
