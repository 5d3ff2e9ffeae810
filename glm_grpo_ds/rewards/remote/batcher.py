"""The reward server's batcher: concurrent scoring requests merged into reward calls.

A :class:`Batcher` takes the queued requests (after waiting ``max_wait_s`` for more to arrive) into one reward call
of at most ``max_batch`` images of one size, runs it on its own worker thread (one call at a time: the reward model
is not shared between threads; the event loop stays free to receive the next requests meanwhile) and hands each
request its own values. A request larger than ``max_batch`` is split. A reward that raises fails every request of
that call (the server answers 500 with its message) and the server goes on.

Running out of the device's memory is not a failure of the images: the call is scored again in halves, each halved
again the same way, and ``max_batch`` stays at the largest size then scored below every size that failed (said once
per lowering; until the server restarts), so later calls do not fail first. Where one image alone does not fit, each
request of the call is scored on its own, so only the requests holding such an image fail; that image lowers nothing.
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import torch

from ...runtime.error_chain import chain
from ...runtime.oom import out_of_memory
from ..base import reward_values

LOG = logging.getLogger("uvicorn.error")  # uvicorn's own server log: one stream, one format


@dataclass
class _Job:
    images: torch.Tensor  # [n, 3, H, W] uint8
    prompts: list[str]
    samples: list[dict]
    future: asyncio.Future

    @property
    def size(self) -> tuple[int, int]:
        return tuple(self.images.shape[2:])


class Batcher:
    """Queue of scoring jobs -> reward calls of at most ``max_batch`` same-size images (see the module doc).

    ``calls`` holds the batch sizes of the last reward calls, those that ran out of memory included (the tests read
    it); ``max_batch`` is lowered by a call that runs out of memory (:meth:`_lower`)."""

    def __init__(self, fn: Callable, label: str, max_batch: int, max_wait_s: float, device: torch.device):
        self.fn, self.label, self.max_batch, self.max_wait_s, self.device = fn, label, max_batch, max_wait_s, device
        self.queue: asyncio.Queue[_Job] = asyncio.Queue()
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="reward")
        self.calls: deque[int] = deque(maxlen=10_000)

    async def score(self, images: torch.Tensor, prompts: list[str], samples: list[dict]) -> torch.Tensor:
        loop = asyncio.get_running_loop()
        step = self.max_batch  # once: the worker thread may lower it while this loop runs
        jobs = []
        for start in range(0, images.shape[0], step):
            end = start + step
            jobs.append(_Job(images[start:end], prompts[start:end], samples[start:end], loop.create_future()))
            self.queue.put_nowait(jobs[-1])
        return torch.cat(await asyncio.gather(*(job.future for job in jobs)))

    async def run(self) -> None:
        """The batching loop (one task for the server's lifetime)."""
        loop = asyncio.get_running_loop()
        carry: _Job | None = None
        while True:
            first = carry or await self.queue.get()
            carry = None
            if first.future.done():  # its request was cancelled (the client hung up): not scored
                continue
            if self.max_wait_s > 0 and self.queue.empty():
                await asyncio.sleep(self.max_wait_s)  # let concurrent requests join this call
            jobs, n = [first], first.images.shape[0]
            while n < self.max_batch and not self.queue.empty():
                job = self.queue.get_nowait()
                if job.future.done():
                    continue
                if job.size != first.size or n + job.images.shape[0] > self.max_batch:
                    carry = job  # the next call starts with it
                    break
                jobs.append(job)
                n += job.images.shape[0]
            try:
                results = await loop.run_in_executor(self.pool, self._call, jobs)
            except asyncio.CancelledError:
                raise
            except BaseException as err:  # noqa: BLE001 - SystemExit & co. raised by reward code: not the server's end
                LOG.error("reward %s raised %s on a batch of %d images", self.label, type(err).__name__, n)
                results = [RuntimeError(f"reward {self.label} raised {type(err).__name__}")] * len(jobs)
            for job, result in zip(jobs, results, strict=True):
                if job.future.done():  # a client that hung up leaves a cancelled future
                    continue
                if isinstance(result, BaseException):
                    job.future.set_exception(result)
                else:
                    job.future.set_result(result)

    def _call(self, jobs: list[_Job]) -> list[torch.Tensor | BaseException]:
        """The jobs scored together on the worker thread: each one's ``[n]`` float32 values on the CPU, or the error
        that failed it (its frames' locals cleared: they hold the failed call's tensors until the request is
        answered otherwise)."""
        try:
            values = self._joined(jobs)
        except Exception as err:  # noqa: BLE001 - reward code is user code: fail these requests, serve on
            if len(jobs) == 1 or out_of_memory(err) is None:
                n = sum(job.images.shape[0] for job in jobs)
                LOG.error("reward %s raised on a batch of %d images", self.label, n, exc_info=err)
                for e in chain(err):
                    traceback.clear_frames(e.__traceback__)
                return [err] * len(jobs)
        else:
            return list(values.split([job.images.shape[0] for job in jobs]))
        # one image alone did not fit (out of the except block: the failed calls' frames are gone): each request on
        # its own, so only those holding such an image fail
        return [result for job in jobs for result in self._call([job])]

    def _joined(self, jobs: list[_Job]) -> torch.Tensor:
        """The jobs' images scored in calls of at most ``max_batch``, read again before each: a call that ran out of
        memory lowers it once its images are scored (:meth:`_lower`), and the jobs queued before that came split at
        the old size."""
        images = torch.cat([job.images for job in jobs])
        prompts = [p for job in jobs for p in job.prompts]
        samples = [s for job in jobs for s in job.samples]
        parts, start = [], 0
        while start < len(prompts):
            end, sizes = start + self.max_batch, {"failed": [], "fit": []}
            parts.append(self._scored(images[start:end], prompts[start:end], samples[start:end], sizes))
            self._lower(sizes)
            start = end
        return torch.cat(parts)

    def _scored(self, images: torch.Tensor, prompts: list[str], samples: list[dict], sizes: dict) -> torch.Tensor:
        """The reward of ``images`` (uint8, on the CPU) in one call, or, when that call runs out of the device's
        memory, of its two halves in turn (each halved again the same way, down to one image, whose running out is
        raised): the same images scored, in smaller calls, rather than every request of the call failed.
        ``sizes``: the calls that ran out of memory and those scored after one did, by their number of images."""
        n = len(prompts)
        self.calls.append(n)
        try:
            with torch.no_grad():  # one expression: no name keeps the reward's output alive through the halves
                values = reward_values(
                    self.label, self.fn(images.to(self.device).float().div(255), prompts, samples), n, "cpu"
                )  # None / NaN / inf: NaN, sent as null
        except Exception as err:  # noqa: BLE001 - told apart below; everything else leaves as it came
            if n == 1 or out_of_memory(err) is None:
                raise
        else:
            if sizes["failed"]:
                sizes["fit"].append(n)
            return values
        # out of the except block: the error's frames, which hold the failed call's tensors, are gone
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # the failed call's blocks, so the halves and the other processes get them
        sizes["failed"].append(n)
        half = (n + 1) // 2
        parts = [self._scored(images[a:b], prompts[a:b], samples[a:b], sizes) for a, b in ((0, half), (half, n))]
        return torch.cat(parts)

    def _lower(self, sizes: dict) -> None:
        """After a call whose images were all scored, some in smaller calls (:meth:`_scored`'s ``sizes``): calls of at
        most the largest size that was scored below every size that failed, from now on, said when that lowers
        ``max_batch``. A call that failed at one image lowers nothing: that image does not fit alone, whatever the
        batch."""
        if not sizes["failed"]:
            return
        fit = max(size for size in sizes["fit"] if size < min(sizes["failed"]))
        if fit < self.max_batch:
            self.max_batch = fit
            LOG.warning(
                "reward %s ran out of %s memory on a call of %d images: scored in smaller calls; calls are of at most "
                "%d images from now on (start the server with --max-batch %d to skip the failed calls)",
                *(self.label, self.device.type.upper(), max(sizes["failed"]), fit, fit),
            )

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
