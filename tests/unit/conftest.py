"""Fixtures the unit tests share."""

import pytest
import torch


@pytest.fixture
def preview_batch():
    """A 2-row RolloutBatch of 3 preview + 2 target tokens (1x3 and 1x2 grids), every token in the loss."""
    from glm_grpo_ds.rollout import GridSpec, RolloutBatch

    grid = GridSpec(large=(1, 2), preview=(1, 3))
    n = grid.num_tokens
    return RolloutBatch(
        prompt_ids=torch.zeros(2, 4, dtype=torch.long),
        prompt_mask=torch.ones(2, 4, dtype=torch.long),
        completion_ids=torch.zeros(2, n, dtype=torch.long),
        completion_mask=torch.ones(2, n),
        sampler_logps=torch.zeros(2, n),
        position_ids=torch.zeros(3, 2, 4 + n, dtype=torch.long),
        prompt_index=torch.zeros(2, dtype=torch.long),
        prompts=["p", "p"],
        grid=grid,
    )
