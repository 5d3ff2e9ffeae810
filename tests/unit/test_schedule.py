"""The lr schedule (transformers.get_scheduler behind optimizer.schedule / warmup_steps), by hand."""

import copy
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


# ----------------------------------------------------------------------------- a resume's optimizer settings
def _trained(opt_cfg, steps: int, total: int = 10, seed: int = 0):
    """A parameter (4096 elements: bitsandbytes keeps 8-bit states from that size) trained ``steps`` optimizer
    steps with ``opt_cfg``: (param, optimizer, scheduler)."""
    from glm_grpo_ds.ds.engine import build_optimizer

    torch.manual_seed(seed)
    param = torch.nn.Parameter(torch.randn(64, 64))
    opt = build_optimizer([param], opt_cfg)
    sched = build_scheduler(opt, opt_cfg, total)
    for _ in range(steps):
        _step(param, opt, sched)
    return param, opt, sched


def _step(param, opt, sched):
    param.grad = torch.sin(param.detach() * 3.0) + 0.1  # a gradient that depends on the weights: steps differ
    opt.step()
    sched.step()


def _resumed(saved, opt_cfg, total: int = 10, apply: bool = True):
    """What DeepSpeed's load_checkpoint does with a client optimizer and scheduler built from this launch's
    ``opt_cfg``: torch's load_state_dict of both (the param groups' hyper-parameters and the scheduler's
    base_lrs come from the checkpoint), then, with ``apply``, ds/engine.apply_optimizer_settings."""
    from glm_grpo_ds.ds.engine import apply_optimizer_settings, build_optimizer

    param, opt_state, sched_state = copy.deepcopy(saved)  # torch's load_state_dict may alias the saved tensors
    param = torch.nn.Parameter(param)
    opt = build_optimizer([param], opt_cfg)
    sched = build_scheduler(opt, opt_cfg, total)
    opt.load_state_dict(opt_state)
    sched.load_state_dict(sched_state)
    lr = apply_optimizer_settings(opt.param_groups, sched, opt_cfg) if apply else None
    return param, opt, sched, lr


def _save(param, opt, sched):
    return param.detach().clone(), copy.deepcopy(opt.state_dict()), copy.deepcopy(sched.state_dict())


HYPER = ("lr", "betas", "eps", "weight_decay", "initial_lr")


@pytest.mark.parametrize("name", ["adamw", "adamw_8bit"])
def test_a_resume_with_the_same_settings_continues_bitwise(name):
    """Linear decay after a warmup, stopped mid-warmup: the re-applied settings are the ones the checkpoint had, and
    4 more steps give the same weights and lrs, bit for bit, as the run that never stopped."""
    cfg = OptimizerConfig(name=name, lr=3e-3, schedule="linear", warmup_steps=4, weight_decay=0.01)
    param, opt, sched = _trained(cfg, 3)
    saved = _save(param, opt, sched)
    p2, opt2, sched2, lr = _resumed(saved, cfg)
    assert lr == opt.param_groups[0]["lr"] == 3e-3 * 3 / 4
    assert {k: opt2.param_groups[0][k] for k in HYPER} == {k: opt.param_groups[0][k] for k in HYPER}
    for _ in range(4):
        _step(param, opt, sched)
        _step(p2, opt2, sched2)
        assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    assert torch.equal(p2, param)


@pytest.mark.parametrize("name", ["adamw", "adamw_8bit"])
def test_a_resume_with_other_optimizer_settings_runs_with_them_from_its_first_step(name):
    """The checkpoint trained at lr 3e-3, betas (0.9, 0.999), no weight decay; the resumed launch says lr 1e-3,
    betas (0.8, 0.99), eps 1e-6, weight decay 0.1. Loaded as DeepSpeed loads it, the old values stay in force
    (the issue's bug); re-applied, every group holds the new ones and the schedule continues at its position."""
    old = OptimizerConfig(name=name, lr=3e-3)
    new = OptimizerConfig(name=name, lr=1e-3, betas=[0.8, 0.99], eps=1e-6, weight_decay=0.1)
    saved = _save(*_trained(old, 3))
    _, stale, stale_sched, _ = _resumed(saved, new, apply=False)
    assert stale.param_groups[0]["lr"] == 3e-3 and stale_sched.base_lrs == [3e-3]  # what the load alone leaves
    assert stale.param_groups[0]["betas"] == (0.9, 0.999) and stale.param_groups[0]["weight_decay"] == 0.0
    param, opt, sched, lr = _resumed(saved, new)
    assert lr == 1e-3 and sched.get_last_lr() == [1e-3] and sched.last_epoch == 3
    group = opt.param_groups[0]
    assert (group["lr"], group["betas"], group["eps"], group["weight_decay"]) == (1e-3, (0.8, 0.99), 1e-6, 0.1)
    _step(param, opt, sched)
    assert opt.param_groups[0]["lr"] == 1e-3  # the scheduler's next step keeps it (base_lrs are the new ones)
    # the update itself ran at the lr now set: at 1e-12 the weights stay put
    tiny, tiny_opt, tiny_sched, _ = _resumed(saved, OptimizerConfig(name=name, lr=1e-12))
    _step(tiny, tiny_opt, tiny_sched)
    assert (tiny - saved[0]).abs().max() < 1e-9 < (param - saved[0]).abs().max()


def test_a_changed_schedule_or_warmup_is_evaluated_at_the_resumed_optimizer_step():
    """The schedule is this launch's (optimizer.schedule, warmup_steps, the total of optimizer steps), at the
    checkpoint's position (6 optimizer steps): warmup raised to 12 puts the lr at 6/12 of it, not back to 0;
    linear decay to the total of 10 at 4/10; the next step moves on from there."""
    saved = _save(*_trained(OptimizerConfig(name="adamw", lr=1e-2), 6))
    _, opt, sched, lr = _resumed(saved, OptimizerConfig(name="adamw", lr=1e-2, warmup_steps=12))
    assert lr == pytest.approx(1e-2 * 6 / 12) and sched.last_epoch == 6
    param, opt, sched, lr = _resumed(saved, OptimizerConfig(name="adamw", lr=2e-2, schedule="linear"))
    assert lr == pytest.approx(2e-2 * 4 / 10)
    _step(param, opt, sched)
    assert opt.param_groups[0]["lr"] == pytest.approx(2e-2 * 3 / 10)
