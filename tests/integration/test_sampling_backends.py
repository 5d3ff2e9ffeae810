"""The sampling seam (glm_grpo_ds/rollout/backends.py, docs/design.md "Sampling backends"), on the CPU with the tiny
GLM-Image: a backend takes integer seeds and makes its generators from them on its own device, drawing bitwise the
tokens the same seeds' generators drew when callers made them; the trainer tells every backend of each step's
weights (``sync_weights(step)``: at the start, and after each update phase, before the next rollout), counted with a
real engine sampler in a real 2-rank run; and an out-of-process-like class with ``sample(seeds)`` and
``sync_weights`` is a :class:`SamplingBackend`, one without ``sync_weights`` is not."""

import pytest
import torch
from launching import FAST, common, worker  # noqa: E402  (tests/integration/launching.py)

from glm_grpo_ds.config import RolloutConfig, SamplingConfig
from glm_grpo_ds.rollout import rollout
from glm_grpo_ds.rollout.backends import ModelSampler, Sampled, SamplingBackend, loop_options

PROMPTS = ["a red cube", "two cats"]
SAMPLING = SamplingConfig(temperature=0.9, top_k=12, top_p=0.9)


def test_integer_seeds_draw_what_the_callers_generators_drew(policy, processor):
    """One seed for all rows, and one per prompt: the backend's rollout is the rollout of ``torch.Generator(device)
    .manual_seed(seed)`` generators, bitwise (tokens and log-probs)."""
    r = RolloutConfig(height=64, width=64)
    cpu = torch.device("cpu")
    backend = ModelSampler(policy, processor, r, SAMPLING, cpu)
    for seeds in ([1234], [21, 22]):
        got = backend.sample(PROMPTS, seeds, 2).batch
        with torch.no_grad():
            gens = [torch.Generator(device=cpu).manual_seed(s) for s in seeds]
            want = rollout(policy, processor, PROMPTS, 2, 64, 64, SAMPLING, gens, cpu, loop_options(r))
        assert torch.equal(got.completion_ids, want.completion_ids)
        assert torch.equal(got.sampler_logps, want.sampler_logps)
    assert not torch.equal(backend.sample(PROMPTS, [1], 2).batch.completion_ids, got.completion_ids)


class RemoteLike:
    """What an out-of-process engine (vLLM-class) would offer the trainer: the prompts' template, sampling from
    integer seeds, and a weight sync after each update (here: remembered)."""

    def __init__(self, processor):
        self.processor = processor
        self.synced: list[int] = []

    def sample(self, prompts, seeds, group_size, on_tokens=None) -> Sampled:
        raise NotImplementedError("the remote engine's answer")

    def sync_weights(self, step: int) -> None:
        self.synced.append(step)


class NoSync:
    processor = None

    def sample(self, prompts, seeds, group_size, on_tokens=None) -> Sampled:
        raise NotImplementedError


def test_an_out_of_process_backend_fits_the_seam(processor):
    remote = RemoteLike(processor)
    assert isinstance(remote, SamplingBackend)
    assert not isinstance(NoSync(), SamplingBackend)  # a backend that cannot take the new weights is none
    assert isinstance(ModelSampler(None, processor, RolloutConfig(), SAMPLING, torch.device("cpu")), SamplingBackend)


def _syncs(events: list, backend: int) -> list[tuple[int, int]]:
    """(step told, optimizer steps taken by then) of each ``sync_weights`` a backend got, in order."""
    return [(e[2], e[3]) for e in events if e[0] == "sync" and e[1] == backend]


@pytest.mark.distributed
def test_the_trainer_syncs_the_backends_after_each_optimizer_step(tiny_model_dir, data64, tmp_path):
    """A real run (2 CPU ranks, ZeRO-2, 3 steps, an evaluation every 2 steps; tests/integration/ds_worker.py sync):
    each of the trainer's two engine samplers (training's, the evaluation's) is told ``sync_weights(0)`` once the
    weights the run starts from are loaded, then ``sync_weights(k)`` once after step k's optimizer step, before the
    next rollout; training's samples once per step between them."""
    extra = [f"eval.file={data64}", "eval.steps=2", "eval.num_prompts=2", "eval.group_size=2"]
    overrides = common(tiny_model_dir, data64, tmp_path / "run", "max_steps=3", *FAST, *extra)
    r = worker(2, "sync", tmp_path / "w", "zero2.json", overrides)
    events = r["events"]
    assert r["samplers"] == 2 and sum(e[0] == "optimizer" for e in events) == 3  # training's sampler, the eval's
    for backend in (0, 1):  # at the start, then once per optimizer step, after it: sync(k) sees k optimizer steps
        assert _syncs(events, backend) == [(0, 0), (1, 1), (2, 2), (3, 3)]
    # the check, fed a backend the trainer never syncs (its events taken out) or syncs before the update, fails
    assert _syncs([e for e in events if e[:2] != ("sync", 1)], 1) != [(0, 0), (1, 1), (2, 2), (3, 3)]
    early = [("sync", 0, e[2], e[3] - 1) if e[:2] == ("sync", 0) and e[2] else e for e in events]
    assert _syncs(early, 0) != [(0, 0), (1, 1), (2, 2), (3, 3)]
    training = [e[0] if e[0] != "sync" else f"sync{e[2]}" for e in events if len(e) == 1 or e[1] == 0]
    assert training == ["sync0"] + ["sample", "optimizer", "sync1", "sample", "optimizer", "sync2"] + [
        "sample",
        "optimizer",
        "sync3",
    ]
    assert any(e == ("sample", 1) for e in events)  # the evaluation sampled with its own
