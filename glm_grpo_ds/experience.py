"""One experience path: sample token grids -> decode them to images -> score the images.

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

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial

import torch

from .data import PromptRow
from .ds import engine as ds_engine
from .observability.metrics import measure
from .observability.step_status import NO_STATUS
from .rollout import RolloutBatch
from .rollout.backends import SamplingBackend


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
        cfg = self.cfg
        timings: dict[str, float] = {}
        peaks: dict[str, float] = {}
        group_size = cfg.grpo.group_size if group_size is None else group_size
        self.status.phase("rollout", unit="tokens")
        with measure(timings, peaks, "rollout", self.device):
            got = self.sampler.sample([row.prompt for row in rows], seeds, group_size, self.status.on_tokens)
        batch = got.batch
        sample_rows = [rows[i] for i in batch.prompt_index.tolist()]
        noise_seeds = [decode_seed(row.index) for row in sample_rows]
        samples = [row.reward_sample() for row in sample_rows]
        size = (cfg.rollout.height, cfg.rollout.width)
        with ds_engine.plain_linear():
            images, per_reward = decode_and_score(
                self.decoder,
                self.reward_fn,
                batch.prior_token_ids,
                batch.prompts,
                size,
                noise_seeds,
                samples,
                decode,
                cfg.decoder.stream_rewards,
                self.device,
                timings,
                peaks,
                self.status,
            )
        return Experience(batch, images, per_reward, sample_rows, timings, peaks, got.ref_logps, got.old_logps)


def decode_and_score(
    decoder,
    reward_fn,
    prior: torch.Tensor,
    prompts: list[str],
    size: tuple[int, int],
    seeds: list[int],
    samples: list[dict],
    settings=None,
    stream: bool = False,
    device: torch.device | None = None,
    timings: dict[str, float] | None = None,
    peaks: dict[str, float] | None = None,
    status=NO_STATUS,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Images ``[N, 3, H, W]`` of the token grids and their rewards ``{label: [N]}``, in sample order.

    ``stream=False``: decode every image, then score them all in one call of each reward. ``stream=True``
    (``decoder.stream_rewards``): each DiT batch is scored on one background thread while the next one
    decodes, so a slow reward (a remote server, OCR on the CPU) waits behind the decode instead of after
    it; the rewards are the same, a failed reward still makes only its samples undefined and counts them.
    ``timings``: ``decode`` = the decode loop (with streaming, the reward work running beside it
    included), ``reward`` = the wait for rewards after the last image (all of it without streaming).
    ``status``: the step status, told each DiT batch's images and each reward (or streamed batch) done."""
    timings = {} if timings is None else timings
    peaks = {} if peaks is None else peaks
    device = device or torch.device("cpu")
    h, w = size
    status.phase("decode", total=len(prompts), unit="images")
    if not stream:
        with measure(timings, peaks, "decode", device):
            images = decoder.decode(prior, prompts, h, w, seeds, settings, on_images=status.advance)
        status.phase("reward", total=len(reward_fn.labels), unit="rewards done")
        with measure(timings, peaks, "reward", device):
            return images, reward_fn(images, prompts, samples, on_scored=lambda _: status.advance())
    images = torch.empty(len(prompts), 3, h, w, dtype=torch.float32, device=device)
    reward_fn.reset()
    scored = []
    # one worker: the reward functions are called one batch at a time, in order, as without streaming. The
    # current CUDA device is per thread: the worker's must be the rank's, not cuda:0.
    start = partial(torch.cuda.set_device, device) if device.type == "cuda" else None
    with ThreadPoolExecutor(1, thread_name_prefix="glm-grpo-reward", initializer=start) as pool:
        with measure(timings, peaks, "decode", device):
            for rows, part in decoder.decode_batches(prior, prompts, h, w, seeds, settings):
                images[rows] = part
                job = pool.submit(reward_fn.score, part, [prompts[i] for i in rows], [samples[i] for i in rows])
                scored.append((rows, job))
                status.advance(len(rows))
        status.phase("reward", total=len(prompts), unit="images scored")
        with measure(timings, peaks, "reward", device):
            results = []
            for rows, job in scored:
                results.append((rows, job.result()))
                status.advance(len(rows))
    per_reward = {label: torch.full((len(prompts),), float("nan"), device=device) for label in reward_fn.labels}
    for rows, values in results:
        for label, v in values.items():
            per_reward[label][rows] = v.to(device)
    return images, per_reward
