"""Running the decode loop's step without Python per token: a captured CUDA graph, and regional compilation.

    step = partial(decode_step, lm, lm_head, codebook, settings, state)
    run = replayed_step(step, device)  # warm up, capture, replay
    for k in range(n):
        run()

Why: one eager decode step of the full-size AR launches ~3 500 kernels from ~18 000 Python calls, and on a GPU
that overhead (~65-87 ms per step measured on an H200) is 17-23x the time the step's weight read needs. The
decode loop (glm_grpo_ds/rollout/decode_loop.py) keeps every tensor a step reads or writes at a fixed address
(:class:`glm_grpo_ds.rollout.decode_loop.DecodeState`), moves its position in the cache with an in-place
counter, and never reads a value back to the host, so one step can be captured as a CUDA graph and replayed:
per token the host then draws the sampling noise (eagerly, from the run's generators, into the state's noise
buffer) and launches one graph.

The graph is captured per rollout: the cache, the state and (under ZeRO-3 on several ranks) the gathered
parameters are new tensors each rollout, and a graph holds addresses. Capturing costs the warm-up steps
(:data:`WARMUP_STEPS`, eager or compiling) and one step's recording, a few tenths of a percent of a rollout
of ~1 280 steps. Parameters changed *in place* between rollouts (the optimizer's step, a merged LoRA restored)
are read by the next replay anyway.

On a CPU there is nothing to capture: the same static-buffer step runs as a plain Python loop.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import torch

from ..runtime import log
from ..runtime.capture_gate import CAPTURE_SAFE

WARMUP_STEPS = 3  # eager (or compiling) steps before the capture: lazy inits, cuBLAS workspaces, compiled graphs


class ReplayedStep:
    """``step()`` (a function of the decode state only, no arguments) as a CUDA graph: the first
    :data:`WARMUP_STEPS` calls run it on a side stream, the next captures it and every call replays the graph.
    ``setup_s`` after the capture: the seconds spent warming up and capturing (compile included)."""

    def __init__(self, step: Callable[[], None]):
        self.step, self.calls, self.graph = step, 0, None
        self.setup_s: float | None = None
        self._t0 = time.perf_counter()

    def __call__(self) -> None:
        if self.graph is not None:
            self.graph.replay()
            return
        if self.calls < WARMUP_STEPS:
            # warm-up on a side stream, as torch.cuda.graph's documentation asks: no capture sees its lazy work
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.step()
            torch.cuda.current_stream().wait_stream(side)
            self.calls += 1
            return
        graph = torch.cuda.CUDAGraph()
        # thread_local: with rollout.one_step_off this captures on a background thread while the main thread runs
        # the DiT, whose allocations ("unsafe" during a capture) would otherwise invalidate this capture
        # the gate: no reward or DiT forward (which may synchronize the device) starts during the capture
        with CAPTURE_SAFE.capture(), torch.cuda.graph(graph, capture_error_mode="thread_local"):
            self.step()  # recorded, not run: the replay below runs this step
        self.graph = graph
        graph.replay()
        # once per rollout: the setup time below is the GPU's too. This stream only: with rollout.one_step_off the
        # main thread's DiT work is queued on another stream, and waiting for it would count its seconds here
        torch.cuda.current_stream().synchronize()
        self.setup_s = time.perf_counter() - self._t0


def replayed_step(step: Callable[[], None], device: torch.device) -> Callable[[], None]:
    """A captured :class:`ReplayedStep` on CUDA; ``step`` itself elsewhere (no capture on a CPU, said once)."""
    if device.type == "cuda":
        return ReplayedStep(step)
    log.warning_once(
        "cuda_graph_off_gpu",
        f"glm-grpo: rollout.cuda_graph: no CUDA device ({device.type}), so the decode loop runs its static-buffer "
        "step uncaptured (the same tokens, no graph)",
    )
    return step


_compiled_regions: dict[type, object] = {}


@contextlib.contextmanager
def compiled_layers(lm):
    """Inside the block every decoder layer of ``lm`` runs its norms and MLP through ``torch.compile``: one graph
    per submodule type, shared by all layers (the regions hold no layer index, unlike attention with its cache
    layer, which would compile once per layer), so the cold start is the compile of a handful of small graphs.
    The attention and the glue stay eager; under a CUDA graph they cost no launches from Python anyway. The
    modules are plain again after the block (the trainer's passes never run compiled code)."""
    regions = [
        module
        for layer in lm.layers
        for name, module in layer.named_children()
        if name == "mlp" or name.endswith("layernorm") or name.endswith("_norm")
    ]
    for module in regions:
        kind = type(module)
        if kind not in _compiled_regions:
            _compiled_regions[kind] = torch.compile(kind.forward, fullgraph=True, dynamic=False)
        module.forward = _compiled_regions[kind].__get__(module)
    try:
        yield len(regions)
    finally:
        for module in regions:
            del module.forward  # back to the class's forward


def report_setup(what: str, seconds: float | None, first: bool) -> None:
    """One log line with what the rollout's first graph cost (later rollouts reuse the compiled code)."""
    if seconds is not None and first:
        log.info(
            f"glm-grpo: rollout {what}: warm-up and capture took {seconds:.1f} s (first rollout; compile included)"
        )
