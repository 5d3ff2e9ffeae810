"""Decode token grids to images and score them (:func:`decode_and_score`), streamed or not: the second half of
the experience path (experience/path.py), and of the tools that compare decodes (``glm-grpo decode-agreement``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..observability.meter import Meter
from ..observability.step_status import NO_STATUS
from ..runtime.threads import device_thread


@dataclass(frozen=True)
class ToScore:
    """What one :func:`decode_and_score` renders and scores, in sample order: the token grids ``prior``, their
    prompts, the image ``size`` (height, width), each sample's decoder noise seed and reward sample (the dataset
    row's fields a reward reads), and the decode's settings (None: the decoder's training decode)."""

    prior: torch.Tensor
    prompts: list[str]
    size: tuple[int, int]
    seeds: list[int]
    samples: list[dict]
    settings: object = None  # decoder/settings.py DecodeSettings


def decode_and_score(
    decoder, reward_fn, todo: ToScore, meter: Meter | None = None, stream: bool = False, status=NO_STATUS
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Images ``[N, 3, H, W]`` of ``todo``'s token grids and their rewards ``{label: [N]}`` (on ``meter.device``),
    in sample order.

    ``stream=False``: decode every image, then score them all in one call of each reward. ``stream=True``
    (``decoder.stream_rewards``): each DiT batch is scored on one background thread while the next one
    decodes, so a slow reward (a remote server, OCR on the CPU) waits behind the decode instead of after
    it; the rewards are the same, a failed reward still makes only its samples undefined and counts them.
    ``meter`` (default: a CPU one) gets ``decode`` = the decode loop (with streaming, the reward work running beside
    it included) and ``reward`` = the wait for rewards after the last image (all of it without streaming).
    ``status``: the step status, told each DiT batch's images and each reward (or streamed batch) done."""
    meter = meter or Meter()
    (h, w), prompts = todo.size, todo.prompts
    status.phase("decode", total=len(prompts), unit="images")
    if not stream:
        with meter.measure("decode"):
            images = decoder.decode(todo.prior, prompts, h, w, todo.seeds, todo.settings, on_images=status.advance)
        status.phase("reward", total=len(reward_fn.labels), unit="rewards done")
        with meter.measure("reward"):
            return images, reward_fn(images, prompts, todo.samples, on_scored=lambda _: status.advance())
    return _streamed(decoder, reward_fn, todo, meter, status)


def _streamed(decoder, reward_fn, todo: ToScore, meter: Meter, status) -> tuple[torch.Tensor, dict]:
    (h, w), prompts, samples, device = todo.size, todo.prompts, todo.samples, meter.device
    images = torch.empty(len(prompts), 3, h, w, dtype=torch.float32, device=device)
    reward_fn.reset()
    scored = []
    # one worker: the reward functions are called one batch at a time, in order, as without streaming
    with device_thread(device, "glm-grpo-reward") as pool:
        try:
            with meter.measure("decode"):
                for rows, part in decoder.decode_batches(todo.prior, prompts, h, w, todo.seeds, todo.settings):
                    images[rows] = part
                    job = pool.submit(reward_fn.score, part, [prompts[i] for i in rows], [samples[i] for i in rows])
                    scored.append((rows, job))
                    status.advance(len(rows))
        except BaseException:  # the decode failed: the step is lost, its queued batches are not scored first
            pool.shutdown(cancel_futures=True)  # (a remote reward may take minutes per batch before giving up)
            raise
        status.phase("reward", total=len(prompts), unit="images scored")
        with meter.measure("reward"):
            results = []
            for rows, job in scored:
                results.append((rows, job.result()))
                status.advance(len(rows))
    per_reward = {label: torch.full((len(prompts),), float("nan"), device=device) for label in reward_fn.labels}
    for rows, values in results:
        for label, v in values.items():
            per_reward[label][rows] = v.to(device)
    return images, per_reward
