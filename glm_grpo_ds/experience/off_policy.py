"""Where a step's rollout comes from: sampled when the step starts (:class:`NoAhead`), or one step off
(``rollout.one_step_off``, :class:`RolloutAhead`): drawn on a background thread during the previous step's decode,
rewards and gathers, with the weights one update old. The loop talks to either through the same four calls::

    drawn = rollout.next(index)              # step `index`'s rollout (one step off: and start the next one's)
    rollout.before_update(timings, status)   # one step off: wait for the next rollout (it reads the weights)
    record.update(rollout.record())          # its fields of the step's record
    rollout.state()                          # what a checkpoint keeps of it (None: nothing pending)

The background thread shares the policy with the main thread, which is safe under two rules enforced here:
nothing else runs the policy while the thread samples (a forward on another thread raises :class:`PolicyInUse`),
and the thread changes no module state the main thread set up (the policy is put in eval mode by :meth:`start`,
on the caller's thread; rollout/backends.py refuses a background sample of a policy in training mode). ZeRO-3 is
refused (:func:`for_run`): its process-wide ``F.linear`` swap (ds/gathering.py, which refuses a swap off the main
thread) and its parameter gathers would race the main thread's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import torch

from ..ds import engine as ds_engine
from ..observability.step_status import NO_STATUS
from ..runtime import log, oom
from ..runtime.threads import device_thread
from .drawn import Drawn


class NoAhead:
    """Each step samples its own rollout when it starts, with the weights as they are (the default)."""

    def __init__(self, maker, order, seeds: Callable[[int], list[int]]):
        self.maker, self.order, self.seeds = maker, order, seeds

    def next(self, index: int) -> Drawn:
        return self.maker.draw(self.order.next(), self.seeds(index))

    def before_update(self, timings: dict, status) -> None:
        """Nothing runs beside the update."""

    def record(self) -> dict:
        return {}

    def state(self) -> dict | None:
        return None

    def close(self) -> None:
        pass


class PolicyInUse(RuntimeError):
    """The policy ran on another thread while the background rollout samples with it."""


class RolloutAhead:
    """``rollout.one_step_off``: the next step's rollout (``ExperienceMaker.draw``) on one background thread, on its
    own CUDA stream, while the caller decodes and scores this step's on its stream::

        ahead.start(rows, seeds)     # samples with the weights as they are now
        ...                          # this step's decode, rewards, gathers
        ahead.wait()                 # before anything writes the weights the rollout reads (the update)
        drawn = ahead.take()         # at the next step (None: nothing pending, sample now)

    ``order`` (data/prompt_order.py) and ``seeds(step index)`` give :meth:`next` each step's prompts and sampling
    streams; ``policy``: the module the thread samples with, guarded while it does (None: unguarded, for callers
    that pass a stand-in maker). Only the rollout's seconds are measured there (``rollout``), not its peak memory:
    resetting the device's peak from that thread would cut the decode's peak short; the decode's peak holds both."""

    def __init__(self, maker, device: torch.device, order=None, seeds=None, policy: torch.nn.Module | None = None):
        self.maker, self.device, self.order, self.seeds, self.policy = maker, device, order, seeds, policy
        self._pool = device_thread(device, "glm-grpo-rollout-ahead")
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._job = None
        self._busy = False  # a rollout is in flight: the policy is the thread's
        self._thread = threading.local()  # .rollout: True on the rollout's own thread
        self.pending: Drawn | None = None  # waited for (or restored from a checkpoint), not yet taken
        self.overlapped = False  # whether the last step's rollout was drawn during the step before
        if policy is not None:
            # registered once (not per step: a hook added and removed would change what torch.compile guards on)
            policy.register_forward_pre_hook(self._only_the_rollout)

    def _only_the_rollout(self, module, args) -> None:
        if self._busy and not getattr(self._thread, "rollout", False):
            raise PolicyInUse(
                "the policy ran while rollout.one_step_off's background rollout samples with it (on thread "
                f"{threading.current_thread().name}): wait for the rollout first (RolloutAhead.wait, before the update)"
            )

    # ------------------------------------------------------------------ the loop's four calls
    def next(self, index: int) -> Drawn:
        """Step ``index``'s rollout: the one drawn during the previous step, else sampled now; then the next step's
        is started on the weights as they are now. At the last step too: a checkpoint then holds the next rollout,
        so a resume with a larger max_steps trains on what a longer uninterrupted run would (the extra rollout hides
        behind the decode)."""
        drawn = self.take()
        self.overlapped = drawn is not None
        if drawn is None:
            drawn = self.maker.draw(self.order.next(), self.seeds(index))
        self.start(self.order.next(), self.seeds(index + 1))
        return drawn

    def before_update(self, timings: dict, status) -> None:
        """The next rollout reads the weights the update writes: wait for it (``rollout_wait`` seconds), a phase of
        the step ``status`` (and so of the watchdog: glm_grpo_ds/observability/watchdog.py ``watched``)."""
        status.phase("rollout wait")
        timings["rollout_wait"] = self.wait()

    def record(self) -> dict:
        """Whether time/rollout ran beside the previous step (not on this step's path)."""
        return {"rollout_overlapped": self.overlapped}

    def state(self) -> dict | None:
        """The pending rollout's checkpoint form, with its places in the step's draw (a resume on other ranks
        splits the draw by them: experience/resumed.py ``drawn_rows``)."""
        return None if self.pending is None else self.pending.state() | {"places": self.order.places(self.order.rank)}

    # ------------------------------------------------------------------ the thread
    def start(self, rows, seeds: list[int]) -> None:
        if self._job is not None or self.pending is not None:
            raise RuntimeError("RolloutAhead.start: a rollout is already ahead; take it first")
        if self.policy is not None:
            self.policy.eval()  # here, on the caller's thread: the thread itself changes no module state
        weights = None
        if self._stream is not None:
            # the weights as the caller's stream has them now: marked here, on the caller's thread, so the rollout
            # does not also wait for the decode the caller queues next (the thread starts when it gets the GIL)
            weights = torch.cuda.Event()
            weights.record(torch.cuda.current_stream(self.device))
        self._busy = True
        self._job = self._pool.submit(self._draw, rows, seeds, weights)

    def _draw(self, rows, seeds: list[int], weights) -> Drawn:
        self._thread.rollout = True
        start = time.perf_counter()
        if weights is None:
            drawn = self.maker.draw(rows, seeds, status=NO_STATUS, measured=False)
        else:
            self._stream.wait_event(weights)
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
        try:  # an out-of-memory error met on its thread, beside the decode: the plan's rollout_beside_decode
            with oom.marking(phase="decode", part="the rollout drawn ahead, rollout.one_step_off"):
                drawn = job.result()
        finally:
            self._busy = False
        if self._stream is not None:
            caller = torch.cuda.current_stream(self.device)
            caller.wait_stream(self._stream)
            for t in drawn.tensors():
                t.record_stream(caller)
        self.pending = drawn
        return time.perf_counter() - t0

    def take(self) -> Drawn | None:
        drawn, self.pending = self.pending, None
        return drawn

    def close(self) -> None:
        """Wait for a rollout still running (an error ended the step, or the last step started one) and stop the
        thread. Its error is a warning: the step's own is the one raised, but it may be the cause (an out-of-memory
        in the rollout beside the decode) and was dropped unsaid."""
        job, self._job = self._job, None
        self._pool.shutdown(wait=True)
        self._busy = False
        err = None if job is None else job.exception()
        if err is not None:
            log.warning(
                f"glm-grpo: the rollout drawn ahead (rollout.one_step_off) failed too: {type(err).__name__}: {err}"
            )


def for_run(cfg, maker, engine, device: torch.device, order, seeds: Callable[[int], list[int]]):
    """The run's rollout source: :class:`RolloutAhead` with ``rollout.one_step_off`` (refused under ZeRO-3, whose
    config check, ds/ds_config.py, says it first in one line), else :class:`NoAhead`."""
    if not cfg.rollout.one_step_off:
        return NoAhead(maker, order, seeds)
    if ds_engine.is_zero3(engine):
        raise ValueError(
            "rollout.one_step_off with ZeRO-3: the background rollout's parameter gathers and ZeRO-3's process-wide "
            "F.linear swap would race the main thread's; use ZeRO-1/2 or rollout.one_step_off=false"
        )
    return RolloutAhead(maker, device, order, seeds, ds_engine.unwrap(engine))
