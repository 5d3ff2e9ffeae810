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

import contextlib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from functools import partial

import torch

from .data import PromptRow
from .ds import engine as ds_engine
from .observability.metrics import measure
from .observability.step_status import NO_STATUS
from .rollout import GridSpec, RolloutBatch
from .rollout.backends import Sampled, SamplingBackend


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


@dataclass
class Drawn:
    """One rollout, sampled and not yet decoded (:meth:`ExperienceMaker.draw`): the dataset rows it sampled, the
    sampler's result, the rollout's seconds and peak memory."""

    rows: list[PromptRow]
    got: Sampled
    timings: dict[str, float]
    peaks: dict[str, float]


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
        timings: dict[str, float] = {}
        peaks: dict[str, float] = {}
        group_size = self.cfg.grpo.group_size if group_size is None else group_size
        status.phase("rollout", unit="tokens")
        with measure(timings, peaks, "rollout", self.device) if measured else contextlib.nullcontext():
            got = self.sampler.sample([row.prompt for row in rows], seeds, group_size, status.on_tokens)
        return Drawn(rows, got, timings, peaks)

    def finish(self, drawn: Drawn, decode_seed: Callable[[int], int], decode=None) -> Experience:
        """Decode and score a :meth:`draw` (:meth:`collect`'s second half)."""
        cfg, batch = self.cfg, drawn.got.batch
        timings, peaks = dict(drawn.timings), dict(drawn.peaks)
        sample_rows = [drawn.rows[i] for i in batch.prompt_index.tolist()]
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
        got = drawn.got
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


class RolloutAhead:
    """``rollout.one_step_off``: the next step's rollout (:meth:`ExperienceMaker.draw`) on one background thread,
    on its own CUDA stream, while the caller decodes and scores this step's on its stream::

        ahead.start(rows, seeds)     # samples with the weights as they are now
        ...                          # this step's decode, rewards, gathers
        ahead.wait()                 # before anything writes the weights the rollout reads (the update)
        drawn = ahead.take()         # at the next step (None: nothing pending, sample now)

    Only the rollout's seconds are measured there (``rollout``), not its peak memory: resetting the device's
    peak from that thread would cut the decode's peak short; the decode's peak holds both."""

    def __init__(self, maker: ExperienceMaker, device: torch.device):
        self.maker, self.device = maker, device
        cuda = device.type == "cuda"
        # the current CUDA device is per thread: the worker's must be the rank's, not cuda:0
        start = partial(torch.cuda.set_device, device) if cuda else None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="glm-grpo-rollout-ahead", initializer=start)
        self._stream = torch.cuda.Stream(device) if cuda else None
        self._job = None
        self.pending: Drawn | None = None  # waited for (or restored from a checkpoint), not yet taken

    def start(self, rows: list[PromptRow], seeds: list[int]) -> None:
        if self._job is not None or self.pending is not None:
            raise RuntimeError("RolloutAhead.start: a rollout is already ahead; take it first")
        caller = torch.cuda.current_stream(self.device) if self._stream is not None else None
        self._job = self._pool.submit(self._draw, rows, seeds, caller)

    def _draw(self, rows: list[PromptRow], seeds: list[int], caller) -> Drawn:
        start = time.perf_counter()
        if caller is None:
            drawn = self.maker.draw(rows, seeds, status=NO_STATUS, measured=False)
        else:
            self._stream.wait_stream(caller)  # the weights as the caller's stream last wrote them
            with torch.cuda.stream(self._stream):
                drawn = self.maker.draw(rows, seeds, status=NO_STATUS, measured=False)
            self._stream.synchronize()  # this stream's work only: the seconds below are the rollout's, GPU included
        return Drawn(drawn.rows, drawn.got, {"rollout": time.perf_counter() - start}, {})

    def wait(self) -> float:
        """Wait for the rollout started last (re-raising its error); the seconds waited. Its tensors are then the
        caller's stream's (the allocator keeps their memory until that stream is done with them)."""
        if self._job is None:
            return 0.0
        t0 = time.perf_counter()
        job, self._job = self._job, None
        drawn = job.result()
        if self._stream is not None:
            caller = torch.cuda.current_stream(self.device)
            caller.wait_stream(self._stream)
            for t in _tensors(drawn.got):
                t.record_stream(caller)
        self.pending = drawn
        return time.perf_counter() - t0

    def take(self) -> Drawn | None:
        drawn, self.pending = self.pending, None
        return drawn

    def close(self) -> None:
        """Wait for a rollout still running (an error ended the step) and stop the thread."""
        self._pool.shutdown(wait=True)


def _tensors(got: Sampled) -> list[torch.Tensor]:
    batch = got.batch
    found = [getattr(batch, f.name) for f in fields(batch)] + [got.ref_logps, got.old_logps]
    return [t for t in found if isinstance(t, torch.Tensor)]


def drawn_state(drawn: Drawn) -> dict:
    """A :class:`Drawn` as plain tensors, lists and numbers (a checkpoint's ``torch.load(weights_only=True)``
    reads it back): the dataset rows by index."""
    batch = drawn.got.batch
    return {
        "rows": [row.index for row in drawn.rows],
        "batch": {f.name: v for f in fields(batch) if isinstance(v := getattr(batch, f.name), torch.Tensor)},
        "prompts": list(batch.prompts),
        "grid": [list(batch.grid.large), list(batch.grid.preview)],
        "ref_logps": drawn.got.ref_logps,
        "old_logps": drawn.got.old_logps,
        "timings": dict(drawn.timings),
    }


def drawn_from_state(state: dict, rows, device: torch.device) -> Drawn:
    """:func:`drawn_state`'s inverse; ``rows``: the prompt set (``rows[i]`` is dataset row ``i``)."""
    picked = [rows[i] for i in state["rows"]]
    if [row.index for row in picked] != state["rows"]:
        raise ValueError("the pending rollout's dataset rows are not this prompt set's")
    tensors = {k: v.to(device) for k, v in state["batch"].items()}
    large, preview = (tuple(x) for x in state["grid"])
    batch = RolloutBatch(**tensors, prompts=list(state["prompts"]), grid=GridSpec(large, preview))
    move = lambda t: None if t is None else t.to(device)
    got = Sampled(batch, move(state["ref_logps"]), move(state["old_logps"]))
    return Drawn(picked, got, dict(state["timings"]), {})
