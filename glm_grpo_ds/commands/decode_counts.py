"""What one decode step costs in launches and host work, loop by loop: counts first, then tokens/s (issue #39).

    python -m glm_grpo_ds.commands.decode_counts                       # tiny model, 2 and 4 layers, -> 40
    python -m glm_grpo_ds.commands.decode_counts --layers 2,4 --group-size 16 --size 256 --out counts.json
    glm-grpo bench                                                     # the same table, section decode_step_counts

For each loop, per decode step (the noise draw and the step, after warm-up steps; a compiled one compiles on
its first call):

* ``hf_generate``: transformers' ``generate`` on the plain model (LoRA merged, peft unwrapped): what diffusers'
  pipeline samples with. Per step = (a run of ``k + 1`` new tokens - a run of 1) / ``k``;
* ``eager``: the rollout's decode loop (glm_grpo_ds/rollout/decode_loop.py) with peft's LoRA wrappers;
* ``merged``: the same loop with LoRA merged into the base weights (rollout.merge_lora);
* ``fused``: the same loop with LoRA unmerged through the fused low-rank path (rollout.fuse_lora: the exact one);
* ``compiled_step``: merged, the whole step through ``torch.compile`` (rollout.compile, compile_scope=step):
  the capture-ready step a GPU replays as one CUDA graph (not captured here);
* ``plain``: the merged loop's reference, the same AR built without peft (random weights, same seed).

Counted (deterministic: the same model and shapes give the same numbers on every run):

* kernels: the aten operators that do work, as a ``TorchDispatchMode`` sees them (after autograd and the
  composite decompositions, so ``linear`` counts as its ``addmm`` / ``mm``). Not counted: views (an operator
  whose schema returns an alias of an input and writes nothing: ``view``, ``expand``, ``t``, ``transpose``,
  ``permute``, ``(un)squeeze``, ``slice``, ``select``, ``split``, ``alias``, ``detach``, ``as_strided`` ...),
  the metadata-only operators of :data:`METADATA_OPS` (``_unsafe_view``, ``resolve_conj``, ...) and
  allocations that write nothing (``empty*``). In-place and ``out=`` operators count, and so do reads back
  to the host. The compiled step runs most of its work where no dispatcher sees it: its generated kernels
  (C++ or Triton) and the extern kernels (matmuls, attention) its C++ wrapper calls directly are counted from
  the profiler's events of a compile with inductor's kernel profiling on (:func:`kernel_profiled_step`),
  plus what it still dispatches (the copies into its mutated inputs, the eager noise draw);
* module calls: ``nn.Module`` calls (a global forward pre-hook);
* Python calls: ``sys.setprofile``'s ``call`` (a Python function entered) and ``c_call`` (a C function called
  from Python) events, in a pass of its own, less those of an empty call (the counter's own);
* host syncs: operators that read a device value back to the host (:data:`SYNC_OPS`: ``_local_scalar_dense``
  of ``.item()`` / ``bool()``, ``nonzero``, ``equal``, data-dependent shapes ...) and copies from an
  accelerator to the CPU. A CPU has nothing to wait for: these count what would stall a GPU.

tokens/s: rows / the step's seconds; on a CPU the fastest of ``--steps`` steps timed one by one, over
``--rounds`` rounds that take the variants in turn (on a shared machine a stretch of contention then costs
every variant alike), on a GPU the mean of the steps (one sync at the end); HF generate's from the fastest of
3 runs of each length. Every count and the step's seconds are measured at two layer counts of the same tiny
configuration and extrapolated linearly per layer to GLM-Image's 40 (tokens/s at 40 = rows / extrapolated
seconds: the tiny width's, not the real model's). Ratios are each loop's over the eager LoRA loop's.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

FULL_LAYERS = 40  # GLM-Image's AR
LOOPS = ("eager", "merged", "fused", "compiled_step")  # the decode loop's variants (decode_timing.VARIANTS' names)
VARIANTS = ("hf_generate", *LOOPS, "plain")
COUNTS = ("kernels", "module_calls", "python_calls", "host_syncs")
WARMUP = 2  # steps before the counted ones (lazy inits; the compiled step compiles on its first)
TARGET_COMPILED_OVER_EAGER = 4.0  # issue #39: the compiled loop's tokens/s over the eager LoRA loop's, on a CPU

# Not kernels: metadata-only operators (views by schema are skipped anyway; the common ones are named here for
# the reader, with those whose schema does not say so: _unsafe_view, _reshape_alias, lift_fresh, resolve_*),
# symbolic size queries and allocations that write nothing (no kernel on any device).
METADATA_OPS = frozenset(
    """_unsafe_view _reshape_alias reshape view alias detach expand as_strided t transpose permute unsqueeze
    squeeze slice select lift_fresh resolve_conj resolve_neg _conj _neg_view empty empty_like empty_strided
    new_empty new_empty_strided sym_size sym_stride sym_numel sym_storage_offset""".split()
)
# Host syncs: operators that read a device value back to the host or size their output by one (counted for
# repeat_interleave even when an output_size spares it).
SYNC_OPS = frozenset(
    """_local_scalar_dense item is_nonzero nonzero equal allclose masked_select _unique _unique2 unique_dim
    unique_consecutive repeat_interleave""".split()
)
# profiler events of work that never reaches the dispatcher: inductor's generated kernels and the extern
# kernels its C++ wrapper calls through AOTInductor's shims (at::cpu:: / at::cuda:: functions)
GENERATED_KERNEL_MARKS = ("cpp_fused", "triton_")
EXTERN_SHIM_PREFIXES = ("aoti_torch_cpu_", "aoti_torch_cuda_")


def _is_view(func) -> bool:
    """A schema-declared view: some return aliases an input and nothing is written."""
    schema = func._schema
    if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
        return False  # in place / out=: writes
    return any(r.alias_info is not None for r in schema.returns)


def _is_device_to_host(func, args, out) -> bool:
    name = func._opname
    if name == "_to_copy" and isinstance(out, torch.Tensor) and isinstance(args[0], torch.Tensor):
        return out.device.type == "cpu" and args[0].device.type != "cpu"
    if name == "copy_" and isinstance(args[0], torch.Tensor) and isinstance(args[1], torch.Tensor):
        return args[0].device.type == "cpu" and args[1].device.type != "cpu"
    return False


class OpCounter(TorchDispatchMode):
    """Counts the operators dispatched under it: ``kernels`` (work, by the module docstring's rule),
    ``host_syncs``, and ``ops`` (every counted kernel by operator name, for reading)."""

    def __init__(self):
        super().__init__()
        self.kernels = 0
        self.host_syncs = 0
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func._opname
        if name in SYNC_OPS or _is_device_to_host(func, args, out):
            self.host_syncs += 1
        if name not in METADATA_OPS and not _is_view(func):
            self.kernels += 1
            self.ops[str(func)] += 1
        return out


@contextlib.contextmanager
def _quiet_stderr():
    """File descriptor 2 to /dev/null: the profiler's C++ side prints lines of its own at start and stop."""
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def _compiled_kernels(events) -> collections.Counter:
    """The profiler events of work the dispatcher does not see, by name: inductor's generated kernels (C++ with
    ``cpp.enable_kernel_profile``, Triton always) and the extern kernels its C++ wrapper calls (AOTI shims)."""
    names = collections.Counter()
    for e in events:
        if any(m in e.name for m in GENERATED_KERNEL_MARKS):
            names["inductor kernel"] += 1
        elif e.name.startswith(EXTERN_SHIM_PREFIXES):
            names[e.name] += 1
    return names


@contextlib.contextmanager
def counting(profile: bool = False):
    """Kernels, host syncs and module calls of the block (``profile``: also the compiled code's kernels, from
    the profiler's events). Yields a dict, filled when the block ends."""
    counts: dict = {}
    calls = [0]

    def hook(module, args):
        calls[0] += 1

    prof = None
    if profile:
        os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # no warning that a CPU has no GPU
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        with _quiet_stderr():
            prof.start()
    handle = torch.nn.modules.module.register_module_forward_pre_hook(hook)
    try:
        with OpCounter() as ops:
            yield counts
    finally:
        handle.remove()
        if prof is not None:
            with _quiet_stderr():
                prof.stop()
    compiled = _compiled_kernels(prof.events()) if prof is not None else collections.Counter()
    counts.update(
        kernels=ops.kernels + sum(compiled.values()),
        module_calls=calls[0],
        host_syncs=ops.host_syncs,
        ops=dict(ops.ops + compiled),
    )


def python_calls(run) -> int:
    """Python calls of ``run()`` (``sys.setprofile``: ``call`` and ``c_call`` events), less those of an empty
    ``run`` (the counter's own)."""

    def count(fn) -> int:
        n = [0]

        def profiler(frame, event, arg):
            if event == "call" or event == "c_call":
                n[0] += 1

        sys.setprofile(profiler)
        try:
            fn()
        finally:
            sys.setprofile(None)
        return n[0]

    if sys.getprofile() is not None:  # cProfile and the like: theirs could not be put back
        raise RuntimeError("decode_counts: Python calls cannot be counted under another profiler (sys.setprofile)")

    return count(run) - count(lambda: None)


def _clock(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _step_ms(run, steps: int, device: torch.device) -> float:
    """ms of one ``run()``: on a CPU the fastest of ``steps`` calls timed one by one (a step that another job
    interrupted is longer, never shorter, so the minimum is the step's own cost), on a GPU the mean over all
    of them (timing each would add a sync to each)."""
    if device.type == "cuda":
        t0 = _clock(device)
        for _ in range(steps):
            run()
        return 1e3 * (_clock(device) - t0) / steps
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return 1e3 * min(times)


def _pass(run) -> dict:
    with counting() as counts:
        run()
    return {**counts, "python_calls": python_calls(run)}


_profiled_steps: dict[str, object] = {}


def kernel_profiled_step(device: torch.device):
    """The decode loop's step compiled as :func:`~glm_grpo_ds.rollout.decode_loop.compiled_step` compiles it
    (``fullgraph``, static shapes, inductor's C++ wrapper on a CPU), with inductor's kernel profiling on: every
    generated C++ kernel and every extern kernel the wrapper calls is a profiler event (Triton kernels are one
    without it). A code object of its own, so its graphs stay apart from the loop's, which is what is timed
    (the profiling costs ~4 % of the tiny model's compiled step on a CPU)."""
    if device.type not in _profiled_steps:
        from ..rollout.decode_loop import _step

        def profiled_step(lm, lm_head, codebook, sampling, s):
            _step(lm, lm_head, codebook, sampling, s)

        options = {"cpp_wrapper": True, "cpp.enable_kernel_profile": True} if device.type == "cpu" else {}
        _profiled_steps[device.type] = torch.compile(profiled_step, fullgraph=True, dynamic=False, options=options)
    return _profiled_steps[device.type]


@torch.no_grad()
def count_step(policy, rows, positions, grid, sampling, variant: str, steps: int = 128, seed: int = 0) -> dict:
    """One decode step of ``variant`` (``eager``, ``merged``, ``fused``, ``compiled_step``; ``plain``: the
    ``eager`` loop on a model without peft) from a prefill of ``rows``: :data:`WARMUP` steps, one counted step per
    counter, then ``steps`` timed steps (at most what the grid has left; 0: none, ``ms_per_step`` None). Returns
    the counts of :data:`COUNTS`, ``ops`` (kernels by operator) and ``ms_per_step``.

    ``compiled_step``: its kernels, module calls and host syncs are counted on :func:`kernel_profiled_step`'s
    compile; its Python calls and time on the loop's own ``compiled_step``, as the loop runs it (dynamo's guards
    skipped after the first step, except under ``sys.setprofile``, where that stance fails as if the graph had to
    be recompiled: the guards are evaluated in C++, no Python calls of their own)."""
    from ..rollout.decode_loop import compiled_step, prefill, token_steps, unchecked_guards
    from ..rollout.fused_lora import lora_fused
    from ..rollout.merged_lora import BaseCopy, lora_merged

    if variant not in (*LOOPS, "plain"):
        raise ValueError(f"count_step: unknown variant {variant!r}")
    compiled = variant == "compiled_step"
    steps = max(0, min(steps, grid.num_tokens - 1 - (2 * WARMUP + 2)))  # the grid's tokens bound the steps
    device = rows["input_ids"].device
    gen = torch.Generator(device=device).manual_seed(seed)
    with contextlib.ExitStack() as ctx:
        if variant in ("merged", "compiled_step"):
            ctx.enter_context(lora_merged(policy, BaseCopy("device")))
        if variant == "fused":
            ctx.enter_context(lora_fused(policy))
        state = prefill(policy, rows["input_ids"], rows["attention_mask"], positions, grid.num_tokens, sampling)

        def runner(step=None):  # a token as the loop takes it; step: a compiled form of the loop's step
            return ctx.enter_context(token_steps(policy, state, sampling, [gen], step=step))

        if not compiled:
            run = runner()
            for _ in range(WARMUP):
                run()
            with counting() as out:
                run()
            out["python_calls"] = python_calls(run)
            out["ms_per_step"] = _step_ms(run, steps, device) if steps else None
            return out
        counted = runner(kernel_profiled_step(device))
        counted()  # compiles
        with unchecked_guards():  # as the loop runs every step after its first
            for _ in range(WARMUP - 1):
                counted()
            with counting(profile=True) as out:
                counted()
        run = runner(compiled_step(device)) if steps else counted  # without timing: the same code, one compile
        for _ in range(WARMUP if steps else 0):
            run()
        out["python_calls"] = python_calls(run)
        with unchecked_guards():
            out["ms_per_step"] = _step_ms(run, steps, device) if steps else None
    return out


@torch.no_grad()
def count_generate(policy, rows, sampling, k: int = 2, steps: int = 128, seed: int = 0) -> dict:
    """transformers' ``generate`` on the plain model (LoRA merged, peft unwrapped): per step = (a run of
    ``k + 1`` new tokens - a run of 1) / ``k`` for every count, and for the seconds (``steps + 1`` - 1)."""
    from ..model.glm_image import unwrap_ar
    from ..rollout.merged_lora import BaseCopy, lora_merged
    from .decode_timing import hf_generate

    device = rows["input_ids"].device

    def generate(n: int):
        hf_generate(unwrap_ar(policy), rows, sampling, n, seed)

    with lora_merged(policy, BaseCopy("device")):
        generate(k + 1)  # warm-up
        one, more = _pass(lambda: generate(1)), _pass(lambda: generate(k + 1))
        seconds = {1: [], steps + 1: []}
        for _ in range(3):  # the fastest of 3 runs of each length
            for n in seconds:
                t0 = _clock(device)
                generate(n)
                seconds[n].append(_clock(device) - t0)
        seconds = {n: min(t) for n, t in seconds.items()}
    out = {key: (more[key] - one[key]) / k for key in COUNTS}
    ops = collections.Counter(more["ops"])
    ops.subtract(one["ops"])
    out["ops"] = {name: n / k for name, n in ops.items() if n}
    out["ms_per_step"] = 1e3 * (seconds[steps + 1] - seconds[1]) / steps
    return out


def lora_layer_count(policy) -> int:
    from ..rollout.merged_lora import _lora_layers

    return sum(1 for _ in _lora_layers(policy))


def setup(layers: int, group_size: int, size: int, lora_r: int = 16, seed: int = 0, device=None):
    """``(policy, rows, positions, grid, sampling)``: the tiny configuration's AR with ``layers`` decoder layers and
    LoRA of rank ``r`` (glm_grpo_ds/commands/decode_timing.py's ``build_policy``: random weights, ``lora_B``
    random), ``group_size`` rows of one prompt at ``size``², the policy distribution uncut."""
    from ..config import SamplingConfig
    from ..rollout.generate import prepare_rows
    from .decode_timing import PROMPT, build_policy

    device = device or torch.device("cpu")
    policy, processor = build_policy(True, layers, lora_r, device, seed)
    rows, positions, grid = prepare_rows(policy, processor, [PROMPT], group_size, size, size, device)
    return policy, rows, positions, grid, SamplingConfig(temperature=1.0, top_k=0, top_p=1.0)


def measure_layers(
    layers: int,
    variants=VARIANTS,
    group_size: int = 4,
    size: int = 64,
    lora_r: int = 16,
    steps: int = 128,
    seed: int = 0,
    device: torch.device | None = None,
    rounds: int = 3,
) -> dict:
    """Every variant's per-step counts and ms on the tiny model with ``layers`` decoder layers: ``rounds`` rounds
    over the variants in turn (each from a fresh prefill), the fastest round's ms kept, so a stretch of time when
    other jobs hold the cores costs every variant alike. ``counts_repeat``: every round counted the same."""
    from .decode_timing import build_ar

    device = device or torch.device("cpu")
    policy, rows, positions, grid, sampling = setup(layers, group_size, size, lora_r, seed, device)
    plain = build_ar(True, layers, device, seed) if "plain" in variants else None
    out = {"lora_layers": lora_layer_count(policy), "rows": rows["input_ids"].shape[0], "variants": {}}
    repeat = True
    for _ in range(max(1, rounds)):
        for name in variants:
            if name == "hf_generate":
                r = count_generate(policy, rows, sampling, steps=steps, seed=seed)
            elif name == "plain":
                r = count_step(plain, rows, positions, grid, sampling, "eager", steps, seed)
            else:
                r = count_step(policy, rows, positions, grid, sampling, name, steps, seed)
            first = out["variants"].setdefault(name, r)
            repeat &= all(first[key] == r[key] for key in COUNTS)
            if r["ms_per_step"] is not None and first["ms_per_step"] is not None:
                first["ms_per_step"] = min(first["ms_per_step"], r["ms_per_step"])
    out["counts_repeat"] = repeat
    return out


def extrapolate(low: float, high: float, layers_low: int, layers_high: int, to: int = FULL_LAYERS) -> float:
    """Linear in the layer count through the two measurements (None if either is)."""
    if low is None or high is None:
        return None
    return low + (high - low) * (to - layers_low) / (layers_high - layers_low)


def decode_counts(
    layers_list=(2, 4),
    variants=VARIANTS,
    group_size: int = 4,
    size: int = 64,
    lora_r: int = 16,
    steps: int = 128,
    seed: int = 0,
    device: str | None = None,
    threads: int | None = None,
    rounds: int = 3,
) -> dict:
    """Counts and tokens/s per decode step at each of ``layers_list`` (two layer counts of the tiny model), each
    extrapolated linearly per layer to 40 layers, and every variant's ratios over the eager LoRA loop's.
    ``threads``: torch's CPU threads for the measurement (restored after it; None: as they are)."""
    if len(layers_list) != 2 or layers_list[0] == layers_list[1]:
        raise ValueError(f"decode_counts: two different layer counts, got {list(layers_list)}")
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    lo, hi = sorted(layers_list)
    before = torch.get_num_threads()
    try:
        if threads:
            torch.set_num_threads(threads)
        at = {n: measure_layers(n, variants, group_size, size, lora_r, steps, seed, dev, rounds) for n in (lo, hi)}
        used_threads = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    rows = at[lo]["rows"]
    keys = (str(lo), str(hi), str(FULL_LAYERS))  # JSON object keys: the layer counts
    out: dict = {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "layers": [lo, hi],
        "group_size": group_size,
        "size": size,
        "lora_r": lora_r,
        "lora_layers": {str(lo): at[lo]["lora_layers"], str(hi): at[hi]["lora_layers"]},
        "steps_timed": steps,
        "rounds": rounds,
        "threads": used_threads,
        "variants": {},
    }
    for name in variants:
        a, b = at[lo]["variants"][name], at[hi]["variants"][name]
        v = {"ops": a["ops"]}
        for key in (*COUNTS, "ms_per_step"):
            v[key] = dict(zip(keys, (a[key], b[key], extrapolate(a[key], b[key], lo, hi))))
        v["per_layer"] = {key: (b[key] - a[key]) / (hi - lo) for key in COUNTS}
        v["tokens_per_s"] = {n: rows * 1e3 / ms if ms and ms > 0 else None for n, ms in v["ms_per_step"].items()}
        out["variants"][name] = v
    if "eager" in out["variants"]:
        eager = out["variants"]["eager"]
        for v in out["variants"].values():
            v["vs_eager"] = {
                key: {
                    n: (v[key][n] / eager[key][n] if eager[key][n] and v[key][n] is not None else None) for n in v[key]
                }
                for key in (*COUNTS, "tokens_per_s")
            }
    checks = {"counts_repeat": at[lo]["counts_repeat"] and at[hi]["counts_repeat"]}
    names = out["variants"]
    if "merged" in names and "plain" in names:
        for key in ("kernels", "module_calls"):
            checks[f"merged_{key}_equal_plain"] = all(
                names["merged"][key][n] == names["plain"][key][n] for n in keys[:2]
            )
    if "compiled_step" in names and "eager" in names:
        checks["compiled_over_eager_tokens_per_s"] = dict(names["compiled_step"]["vs_eager"]["tokens_per_s"])
        checks["compiled_over_eager_target"] = TARGET_COMPILED_OVER_EAGER
    out["checks"] = checks
    return out


def format_counts(r: dict) -> str:
    """The table: per decode step, each count and tokens/s at the two layer counts and at 40 (extrapolated, *),
    with each loop's ratio over the eager LoRA loop's (at 40 layers; tokens/s also as measured)."""
    lo, hi = r["layers"]
    keys = (str(lo), str(hi), str(FULL_LAYERS))
    names = list(r["variants"])
    width = max(15, *(len(n) + 2 for n in names))
    lines = [
        f"per decode step on {r['device']} (torch {r['torch']}): tiny model, G={r['group_size']}, "
        f"{r['size']}x{r['size']}, {r['threads']} CPU threads, LoRA r={r['lora_r']} "
        f"({r['lora_layers'][keys[0]]} / {r['lora_layers'][keys[1]]} adapted linears); measured at {lo} and {hi} "
        f"layers, * = extrapolated linearly per layer to {FULL_LAYERS}",
        f"  {'':<24}" + "".join(f"{n:>{width}}" for n in names),
    ]

    def row(label, cells):
        lines.append(f"  {label:<24}" + "".join(f"{c:>{width}}" for c in cells))

    def num(x, fmt):
        return "-" if x is None else format(x, fmt)

    for key in (*COUNTS, "tokens_per_s"):
        title = key.replace("_per_s", "/s").replace("_", " ")
        for n in keys:
            star = "*" if n == keys[2] else ""
            row(
                f"{title} @{n}{star}" if n == keys[0] else f"  @{n}{star}",
                [num(v[key][n], ",.0f") for v in r["variants"].values()],
            )
        for n in (keys[0], keys[2]) if key == "tokens_per_s" else (keys[2],):
            if all("vs_eager" in v for v in r["variants"].values()):
                star = "*" if n == keys[2] else ""
                row(f"  x eager @{n}{star}", [num(v["vs_eager"][key][n], ".2f") for v in r["variants"].values()])
    c = r["checks"]
    yes = {True: "yes", False: "NO"}
    lines.append(f"  every count the same in all {r['rounds']} rounds: {yes[c['counts_repeat']]}")
    if "merged_kernels_equal_plain" in c:
        lines.append(
            f"  merged == the plain model (no peft): kernels {yes[c['merged_kernels_equal_plain']]}, "
            f"module calls {yes[c['merged_module_calls_equal_plain']]}"
        )
    if "compiled_over_eager_tokens_per_s" in c:
        target = c["compiled_over_eager_target"]
        ratios = ", ".join(
            f"{num(x, '.2f')}x at {n}{'*' if n == keys[2] else ''} layers"
            + ("" if x is None else f" ({'met' if x >= target else 'NOT met'})")
            for n, x in c["compiled_over_eager_tokens_per_s"].items()
        )
        lines.append(f"  compiled / eager LoRA tokens/s (target >= {target:.0f}x on a CPU): {ratios}")
    lines.append(
        "  kernels: aten ops that do work (no views, metadata-only ops or bare allocations; the compiled step's "
        "generated and extern kernels); host syncs: reads of a device value by the host"
    )
    return "\n".join(lines)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m glm_grpo_ds.commands.decode_counts", description=__doc__.split("\n")[0])
    p.add_argument("--layers", default="2,4", help="two decoder-layer counts of the tiny model to measure")
    p.add_argument("--group-size", type=int, default=16, help="rows (G rows of one prompt)")
    p.add_argument("--size", type=int, default=256, help="image height = width")
    p.add_argument("--lora-r", type=int, default=16, help="LoRA rank (bench's training config: 16)")
    p.add_argument("--steps", type=int, default=128, help="timed decode steps per variant (the fastest counts)")
    p.add_argument("--rounds", type=int, default=3, help="rounds over the variants in turn; the fastest is kept")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--device", default=None)
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (0: torch's default). 1: the tiny step is launch-bound, and a second thread adds "
        "OpenMP barriers that stall whenever another job holds a core",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the report as JSON here")
    a = p.parse_args(argv)
    a.layers = [int(x) for x in a.layers.split(",") if x]
    a.variants = [v for v in a.variants.split(",") if v]
    unknown = [v for v in a.variants if v not in VARIANTS]
    if unknown:
        p.error(f"--variants: unknown {unknown[0]!r}; choose from {', '.join(VARIANTS)}")
    if len(a.layers) != 2 or a.layers[0] == a.layers[1]:
        p.error("--layers: two different layer counts, e.g. 2,4")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    r = decode_counts(
        a.layers, a.variants, a.group_size, a.size, a.lora_r, a.steps, a.seed, a.device, a.threads, a.rounds
    )
    print(format_counts(r))
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(r, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
