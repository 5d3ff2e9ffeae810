"""The experience path: sample token grids -> decode them to images -> score the images.

Training (:meth:`glm_grpo_ds.train.Trainer.step`), the in-training evaluation and every tool that samples
(``glm-grpo evaluate``, ``decode-agreement``: glm_grpo_ds/evaluation/) collect through :class:`ExperienceMaker`,
so the decode settings, streamed rewards, timings and peaks are the same everywhere; only the sampling backend
differs (glm_grpo_ds/rollout/backends.py: the engine sampler for training, a plain-model sampler for the
tools)::

    maker = ExperienceMaker(EngineSampler(engine, processor, cfg, device), decoder, reward_fn, cfg, device)
    exp = maker.collect(rows, [seed], decode_seed)
    exp.batch            # RolloutBatch: the sampled sequences (group by group) and their log-probs
    exp.ref_logps        # [N, n] reference log-probs computed while sampling, or None (the update computes them)
    exp.old_logps        # [N, n] pre-update log-probs computed while sampling, or None
    exp.images           # [N, 3, H, W] in [0, 1]
    exp.per_reward       # {label: [N]} this rank's rewards, NaN = undefined
    exp.rows             # the dataset row of each sample
    exp.timings          # seconds of rollout / decode / reward
    exp.peaks            # peak memory of each (memory/<phase>_peak_mb, glm_grpo_ds/runtime/memory_probe.py)

Seeds are the caller's (runtime/seeding.py, evaluation/seeds.py): integer ``seeds`` start the sampling's streams
(one for all rows, or one per row: each row's samples drawn from its own stream, all rows in one batched
rollout; the backend makes its generators from them), ``decode_seed(row_index)`` the decoder noise of a row's
samples (the same for all G, so images in a group differ only by their tokens).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..data import PromptRow
from ..ds import engine as ds_engine
from ..observability.meter import Meter
from ..observability.step_status import NO_STATUS
from ..rollout import RolloutBatch
from ..rollout.backends import SamplingBackend
from .drawn import Drawn
from .scoring import ToScore, decode_and_score


@dataclass
class Experience:
    batch: RolloutBatch
    images: torch.Tensor
    per_reward: dict[str, torch.Tensor]
    rows: list[PromptRow]  # per sample
    timings: dict[str, float]
    peaks: dict[str, float]
    ref_logps: torch.Tensor | None = None  # [N, n] under the reference, when the sampler computed them
    old_logps: torch.Tensor | None = None  # [N, n] under the policy before the update, when the sampler did


class ExperienceMaker:
    """A run's experience path: a sampling backend, the frozen decoder and the rewards, with the run's config
    (rollout size, default group size, ``decoder.stream_rewards``) and device; ``status`` shows where a collect
    is (rank 0's step status, glm_grpo_ds/observability/step_status.py)."""

    def __init__(self, sampler: SamplingBackend, decoder, reward_fn, cfg, device: torch.device, status=NO_STATUS):
        self.sampler, self.decoder, self.reward_fn = sampler, decoder, reward_fn
        self.cfg, self.device, self.status = cfg, device, status

    def collect(
        self,
        rows: list[PromptRow],
        seeds: list[int],
        decode_seed: Callable[[int], int],
        group_size: int | None = None,
        decode=None,
    ) -> Experience:
        """Sample ``group_size`` (default ``grpo.group_size``) sequences for each row, decode and score
        them. ``decode_seed(row_index)``: the decoder noise seed of a dataset row's samples; ``decode``: the
        decode's DecodeSettings (default: the training decode, ``decoder.*``). ``seeds``: the sampling's, one for all
        rows or one per row."""
        return self.finish(self.draw(rows, seeds, group_size), decode_seed, decode)

    def draw(
        self, rows: list[PromptRow], seeds: list[int], group_size: int | None = None, status=None, measured=True
    ) -> Drawn:
        """The rollout alone (:meth:`collect`'s first half): ``rows``' samples, not yet decoded. ``status``: the
        step status told the tokens (default this maker's); ``measured=False``: no seconds, no peak (the device's
        synchronisation and peak reset would reach into another thread's work: :class:`RolloutAhead`)."""
        status = self.status if status is None else status
        meter = Meter(self.device)
        group_size = self.cfg.grpo.group_size if group_size is None else group_size
        status.phase("rollout", unit="tokens")
        with meter.measure("rollout") if measured else contextlib.nullcontext():
            got = self.sampler.sample([row.prompt for row in rows], seeds, group_size, status.on_tokens)
        return Drawn(rows, got, meter.timings, meter.peaks)

    def finish(self, drawn: Drawn, decode_seed: Callable[[int], int], decode=None) -> Experience:
        """Decode and score a :meth:`draw` (:meth:`collect`'s second half)."""
        cfg, batch = self.cfg, drawn.got.batch
        meter = Meter(self.device)
        meter.timings.update(drawn.timings)
        meter.peaks.update(drawn.peaks)
        sample_rows = [drawn.rows[i] for i in batch.prompt_index.tolist()]
        todo = ToScore(
            batch.prior_token_ids,
            batch.prompts,
            (cfg.rollout.height, cfg.rollout.width),
            [decode_seed(row.index) for row in sample_rows],
            [row.reward_sample() for row in sample_rows],
            decode,
        )
        with ds_engine.plain_linear():
            images, per_reward = decode_and_score(
                self.decoder, self.reward_fn, todo, meter, cfg.decoder.stream_rewards, self.status
            )
        got = drawn.got
        return Experience(
            batch, images, per_reward, sample_rows, meter.timings, meter.peaks, got.ref_logps, got.old_logps
        )
