"""One experience path: sample token grids -> decode them to images -> score the images.

Training (:meth:`glm_grpo_ds.train.Trainer.step`) and evaluation (glm_grpo_ds/evaluate.py) collect
through :class:`ExperienceMaker`; the benchmarks (glm_grpo_ds/commands/bench_workers.py) and the
DeepSpeed test worker sample through :func:`sample`, the same rollout code, so what is measured,
evaluated and tested is what trains::

    maker = ExperienceMaker(engine, processor, decoder, reward_fn, cfg, device)
    exp = maker.collect(rows, [generator], decode_seed)
    exp.batch            # RolloutBatch: the sampled sequences (group by group) and their log-probs
    exp.images           # [N, 3, H, W] in [0, 1]
    exp.per_reward       # {label: [N]} this rank's rewards, NaN = undefined
    exp.rows             # the dataset row of each sample
    exp.timings          # seconds of rollout / decode / reward
    exp.peaks            # peak memory of each (memory/<phase>_peak_mb, glm_grpo_ds/runtime/memory_probe.py)

Seeds are the caller's: ``generators`` seed the sampling (one for all rows, or one per row: each row's
samples drawn from its own stream, all rows in one batched rollout), ``decode_seed(row_index)`` the decoder
noise of a row's samples (the same for all G, so images in a group differ only by their tokens).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial

import torch

from .adapters import adapters_in_base_dtype
from .data import PromptRow
from .ds import engine as ds_engine
from .observability.metrics import measure
from .observability.step_status import NO_STATUS
from .rollout import RolloutBatch, rollout
from .rollout.decode_loop import LoopOptions
from .rollout.merged_lora import BaseCopy, lora_merged


@dataclass
class Experience:
    batch: RolloutBatch
    images: torch.Tensor
    per_reward: dict[str, torch.Tensor]
    rows: list[PromptRow]  # per sample
    timings: dict[str, float]
    peaks: dict[str, float]
    in_gather: object = None  # what collect(in_gather=...) computed inside the rollout's gather, else None


def sample(
    engine,
    processor,
    prompts: list[str],
    generator: torch.Generator,
    cfg,
    device: torch.device,
    group_size: int | None = None,
    gather: bool | None = None,
) -> RolloutBatch:
    """``group_size`` (default ``grpo.group_size``) sequences per prompt from the engine's policy,
    without gradients, parameters gathered for the rollout under ZeRO-3 (``rollout.gather_parameters``
    unless ``gather`` says otherwise)."""
    return sample_batch(engine, processor, prompts, [generator], cfg, device, group_size, gather)[0]


def sample_batch(
    engine,
    processor,
    prompts: list[str],
    generators: list[torch.Generator],
    cfg,
    device: torch.device,
    group_size: int | None = None,
    gather: bool | None = None,
    in_gather: Callable | None = None,
    on_tokens: Callable[[int, int], None] | None = None,
) -> tuple[RolloutBatch, object]:
    """One batched rollout of ``prompts`` inside one parameter gather: ``(batch, result)``. ``generators``: one,
    or one per prompt (:func:`glm_grpo_ds.rollout.rollout`). ``in_gather(policy, batch)``, if given, runs on the
    batch inside that same gather (the teacher-forced log-probs the update needs, glm_grpo_ds/update.py
    ``logprobs_before_update``); ``result`` is what it returned, None without it."""
    policy = ds_engine.unwrap(engine)
    policy.eval()
    gather = cfg.rollout.gather_parameters if gather is None else gather
    group_size = cfg.grpo.group_size if group_size is None else group_size
    r = cfg.rollout
    # a sharded ZeRO-3 rollout fetches parameters in per-module hooks, which torch.compile cannot trace, a CUDA
    # graph cannot capture and a merge cannot write into
    whole = gather or not ds_engine.is_zero3(engine)
    options = LoopOptions(compile=r.compile and whole, compile_scope=r.compile_scope, cuda_graph=r.cuda_graph and whole)
    generator = generators if len(generators) > 1 else generators[0]
    with torch.no_grad(), ds_engine.gathered_for_rollout(engine, gather):
        # the trainer's own passes (in_gather below) run with the adapters it trains: outside the cast and the merge
        with contextlib.ExitStack() as sampling_weights:
            if r.adapters_in_model_dtype:
                sampling_weights.enter_context(adapters_in_base_dtype(policy))
            if r.merge_lora and whole:
                restore = not ds_engine.gather_discards_writes(engine, gather)
                sampling_weights.enter_context(lora_merged(policy, base_copy(policy, r.merge_copy), restore))
            batch = rollout(
                policy,
                processor,
                prompts,
                group_size,
                r.height,
                r.width,
                cfg.grpo.sampling,
                generator,
                device,
                options,
                on_tokens,
            )
        if in_gather is None:
            return batch, None
        with ds_engine.training_linear():
            return batch, in_gather(policy, batch)


_base_copies: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def base_copy(policy, where: str) -> BaseCopy:
    """The run's one :class:`BaseCopy` of ``policy`` (``rollout.merge_copy``; ``auto`` unresolved by the trainer's
    memory plan, e.g. in a benchmark, keeps it on the device)."""
    if policy not in _base_copies:
        _base_copies[policy] = BaseCopy("host" if where == "host" else "device")
    return _base_copies[policy]


class ExperienceMaker:
    """A run's experience path: the policy engine (sampling), its processor, the frozen decoder and the
    rewards, with the run's config and device; ``status`` shows where a collect is (rank 0's step status,
    glm_grpo_ds/observability/step_status.py)."""

    def __init__(self, engine, processor, decoder, reward_fn, cfg, device: torch.device, status=NO_STATUS):
        self.engine, self.processor, self.decoder, self.reward_fn = engine, processor, decoder, reward_fn
        self.cfg, self.device, self.status = cfg, device, status

    def collect(
        self,
        rows: list[PromptRow],
        generators: list[torch.Generator],
        decode_seed: Callable[[int], int],
        group_size: int | None = None,
        decode=None,
        in_gather: Callable | None = None,
    ) -> Experience:
        """Sample ``group_size`` (default ``grpo.group_size``) sequences for each row, decode and score
        them. ``decode_seed(row_index)``: the decoder noise seed of a dataset row's samples; ``decode``: the
        decode's DecodeSettings (default: the training decode, ``decoder.*``); ``in_gather``: see
        :func:`sample_batch`, its result in ``Experience.in_gather``. ``generators``: one for all rows, or
        one per row."""
        cfg = self.cfg
        timings: dict[str, float] = {}
        peaks: dict[str, float] = {}
        self.status.phase("rollout", unit="tokens")
        with measure(timings, peaks, "rollout", self.device):
            batch, extra = sample_batch(
                self.engine,
                self.processor,
                [row.prompt for row in rows],
                generators,
                cfg,
                self.device,
                group_size,
                in_gather=in_gather,
                on_tokens=self.status.on_tokens,
            )
        sample_rows = [rows[i] for i in batch.prompt_index.tolist()]
        prior, prompts = batch.prior_token_ids, batch.prompts
        seeds = [decode_seed(row.index) for row in sample_rows]
        samples = [row.reward_sample() for row in sample_rows]
        size = (cfg.rollout.height, cfg.rollout.width)
        with ds_engine.plain_linear():
            images, per_reward = decode_and_score(
                self.decoder,
                self.reward_fn,
                prior,
                prompts,
                size,
                seeds,
                samples,
                decode,
                cfg.decoder.stream_rewards,
                self.device,
                timings,
                peaks,
                self.status,
            )
        return Experience(batch, images, per_reward, sample_rows, timings, peaks, extra)


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
