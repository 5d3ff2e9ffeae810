"""Reward servers for tests and benchmarks, always stopped, never waited on without a deadline.

* :class:`SlowMean`: a plugin reward (mean pixel value) that sleeps ``delay_s`` per call and can
  append each call's batch size to ``calls_file``:
  ``glm-grpo reward-server --reward python:glm_grpo_ds.testing.reward_servers:SlowMean --reward-arg delay_s=0.5``;
* :func:`serve_in_thread`: a FastAPI app (rewards/remote/serving.py) on a loopback port in this process;
* :func:`server_process`: ``glm-grpo reward-server`` in a child process (killable), its URL read
  from its first line.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch


class SlowMean:
    """Reward = mean pixel value of each image, after sleeping ``delay_s + delay_per_image_s * N``
    (an artificially slow reward model); with ``calls_file``, each call appends its batch size; with
    ``gate`` (a threading.Event), each call first waits until the test sets it (at most 60 s), so a test
    can queue requests behind a running call without depending on timing."""

    def __init__(
        self,
        delay_s: float = 0.0,
        delay_per_image_s: float = 0.0,
        calls_file: str | None = None,
        gate: threading.Event | None = None,
    ):
        self.delay_s, self.delay_per_image_s, self.calls_file = float(delay_s), float(delay_per_image_s), calls_file
        self.gate = gate

    def __call__(self, images: torch.Tensor, prompts: list[str], samples: list[dict]) -> torch.Tensor:
        if self.gate is not None and not self.gate.wait(60):
            raise TimeoutError("SlowMean: the test never opened the gate")
        time.sleep(self.delay_s + self.delay_per_image_s * images.shape[0])
        if self.calls_file:
            with open(self.calls_file, "a", encoding="utf-8") as f:
                f.write(f"{images.shape[0]}\n")
        return images.float().mean(dim=(1, 2, 3))


class CappedMean:
    """Reward = mean pixel value of each image, on a device that holds images worth at most ``capacity``: each image
    costs ``costs[its prompt]`` (1 where its prompt is not named; ``math.inf``: one that fits no call). A call past it
    raises torch's out-of-memory error, worded as a CUDA allocation's (the reward server's halving, on a CPU)."""

    def __init__(self, capacity: float, costs: dict[str, float] | None = None):
        self.capacity, self.costs = float(capacity), dict(costs or {})

    def __call__(self, images: torch.Tensor, prompts: list[str], samples: list[dict]) -> torch.Tensor:
        cost = sum(self.costs.get(p, 1.0) for p in prompts) if prompts else images.shape[0]
        if cost > self.capacity:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {images.shape[0]} images of a device that holds "
                f"{self.capacity:g}."
            )
        return images.float().mean(dim=(1, 2, 3))


@contextlib.contextmanager
def serve_in_thread(app, port: int = 0, timeout_s: float = 30.0):
    """Run ``app`` with uvicorn on 127.0.0.1:``port`` (0: a free one) in a thread; yields ``(url, server)``."""
    import uvicorn

    from ..rewards.remote.serving import bind

    sock = bind("127.0.0.1", port)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + timeout_s
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("the reward server thread did not start")
            time.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", server
    finally:
        server.should_exit = True
        thread.join(timeout_s)
        sock.close()


@contextlib.contextmanager
def server_process(workdir: Path, *args: str, timeout_s: float = 60.0, env: dict | None = None):
    """``python -m glm_grpo_ds reward-server --port 0 ARGS`` in a child process; yields ``(url, proc)``
    once it serves. Its stdout / stderr go to ``workdir/server.out`` / ``server.err``. Stopped (SIGTERM,
    then SIGKILL) on exit whatever happened to it."""
    workdir.mkdir(parents=True, exist_ok=True)
    out, err = workdir / "server.out", workdir / "server.err"
    env = dict(os.environ if env is None else env, HF_HUB_OFFLINE="1")
    with open(out, "w") as fo, open(err, "w") as fe:
        proc = subprocess.Popen(
            [sys.executable, "-m", "glm_grpo_ds", "reward-server", "--port", "0", *args],
            stdout=fo,
            stderr=fe,
            env=env,
        )
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            match = re.search(r"serving .* on (http://\S+)", out.read_text())
            if match:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"reward server did not start (exit {proc.poll()}): {err.read_text()[-2000:]}")
            time.sleep(0.05)
        yield match.group(1), proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(15)
