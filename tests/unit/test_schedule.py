"""The lr schedule (transformers.get_scheduler behind optimizer.schedule / warmup_steps), by hand."""

import math

import pytest
import torch

from glm_grpo_ds.config import OptimizerConfig
from glm_grpo_ds.ds.engine import build_scheduler


def lrs(schedule: str, warmup: int, total: int) -> list[float]:
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=1.0)
    sched = build_scheduler(opt, OptimizerConfig(lr=1.0, schedule=schedule, warmup_steps=warmup), total)
    out = []
    for _ in range(total + 1):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_constant_without_warmup_is_the_base_lr():
    assert lrs("constant", 0, 5) == [1.0] * 6


@pytest.mark.parametrize("schedule", ["constant", "linear", "cosine"])
def test_warmup_rises_linearly_from_zero(schedule):
    assert lrs(schedule, 4, 10)[:5] == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0])


def test_linear_and_cosine_decay_to_zero():
    assert lrs("linear", 2, 10) == pytest.approx([0, 0.5, 1, 7 / 8, 6 / 8, 5 / 8, 4 / 8, 3 / 8, 2 / 8, 1 / 8, 0])
    cos = lrs("cosine", 0, 4)
    assert cos == pytest.approx([0.5 * (1 + math.cos(math.pi * k / 4)) for k in range(5)])
