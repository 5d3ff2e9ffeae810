"""The rules that make rollout.one_step_off's background thread safe beside the main thread
(glm_grpo_ds/experience/off_policy.py), each shown to fail when broken: nothing else runs the policy while the thread
samples; the thread changes no module state (the policy's mode is set on the caller's thread); ZeRO-3's process-wide
F.linear is never swapped off the main thread, and a ZeRO-3 engine is refused."""

import threading
from types import SimpleNamespace

import pytest
import torch
from deepspeed.runtime.zero.partition_parameters import InsertPostInitMethodToModuleSubClasses as ZeroInit

from glm_grpo_ds.config import TrainConfig
from glm_grpo_ds.ds.gathering import plain_linear
from glm_grpo_ds.experience import Drawn, NoAhead, PolicyInUse, RolloutAhead, off_policy
from glm_grpo_ds.rollout.backends import EngineSampler, Sampled


class _Maker:
    """Draws by running ``policy`` on the rollout's thread, holding there until ``release`` is set."""

    def __init__(self, policy):
        self.policy, self.release, self.started = policy, threading.Event(), threading.Event()

    def draw(self, rows, seeds, group_size=None, status=None, measured=True):
        self.policy(torch.ones(1, 2))  # the rollout's own forwards are allowed
        self.started.set()
        assert self.release.wait(10)
        return Drawn(rows, Sampled(None), {}, {})


def test_the_policy_cannot_run_elsewhere_while_the_rollout_samples():
    policy = torch.nn.Linear(2, 2)
    maker = _Maker(policy)
    ahead = RolloutAhead(maker, torch.device("cpu"), policy=policy)
    try:
        ahead.start([], [0])
        assert maker.started.wait(10)
        with pytest.raises(PolicyInUse, match="wait for the rollout first"):
            policy(torch.ones(1, 2))  # what an update before ahead.wait() would do
        maker.release.set()
        ahead.wait()
        policy(torch.ones(1, 2))  # waited for: the main thread's again
    finally:
        maker.release.set()
        ahead.close()
    # the control: unguarded (no policy given), the same forward during a rollout passes
    maker = _Maker(policy := torch.nn.Linear(2, 2))
    ahead = RolloutAhead(maker, torch.device("cpu"))
    ahead.start([], [0])
    assert maker.started.wait(10)
    policy(torch.ones(1, 2))
    maker.release.set()
    ahead.wait()
    ahead.close()


def _sampler(policy):
    engine = SimpleNamespace(module=policy, zero_optimization_stage=lambda: 2)
    return EngineSampler(engine, None, TrainConfig(), torch.device("cpu"))


def _on_a_thread(fn):
    errors = []

    def run():
        try:
            fn()
        except RuntimeError as err:
            errors.append(err)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(10)
    return errors


def test_the_thread_changes_no_mode_start_sets_it_on_the_callers_thread():
    policy = torch.nn.Linear(2, 2).train()
    # a background sample of a policy in training mode is refused before it samples (its eval() would race)
    errors = _on_a_thread(lambda: _sampler(policy).sample(["a"], [0], 1))
    assert len(errors) == 1 and "found the policy in training mode" in str(errors[0])
    assert policy.training  # untouched by the thread
    # RolloutAhead.start puts it in eval mode on the caller's thread, before the thread runs
    maker = _Maker(policy)
    ahead = RolloutAhead(maker, torch.device("cpu"), policy=policy)
    ahead.start([], [0])
    assert not policy.training
    maker.release.set()
    ahead.wait()
    ahead.close()


def test_zero3_linear_is_never_swapped_off_the_main_thread(monkeypatch):
    original = torch.nn.functional.linear

    def zero_linear(*args, **kwargs):  # what zero.Init installs process-wide
        return original(*args, **kwargs)

    monkeypatch.setattr(ZeroInit, "linear_bk", original, raising=False)
    monkeypatch.setattr(torch.nn.functional, "linear", zero_linear)

    def swap():
        with plain_linear():
            pass

    errors = _on_a_thread(swap)
    assert len(errors) == 1 and "only the main thread may" in str(errors[0])
    assert torch.nn.functional.linear is zero_linear  # nothing was swapped
    with plain_linear():  # the main thread swaps, and puts it back
        assert torch.nn.functional.linear is original
    assert torch.nn.functional.linear is zero_linear


def test_one_step_off_refuses_a_zero3_engine_and_off_is_no_ahead():
    cfg = TrainConfig()
    policy = torch.nn.Linear(2, 2)
    zero3 = SimpleNamespace(module=policy, zero_optimization_stage=lambda: 3)
    assert isinstance(off_policy.for_run(cfg, None, zero3, torch.device("cpu"), None, None), NoAhead)
    cfg.rollout.one_step_off = True
    with pytest.raises(ValueError, match="with ZeRO-3"):
        off_policy.for_run(cfg, None, zero3, torch.device("cpu"), None, None)
    zero2 = SimpleNamespace(module=policy, zero_optimization_stage=lambda: 2)
    ahead = off_policy.for_run(cfg, None, zero2, torch.device("cpu"), None, None)
    assert isinstance(ahead, RolloutAhead) and ahead.policy is policy
    ahead.close()
