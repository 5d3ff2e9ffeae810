"""What one decode step costs in launches and host work, loop by loop: counts first, then tokens/s (issue #39).

    glm-grpo profile decode-counts                       # tiny model, 2 and 4 layers, -> 40
    glm-grpo profile decode-counts --layers 2,4 --group-size 16 --size 256 --out counts.json
    python -m glm_grpo_ds.profiling.decode_counts        # the same
    glm-grpo profile bench                               # the same table, section decode_step_counts

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

Counted per step, by profiling/decode_counters.py's rules: kernels (aten operators that do work, and the
compiled step's generated and extern kernels), module calls, Python calls and host syncs (deterministic: the
same model and shapes give the same numbers on every run).

tokens/s: rows / the step's seconds; on a CPU the fastest of ``--steps`` steps timed one by one, over
``--rounds`` rounds that take the variants in turn (on a shared machine a stretch of contention then costs
every variant alike), on a GPU the mean of the steps (one sync at the end); HF generate's from the fastest of
3 runs of each length. Every count and the step's seconds are measured at two layer counts of the same tiny
configuration and extrapolated linearly per layer to GLM-Image's 40 (tokens/s at 40 = rows / extrapolated
seconds: the tiny width's, not the real model's). Ratios are each loop's over the eager LoRA loop's.
"""

from __future__ import annotations

import collections
import contextlib
import json
import time
from pathlib import Path

import torch

from .decode_counters import COUNTS, counted_pass, counting, kernel_profiled_step, python_calls
from .decode_counts_report import checks, format_counts, variant_table
from .tools import parser_for

LOOPS = ("eager", "merged", "fused", "compiled_step")  # the decode loop's variants (decode_timing.VARIANTS' names)
VARIANTS = ("hf_generate", *LOOPS, "plain")
WARMUP = 2  # steps before the counted ones (lazy inits; the compiled step compiles on its first)


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
    from .decode_models import hf_generate

    device = rows["input_ids"].device

    def generate(n: int):
        hf_generate(unwrap_ar(policy), rows, sampling, n, seed)

    with lora_merged(policy, BaseCopy("device")):
        generate(k + 1)  # warm-up
        one, more = counted_pass(lambda: generate(1)), counted_pass(lambda: generate(k + 1))
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
    from ..rollout.merged_lora import lora_layers

    return sum(1 for _ in lora_layers(policy))


def setup(layers: int, group_size: int, size: int, lora_r: int = 16, seed: int = 0, device=None):
    """``(policy, rows, positions, grid, sampling)``: the tiny configuration's AR with ``layers`` decoder layers and
    LoRA of rank ``r`` (glm_grpo_ds/profiling/decode_models.py's ``build_policy``: random weights, ``lora_B``
    random), ``group_size`` rows of one prompt at ``size``², the policy distribution uncut."""
    from ..config import SamplingConfig
    from ..rollout.generate import prepare_rows
    from .decode_models import PROMPT, build_policy

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
    from .decode_models import build_ar

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
        "variants": variant_table(at, lo, hi, variants),
    }
    out["checks"] = checks(at, lo, hi, out["variants"])
    return out


def parse_args(argv):
    p = parser_for("decode-counts")
    p.add_argument("--layers", default="2,4", help="two decoder-layer counts of the tiny model to measure")
    p.add_argument("--group-size", type=int, default=16, help="rows (G rows of one prompt)")
    p.add_argument("--size", type=int, default=256, help="image height = width")
    p.add_argument("--lora-r", type=int, default=16, help="LoRA rank (that of bench's training config)")
    p.add_argument("--steps", type=int, default=128, help="timed decode steps per variant (the fastest counts)")
    p.add_argument("--rounds", type=int, default=3, help="rounds over the variants in turn; the fastest is kept")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (0: torch's default). 1: the tiny step is launch-bound, and a second thread adds "
        "OpenMP barriers that stall whenever another job holds a core",
    )
    p.add_argument("--seed", type=int, default=0, help="seeds the weights, the LoRA adapters and the sampling noise")
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


if __name__ == "__main__":  # a process entry point (the bench's ranks too): no interpreter teardown
    from ..runtime import process_exit

    raise SystemExit(process_exit.exit_now(main()))
