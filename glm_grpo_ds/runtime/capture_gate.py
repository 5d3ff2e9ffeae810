"""Keeping code that may synchronize the whole device out of a CUDA graph's capture on another thread.

    with CAPTURE_SAFE.capture(), torch.cuda.graph(graph, capture_error_mode="thread_local"):
        step()                      # rollout/step_graph.py: alone, no shared work runs meanwhile
    with CAPTURE_SAFE.shared():
        values = reward(images)     # rewards/registry.py; each DiT and glyph-encoder forward, each VAE decode
                                    # (decoder/image_decoder.py): side by side

Why: with ``rollout.one_step_off`` the next rollout captures its decode step on a background thread while the main
thread decodes and scores. CUDA refuses a device-wide synchronize, and ``empty_cache()``, while any stream of the
context captures, in every capture mode (error 900, the capture lost). Reward code often calls them; so does
``torch.compile``'s runtime autotuning at a compiled kernel's first run (torch/_inductor/runtime/benchmarking.py), which
a DiT compile or recompile (``decoder.compile``, a new glyph-token length) reaches inside the decode. A plain lock
around all of them would also serialise a streamed reward with the next DiT batch (``decoder.stream_rewards``), so
the work is *shared* (any number at once, on any threads) and a capture is *exclusive*: it waits for the shared work
running, and shared work that starts while a capture waits or runs waits for it (the capture, a tenth of a second at a
rollout's start, cannot be starved by back-to-back DiT forwards). A thread already inside shared work may enter it
again; a thread inside shared work may not capture (it would wait for itself: refused).
"""

from __future__ import annotations

import contextlib
import threading


class CaptureGate:
    """Shared work beside shared work, a capture alone (see the module's docstring)."""

    def __init__(self):
        self._cond = threading.Condition()
        self._shared = 0  # shared holds, all threads
        self._capturing = False
        self._waiting = 0  # captures waiting for the shared work to end
        self._mine = threading.local()  # .depth: this thread's shared holds

    def _depth(self) -> int:
        return getattr(self._mine, "depth", 0)

    @contextlib.contextmanager
    def shared(self):
        """Work that may synchronize the device: runs beside other shared work, never during a capture."""
        with self._cond:
            if self._depth() == 0:  # a nested hold is already counted: waiting here would wait for itself
                self._cond.wait_for(lambda: not self._capturing and self._waiting == 0)
            self._shared += 1
            self._mine.depth = self._depth() + 1
        try:
            yield
        finally:
            with self._cond:
                self._shared -= 1
                self._mine.depth -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def capture(self):
        """A CUDA graph's capture: waits for the shared work running, holds new shared work until it ends."""
        if self._depth():
            raise RuntimeError("CaptureGate.capture inside shared work on the same thread would wait for itself")
        with self._cond:
            self._waiting += 1
            try:
                self._cond.wait_for(lambda: not self._capturing and self._shared == 0)
            finally:
                self._waiting -= 1
            self._capturing = True
        try:
            yield
        finally:
            with self._cond:
                self._capturing = False
                self._cond.notify_all()

    def held_shared(self) -> bool:
        """Whether this thread is inside shared work."""
        return self._depth() > 0

    def asked(self) -> bool:
        """Whether a capture runs or waits for the shared work running now."""
        with self._cond:
            return self._capturing or self._waiting > 0

    def busy(self) -> bool:
        """Whether a capture or any shared work holds the gate now (on any thread)."""
        with self._cond:
            return self._capturing or self._shared > 0


CAPTURE_SAFE = CaptureGate()
