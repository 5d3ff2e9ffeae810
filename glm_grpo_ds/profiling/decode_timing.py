"""Time the rollout's decode step, variant by variant, on the model size a user trains (GPU), or tiny (CPU).

    glm-grpo profile decode-timing                  # GPU: the full-size AR (40 layers), LoRA r=64, G=16, 1024²
    glm-grpo profile decode-timing --layers 8       # a real-width slice of 8 layers: ms scaled to 40 shown
    glm-grpo profile decode-timing --tiny --steps 8 --group-size 4  # the reduced CPU form the test suite runs
    bash launch/gpu_timing.sh                       # this, then one training step with per-phase times

It builds GLM-Image's AR on the device with random weights (bf16; transformers' real configuration, the tiny
vocabulary layout of ``glm-grpo tiny-model --full-size-ar``) and peft LoRA adapters as the trainer has them
(fp32, ``lora_B`` random so merging changes the weights), prefills ``--group-size`` rows of one prompt at
``--size``², then for each variant runs the decode loop's own step (glm_grpo_ds/rollout/decode_loop.py) from
the same prefill with the same noise: untimed warm-up steps (compile, capture), then ``--steps`` steps timed
with CUDA events (perf_counter on a CPU). Variants:

* ``eager``: peft's LoRA wrappers, fp32 adapters (the trainer's rollout before issue #39);
* ``merged``: LoRA merged into the base weights (rollout.merge_lora);
* ``graph_lora``: the eager LoRA step captured as a CUDA graph (rollout.cuda_graph);
* ``graph``: merged and captured (merge_lora + cuda_graph);
* ``graph_compiled``: merged, each layer's norms and MLP compiled, captured (+ compile, compile_scope=layers);
* ``compiled_step``: merged, the whole step compiled (compile_scope=step), captured on a GPU; slow to compile;
* ``fused``: LoRA unmerged through the fused low-rank path (rollout.fuse_lora): the exact sampler, fewer kernels;
* ``graph_fused``: fused and captured (fuse_lora + cuda_graph);
* ``graph_fused_compiled``: fused, each layer's norms and MLP (its adapted projections inside) compiled, captured
  (+ compile, compile_scope=layers): the exact fast sampler of the shipped GPU configs;
* ``hf_generate``: transformers' ``generate`` on the merged model (what diffusers' pipeline samples with).

For each: ms per decode step, tokens/s, the speed-up over ``eager``, the fraction of the HBM roofline (the step
reads every language-model weight and the whole KV cache once), whether its tokens equal the reference's (the
merged variants against ``merged``, the LoRA ones against ``eager``, the graphed fused ones against ``fused``) and
the largest log-prob difference, the decode seconds per image (ms/step x tokens per image / rows: what ``--group-size``
rows buy) and the warm-up + capture seconds. Exit 1 when a variant that must reproduce its reference bitwise does not.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .decode_models import PROMPT, build_policy, hf_generate
from .tools import parser_for

HBM_BYTES_PER_S = {"H100": 3.35e12, "H200": 4.8e12, "A100": 2.04e12, "B200": 8.0e12}  # peak, by device name
FULL_LAYERS = 40  # GLM-Image's AR
# `glm-grpo verify-logprobs`' fp32 tolerance (commands/verify_logprobs.py, not imported: the profilers import no
# command; tests/unit/test_profile_command.py checks the two agree)
FP32_LOGP_TOLERANCE = 1e-4


@dataclass(frozen=True)
class Variant:
    lora: str  # "peft" (peft's wrappers), "merged" (rollout.merge_lora) or "fused" (rollout.fuse_lora)
    graph: bool
    compile: str | None  # None, "layers" or "step"
    reference: str  # the variant whose tokens it must reproduce
    exact: bool  # bitwise equal to the reference (same kernels), else reported only


VARIANTS = {
    "eager": Variant("peft", False, None, "eager", True),
    "merged": Variant("merged", False, None, "merged", True),
    "graph_lora": Variant("peft", True, None, "eager", True),
    "graph": Variant("merged", True, None, "merged", True),
    "graph_compiled": Variant("merged", True, "layers", "merged", False),
    "compiled_step": Variant("merged", True, "step", "merged", False),
    # the exact sampler: peft's math in other kernels, so the same tokens as the eager loop, not its bits
    "fused": Variant("fused", False, None, "eager", False),
    "graph_fused": Variant("fused", True, None, "fused", True),
    "graph_fused_compiled": Variant("fused", True, "layers", "fused", False),
}
DEFAULT_VARIANTS = (
    "eager",
    "merged",
    "graph_lora",
    "graph",
    "graph_compiled",
    "fused",
    "graph_fused",
    "graph_fused_compiled",
    "hf_generate",
)


def device_timer(device: torch.device):
    """``(start, stop)``: stop() returns seconds since start(), measured on the device's clock."""
    if device.type == "cuda":
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def stop():
            end.record()
            end.synchronize()
            return begin.elapsed_time(end) / 1e3

        return begin.record, stop
    t0 = [0.0]

    def start():
        t0[0] = time.perf_counter()

    return start, lambda: time.perf_counter() - t0[0]


@torch.no_grad()
def run_variant(policy, rows, positions, grid, sampling, v: Variant, steps: int, seed: int) -> dict:
    """The decode loop's step under variant ``v``: warm-up (and capture), then ``steps`` timed steps."""
    from ..rollout.decode_loop import LoopOptions, prefill, token_steps
    from ..rollout.fused_lora import lora_fused
    from ..rollout.merged_lora import BaseCopy, lora_layers, lora_merged
    from ..rollout.step_graph import WARMUP_STEPS

    device = rows["input_ids"].device
    options = LoopOptions(compile=v.compile is not None, compile_scope=v.compile or "step", cuda_graph=v.graph)
    warm = WARMUP_STEPS + 1
    gen = torch.Generator(device=device).manual_seed(seed)
    t_setup = time.perf_counter()
    keep = BaseCopy("device")
    adapters = {"merged": lambda: lora_merged(policy, keep), "fused": lambda: lora_fused(policy)}
    with adapters.get(v.lora, contextlib.nullcontext)():
        state = prefill(policy, rows["input_ids"], rows["attention_mask"], positions, grid.num_tokens, sampling)
        with token_steps(policy, state, sampling, [gen], options) as advance:
            start, stop = device_timer(device)
            for k in range(warm + steps):
                if k == warm:
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    setup_s = time.perf_counter() - t_setup  # prefill, warm-up, compile and capture
                    start()
                advance()
            seconds = stop()
    n = warm + steps
    weights = {name: w for name, _, w in lora_layers(policy)}
    restored = all(torch.equal(weights[name], saved) for name, saved in keep.saved.items())
    return {
        "restored_bitwise": restored if v.lora == "merged" else None,
        "ms_per_step": 1e3 * seconds / steps,
        "setup_s": setup_s,
        "ids": state.ids[:, :n].cpu(),
        "logps": state.logps[:, :n].cpu(),
        "captured": advance.replayed is not None,
    }


def agreement(r: dict, ref: dict) -> dict:
    """Token agreement of two runs from the same prefill and noise: the fraction of equal tokens, each row's
    first step that differs (the rest of a row follows other tokens, so it is not compared), and the largest
    log-prob difference before that step (same tokens, so a difference in the model's numerics only)."""
    same = r["ids"] == ref["ids"]
    agree = same.long().cumprod(dim=1).bool()  # [B, n]: True up to the row's first differing token
    diff = (r["logps"] - ref["logps"]).abs().where(agree, torch.zeros_like(r["logps"]))
    first = torch.where(agree.all(1), same.shape[1], (~agree).long().argmax(1))
    return {
        "same_tokens": float(same.float().mean()),
        "first_difference_min": int(first.min()),
        "max_logp_diff": float(diff.max()),
    }


@torch.no_grad()
def hf_generate_ms(policy, rows, sampling, steps: int, seed: int) -> float:
    """ms per decode step of transformers' ``generate`` on the merged model: (steps+1 tokens - 1 token) / steps,
    each the fastest of 3 calls after a warm-up call: a difference of two single timings went negative on a loaded
    CPU with the tiny model (4 steps of ~5 ms against the scheduler's noise)."""
    from ..model.glm_image import unwrap_ar
    from ..rollout.merged_lora import BaseCopy, lora_merged

    device = rows["input_ids"].device
    start, stop = device_timer(device)
    times: dict[int, float] = {}
    with lora_merged(policy, BaseCopy("device")):
        for n in (1, steps + 1):
            hf_generate(unwrap_ar(policy), rows, sampling, n, seed)  # warm-up
        for _ in range(3):
            for n in (1, steps + 1):
                start()
                hf_generate(unwrap_ar(policy), rows, sampling, n, seed)
                times[n] = min(times.get(n, float("inf")), stop())
    return 1e3 * (times[steps + 1] - times[1]) / steps


def step_bytes(policy, state_rows: int, cache_slots: int) -> int:
    """Bytes one decode step must read at least: every language-model and lm_head weight (merged: the plain
    model's) and the whole static KV cache."""
    from ..model.glm_image import unwrap_ar

    ar = unwrap_ar(policy)
    weights = sum(
        p.numel() * p.element_size()
        for n, p in ar.named_parameters()
        if ("language_model" in n or "lm_head" in n) and "lora_" not in n
    )
    t = ar.config.text_config
    head_dim = getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads
    kv = 2 * t.num_hidden_layers * state_rows * t.num_key_value_heads * cache_slots * head_dim
    return weights + kv * next(ar.parameters()).element_size()


def measure(a) -> dict:
    from ..config import SamplingConfig
    from ..rollout.decode_loop import cache_slots
    from ..rollout.generate import prepare_rows

    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    t0 = time.perf_counter()
    policy, processor = build_policy(a.tiny, a.layers, a.lora_r, device, a.seed, a.model)
    build_s = time.perf_counter() - t0
    sampling = SamplingConfig(temperature=a.temperature, top_k=a.top_k, top_p=a.top_p)
    rows, positions, grid = prepare_rows(policy, processor, [PROMPT], a.group_size, a.size, a.size, device)
    layers = policy.base_model.model.config.text_config.num_hidden_layers
    fp32 = policy.base_model.model.dtype == torch.float32  # the tiny form: the fused path must give peft's tokens
    fp32_tolerance = FP32_LOGP_TOLERANCE  # and its log-probs to verify-logprobs' fp32 tolerance
    results, failures = {}, []
    for name in a.variants:
        if name == "hf_generate":
            results[name] = {"ms_per_step": hf_generate_ms(policy, rows, sampling, a.steps, a.seed)}
            continue
        v = VARIANTS[name]
        r = run_variant(policy, rows, positions, grid, sampling, v, a.steps, a.seed)
        ref = results.get(v.reference)
        if ref is not None and "ids" in ref:
            r.update(agreement(r, ref), reference=v.reference)
            if v.exact and (r["same_tokens"] < 1 or r["max_logp_diff"] > 0):
                failures.append(f"{name}: not bitwise the {v.reference} loop's tokens and log-probs")
            if v.lora == "fused" and fp32 and (r["same_tokens"] < 1 or r["max_logp_diff"] > fp32_tolerance):
                failures.append(f"{name}: in fp32 not the {v.reference} loop's tokens and log-probs")
        if r["restored_bitwise"] is False:
            failures.append(f"{name}: the base weights were not restored bitwise after the merged rollout")
        results[name] = r
        print(f"  {name}: {r['ms_per_step']:.2f} ms/step", flush=True)
    if "merged" in results and "eager" in results:  # merging changes the weights' rounding, not the model
        results["merged"].update(
            {f"vs_eager_{k}": v for k, v in agreement(results["merged"], results["eager"]).items()}
        )
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    bw = a.hbm_gbps * 1e9 if a.hbm_gbps else next((v for k, v in HBM_BYTES_PER_S.items() if k in name), None)
    nbytes = step_bytes(policy, rows["input_ids"].shape[0], cache_slots(rows["input_ids"].shape[1], grid.num_tokens))
    scale = FULL_LAYERS / layers
    for r in results.values():
        r.pop("ids", None), r.pop("logps", None)
        r["tokens_per_s"] = a.group_size * 1e3 / r["ms_per_step"]
        r["decode_s_per_image"] = r["ms_per_step"] / 1e3 * grid.num_tokens / a.group_size
        r["ms_per_step_at_40_layers"] = r["ms_per_step"] * scale
        if "eager" in results:
            r["speedup_vs_eager"] = results["eager"]["ms_per_step"] / r["ms_per_step"]
        if bw:
            r["roofline_fraction"] = nbytes / bw / (r["ms_per_step"] / 1e3)
    return {
        "device": name,
        "torch": torch.__version__,
        "layers": layers,
        "group_size": a.group_size,
        "size": a.size,
        "decode_tokens": grid.num_tokens,
        "steps_timed": a.steps,
        "lora_r": a.lora_r,
        "build_s": build_s,
        "bytes_per_step": nbytes,
        "hbm_bytes_per_s": bw,
        "floor_ms_per_step": nbytes / bw * 1e3 if bw else None,
        "variants": results,
        "failures": failures,
    }


def format_report(m: dict) -> str:
    floor = (
        f", floor {m['floor_ms_per_step']:.2f} ms/step at {m['hbm_bytes_per_s'] / 1e12:.2f} TB/s"
        if m["floor_ms_per_step"]
        else ""
    )
    lines = [
        f"decode step on {m['device']} (torch {m['torch']}): {m['layers']} layers, G={m['group_size']}, "
        f"{m['size']}², LoRA r={m['lora_r']}, {m['steps_timed']} steps timed; "
        f"reads {m['bytes_per_step'] / 1e9:.2f} GB/step" + floor,
        f"{'variant':<22}{'ms/step':>9}{'@40 layers':>11}{'tok/s':>9}{'x eager':>8}{'roofline':>9}{'same tokens':>12}"
        f"{'max |dlogp|':>12}{'s/image':>9}{'setup s':>9}",
    ]
    for name, r in m["variants"].items():

        def cell(key, fmt, width, r=r):
            return format(r[key], fmt).rjust(width) if r.get(key) is not None else "-".rjust(width)

        lines.append(
            f"{name:<22}{cell('ms_per_step', '.2f', 9)}{cell('ms_per_step_at_40_layers', '.2f', 11)}"
            f"{cell('tokens_per_s', '.0f', 9)}{cell('speedup_vs_eager', '.2f', 8)}{cell('roofline_fraction', '.1%', 9)}"
            f"{cell('same_tokens', '.2%', 12)}{cell('max_logp_diff', '.1e', 12)}{cell('decode_s_per_image', '.3f', 9)}"
            f"{cell('setup_s', '.1f', 9)}"
        )
    merged = m["variants"].get("merged", {})
    if "vs_eager_same_tokens" in merged:
        lines.append(
            f"merged vs eager LoRA: {merged['vs_eager_same_tokens']:.2%} same tokens ("
            + (
                f"first difference at step {merged['vs_eager_first_difference_min']}"
                if merged["vs_eager_same_tokens"] < 1
                else "no difference"
            )
            + f"), max |dlogp| {merged['vs_eager_max_logp_diff']:.1e} before it "
            "(the merge's rounding; the trainer's log-probs stay unmerged)"
        )
    lines.append(
        "max |dlogp|: over the tokens before a row's first differing token; s/image: ms/step x "
        f"{m['decode_tokens']} tokens / {m['group_size']} rows"
    )
    lines += [f"FAIL {f}" for f in m["failures"]]
    return "\n".join(lines)


def parse_args(argv):
    p = parser_for("decode-timing")
    p.add_argument(
        "--model",
        default=None,
        help="the AR to time: random:glm-image[,ar_layers=N] (random weights built on the device), random:tiny, or a "
        "pipeline directory / Hub id in the cache (its weights); default: GLM-Image's AR at full size with random "
        "weights around the tiny vocabulary (--tiny / --layers choose)",
    )
    p.add_argument("--tiny", action="store_true", help="the tiny test model in fp32 (the CPU form)")
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default: the model's, 40 full size)")
    p.add_argument("--group-size", type=int, default=16, help="rows decoded together (G samples of one prompt)")
    p.add_argument("--size", type=int, default=1024, help="image height = width in pixels")
    p.add_argument("--steps", type=int, default=64, help="timed decode steps per variant")
    p.add_argument("--lora-r", type=int, default=64, help="LoRA rank of the adapters on the AR")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    p.add_argument("--top-k", type=int, default=0, help="draw from the top k (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="draw from the top-p nucleus (1 = off)")
    p.add_argument(
        "--variants",
        default=",".join(DEFAULT_VARIANTS),
        help=f"comma-separated, of {', '.join([*VARIANTS, 'hf_generate'])}",
    )
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--hbm-gbps", type=float, default=None, help="memory bandwidth for the roofline (default: by name)")
    p.add_argument("--seed", type=int, default=0, help="seeds the weights and the sampling noise")
    p.add_argument("--out", default=None, help="write the report as JSON here")
    a = p.parse_args(argv)
    if a.model and (a.tiny or a.layers):
        p.error("--model names the AR: give --tiny / --layers without it (random:glm-image,ar_layers=N with it)")
    a.variants = [v for v in a.variants.split(",") if v]
    unknown = [v for v in a.variants if v not in VARIANTS and v != "hf_generate"]
    if unknown:
        p.error(f"--variants: unknown {unknown[0]!r}; choose from {', '.join([*VARIANTS, 'hf_generate'])}")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    m = measure(a)
    print(format_report(m))
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(m, indent=1))
    return 1 if m["failures"] else 0


if __name__ == "__main__":  # a process entry point (the bench's ranks too): no interpreter teardown
    from ..runtime import process_exit

    raise SystemExit(process_exit.exit_now(main()))
