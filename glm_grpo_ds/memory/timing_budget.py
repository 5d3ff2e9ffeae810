"""The time budget of launch/gpu_timing.sh's one lease (issue #63): its four parts in order of value, each part's
seconds planned before anything runs, the plan printed as a table, and whether a part fits what is left of it.

    python -m glm_grpo_ds.memory.timing_budget plan --out OUT/plan.json [the parts' settings]   # the table
    python -m glm_grpo_ds.memory.timing_budget fits OUT/plan.json PART ELAPSED_S   # exit 0: run it; 1: skip it
    python -m glm_grpo_ds.memory.timing_budget rows OUT/decode_timing.json ROWS_JSON...   # part 4's JSON and table
    python -m glm_grpo_ds.memory.timing_budget done OUT/plan.json PART WALL_S PART_JSON   # its plan and wall beside

A part's plan is the seconds of its measured work, from the anchors glm_grpo_ds/memory/gpu_figures.py holds as
glm_grpo_ds/memory/step_time.py plans with them (the planned training step, the DiT per guided image-step, the decode
step of each sampler), plus its one-off costs: process start, model build, compiles and captures, each a named
constant below saying where its figure comes from (measured where the docs have a figure, else an assumption, said
so). ``python -m glm_grpo_ds.memory.step_time
--write-docs OUT`` rewrites those anchors from a run's JSONs, so a run plans the next one on its own card's figures;
each part's JSON keeps its planned and its measured wall seconds (``lease``) to check these constants against.
Nothing here imports torch before ``plan`` (``fits`` runs between the parts, in a fraction of a second).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from .gpu_figures import ANCHOR_VARIANTS

BUDGET_S = 540  # one lease: 9 minutes of wall clock on one H100 or H200, every build and compile included (#63)
PARTS = ("train", "train_one_step_off", "dit_timing", "decode_timing")  # in order of value
# One-off costs in seconds on a GPU machine (16 cores). Measured: docs/memory-and-speed.md; assumed: said so.
PROCESS_S = 15.0  # assumed: a python process with torch, transformers, diffusers and peft imported
TRAIN_LAUNCH_S = 45.0  # assumed: the deepspeed launcher, imports, the model built, the engine and its 8-bit AdamW
# (#52 estimated ~1 min for launch and load; random: weights are built on the GPU in ~1 s instead of a 34 GB load)
MODEL_BUILD_S = 5.0  # assumed: a random AR or decoder built on the GPU (the whole GLM-Image: ~1 s measured, H200)
DIT_COMPILE_S = 45.0  # the DiT's block compile (decoder.compile): 30-60 s estimated on an H200 (#52); 33 s on 2 CPUs
FP8_CONVERT_S = 5.0  # assumed: the DiT's 180 block linears cast to e4m3 one at a time
CAPTURE_S = 0.5  # measured: a rollout's warm-up and CUDA-graph capture, 0.4-0.5 s (H200)
LAYERS_COMPILE_S = 5.0  # measured: rollout.compile, compile_scope layers, 4-5 s the first time (H200)
STEP_COMPILE_S = 62.0  # measured: compile_scope step, 62 s cold start at 40 layers (H200)
VAE_S_PER_IMAGE = 0.15  # assumed: the published 0.11 s at 1152x768 (H100) scaled to 1024x1024's pixels, rounded up
REWARD_S_PER_IMAGE = 0.05  # assumed: colour_layout (gpu_check.yaml's reward) on the CPU
REPORT_S = 5.0  # assumed: a training part's table and JSON (python with torch imported)
WARMUP_STEPS = 4  # decode-timing's untimed steps per variant: rollout/step_graph.py's WARMUP_STEPS + 1
PROMPT_SLOTS = 128  # the prompt's KV cache slots (one bucket), as the memory plan counts them
# profile decode-timing's variants -> the measured decode step that plans them (gpu_figures.DECODE_STEP_MS); the
# captured fused sampler falls back to the unmerged graph's figure, its upper bound, until measured
# the variants whose measurement is an anchor (gpu_figures.ANCHOR_VARIANTS), and the others planned by the closest one
DECODE_VARIANTS = {
    **ANCHOR_VARIANTS,
    "compiled_step": ("compiled", True),
    "fused": ("eager", False),
    "graph_fused_compiled": ("graph_fused", False),
    "hf_generate": ("eager", True),
}
HF_GENERATE_CALLS = 8  # decode-timing's hf_generate: a warm-up and 3 timed calls, each at 1 and steps + 1 tokens


def train_seconds(overrides: list[str], config: str, ds_config: str) -> tuple[float, str]:
    """A training part's plan: launch, first-step compiles, each step's planned seconds (step_time's, its first serial
    when one step off, + the rewards and the capture), the report; and how, in words."""
    from ..config import load_config
    from . import step_time as st
    from .basis import grid_tokens

    # the model's source does not change the plan (its anchors are GLM-Image's at full size); not resolved here
    cfg = load_config(config, [o for o in overrides if not o.startswith("model.path=")])
    stage = json.loads(Path(ds_config).read_text(encoding="utf-8")).get("zero_optimization", {}).get("stage", 0)
    t = st.step_time(cfg, stage, grid_tokens(cfg.rollout.height, cfg.rollout.width))
    images = cfg.sequences_per_rank
    extra = REWARD_S_PER_IMAGE * images + (CAPTURE_S if cfg.rollout.cuda_graph else 0.0)
    serial = t.rollout_s + t.decode_s + (t.update_s or 0.0) + extra
    steady = t.total_s + extra  # one step off: the longer of rollout and decode, + the update
    compiles = (DIT_COMPILE_S if cfg.decoder.compile else 0.0) + (
        (LAYERS_COMPILE_S if cfg.rollout.compile_scope == "layers" else STEP_COMPILE_S) if cfg.rollout.compile else 0.0
    )
    steps = cfg.max_steps
    if cfg.rollout.one_step_off:
        work, how = serial + (steps - 1) * steady, f"1 serial step {serial:.1f} s + {steps - 1} x {steady:.1f} s"
    else:
        work, how = steps * serial, f"{steps} steps x {serial:.1f} s"
    total = TRAIN_LAUNCH_S + compiles + work + REPORT_S
    return total, f"launch {TRAIN_LAUNCH_S:.0f} + compiles {compiles:.0f} + {how} + report {REPORT_S:.0f}"


def dit_seconds(variants: list[str], batch: int, size: int, steps: tuple[int, int], repeats: int) -> tuple[float, str]:
    """The DiT part's plan: one process; per variant its build, compile or FP8 cast, a warm-up decode at S1 and
    ``repeats`` decodes at S1 and S2, each ``batch`` images x DiT forwards + the VAE."""
    from . import step_time as st

    scale = (size // 16) ** 2 / st.MEASURED_LATENT_TOKENS
    total, per = PROCESS_S, []
    for name in variants:
        compiled, fp8, half = "compiled" in name, "fp8" in name, name == "guidance_half"
        speedup = st.DIT_SPEEDUP.get(st.dit_options(compiled, fp8, "sdpa_cudnn" if "cudnn" in name else "sdpa"), 1.0)
        forward = st.GUIDED_IMAGE_STEP_S / 2 * scale / speedup

        def decode(n: int, half=half, forward=forward) -> float:
            guided = math.ceil(n / 2) if half else n
            return batch * ((n + guided) * forward + VAE_S_PER_IMAGE * scale)

        seconds = MODEL_BUILD_S + (DIT_COMPILE_S if compiled else 0.0) + (FP8_CONVERT_S if fp8 else 0.0)
        seconds += decode(steps[0]) + repeats * (decode(steps[0]) + decode(steps[1]))
        per.append(f"{name} {seconds:.0f}")
        total += seconds
    return total, f"start {PROCESS_S:.0f} + " + " + ".join(per)


def decode_seconds(rows: list[int], variants: list[str], size: int, steps: int) -> tuple[float, str]:
    """The decode-step part's plan: one process per rows; each builds the AR, then per variant its warm-up and
    ``steps`` timed steps at the variant's planned ms per step at those rows, + its capture or compile."""
    from . import step_time as st
    from .basis import grid_tokens

    slots = PROMPT_SLOTS + grid_tokens(size, size)
    total, per = 0.0, []
    for n in rows:
        seconds = PROCESS_S + MODEL_BUILD_S
        for name in variants:
            key = DECODE_VARIANTS.get(name, ("eager", False))  # an unknown name: the slowest loop measured
            if st.DECODE_STEP_MS.get(key) is None:
                key = ("graph", False)  # the captured fused step, not yet measured: its upper bound
            calls = HF_GENERATE_CALLS if name == "hf_generate" else 1
            seconds += calls * (WARMUP_STEPS + steps) * st.decode_step_ms(key, n, slots) / 1000
            seconds += CAPTURE_S if "graph" in name else 0.0
            seconds += {"graph_compiled": LAYERS_COMPILE_S, "graph_fused_compiled": LAYERS_COMPILE_S}.get(name, 0.0)
            seconds += STEP_COMPILE_S if name == "compiled_step" else 0.0
        per.append(f"{n} rows {seconds:.0f}")
        total += seconds
    return total, " + ".join(per)


def fits(planned_s: float, elapsed_s: float, budget_s: float) -> bool:
    """Whether a part planned at ``planned_s`` fits what is left of ``budget_s`` after ``elapsed_s``."""
    return planned_s <= budget_s - elapsed_s


def skip_line(part: str, planned_s: float, elapsed_s: float, budget_s: float) -> str:
    """The one line a skipped part prints: its name, its plan and what is left of the budget."""
    left = max(budget_s - elapsed_s, 0)
    return f"gpu_timing.sh: skipping {part}: planned {planned_s:.0f} s, {left:.0f} s of the {budget_s:.0f} s left"


def table(plan: dict) -> list[str]:
    """The plan as printed before anything runs: per part its planned seconds and how, then the total."""
    lines = [
        f"the lease: {plan['budget_s']:.0f} s of wall clock, planned on {plan['card']}'s figures "
        "(glm_grpo_ds/memory/gpu_figures.py, timing_budget.py)",
        f"{'part':<20}{'planned s':>10}  how",
    ]
    lines += [f"{p['part']:<20}{p['planned_s']:>10.0f}  {p['how']}" for p in plan["parts"]]
    total = sum(p["planned_s"] for p in plan["parts"])
    over = total > plan["budget_s"]
    lines.append(
        f"{'total':<20}{total:>10.0f}  "
        + ("over the budget: a part that does not fit what is left when it starts is skipped" if over else "fits")
    )
    return lines


def _plan(a) -> dict:
    from . import step_time as st

    planners = {
        "train": lambda: train_seconds(a.train.split(), a.config, a.deepspeed),
        "train_one_step_off": lambda: train_seconds(a.off.split(), a.config, a.deepspeed),
        "dit_timing": lambda: dit_seconds(_names(a.dit_variants), a.dit_batch, a.size, _pair(a.dit_steps), 1),
        "decode_timing": lambda: decode_seconds(_ints(a.rows), _names(a.row_variants), a.size, a.decode_steps),
    }
    parts = []
    for part in _names(a.parts):
        if part not in planners:
            raise ValueError(f"--parts: unknown {part!r}; choose from {', '.join(PARTS)}")
        seconds, how = planners[part]()
        parts.append({"part": part, "planned_s": round(seconds, 1), "how": how})
    return {"budget_s": a.budget, "card": st.CARD, "parts": parts}


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def _ints(text: str) -> list[int]:
    return [int(n) for n in _names(text)]


def _pair(text: str) -> tuple[int, int]:
    s1, s2 = _ints(text)
    return s1, s2


def rows_report(paths: list[str]) -> tuple[dict, list[str]]:
    """Part 4's JSON (``rows``: each decode-timing report by its rows) and its table: per rows and variant ms per
    step, the floor, rollout seconds per image (ms x generated tokens per image / rows: all rows decode in one step)."""
    reports = [json.loads(Path(p).read_text(encoding="utf-8")) for p in paths]
    first = reports[0]
    lines = [
        f"rows per decode step on {first['device']}: {first['layers']} layers, {first['size']}², "
        f"{first['decode_tokens']} tokens per image, {first['steps_timed']} steps timed",
        f"{'rows':>5}  {'variant':<22}{'ms/step':>9}{'floor ms':>9}{'rollout s/image':>16}",
    ]
    for m in reports:
        floor = f"{m['floor_ms_per_step']:.2f}" if m["floor_ms_per_step"] else "-"
        for name, r in m["variants"].items():
            per_image = r["ms_per_step"] / 1e3 * m["decode_tokens"] / m["group_size"]
            lines.append(f"{m['group_size']:>5}  {name:<22}{r['ms_per_step']:>9.2f}{floor:>9}{per_image:>16.3f}")
    keep = ("device", "torch", "layers", "size", "decode_tokens", "steps_timed", "lora_r")
    return {**{k: first.get(k) for k in keep}, "rows": {str(m["group_size"]): m for m in reports}}, lines


def record_lease(path: Path, plan: dict, part: str, wall_s: float) -> None:
    """Add to a part's JSON its planned and its measured wall seconds and the date (the docs' tables name it)."""
    import datetime

    m = json.loads(path.read_text(encoding="utf-8"))
    planned = next((p["planned_s"] for p in plan["parts"] if p["part"] == part), None)
    m.setdefault("date", datetime.date.today().isoformat())
    m["lease"] = {"planned_s": planned, "wall_s": wall_s, "budget_s": plan["budget_s"], "planned_on": plan["card"]}
    path.write_text(json.dumps(m, indent=1) + "\n", encoding="utf-8")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m glm_grpo_ds.memory.timing_budget", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="plan each part's seconds, print the table, write the plan")
    plan.add_argument("--out", required=True, help="the plan's JSON")
    plan.add_argument("--budget", type=float, default=BUDGET_S, help="seconds of wall clock (default: one lease)")
    plan.add_argument("--parts", default=",".join(PARTS), help="the parts to plan, comma-separated")
    plan.add_argument("--config", default="launch/configs/gpu_check.yaml", help="the training parts' config")
    plan.add_argument("--deepspeed", default="ds_configs/zero2.json", help="the training parts' DeepSpeed config")
    plan.add_argument("--train", default="", help="part 1's key=value settings, space-separated")
    plan.add_argument("--off", default="", help="part 2's key=value settings, space-separated")
    plan.add_argument("--dit-variants", default="sdpa,compiled,fp8,guidance_half", help="part 3's variants")
    plan.add_argument("--dit-batch", type=int, default=8, help="part 3's rows per DiT batch")
    plan.add_argument("--dit-steps", default="1,3", help="part 3's two step counts")
    plan.add_argument("--size", type=int, default=1024, help="image height = width of every part")
    plan.add_argument("--rows", default="16,64", help="part 4's rows per decode step")
    plan.add_argument("--row-variants", default="eager,fused,graph_fused,merged,graph", help="part 4's variants")
    plan.add_argument("--decode-steps", type=int, default=64, help="part 4's timed decode steps")
    for name, what in (("fits", "ELAPSED_S"), ("done", "WALL_S")):
        q = sub.add_parser(name)
        q.add_argument("plan", help="the plan's JSON")
        q.add_argument("part")
        q.add_argument("seconds", type=float, help=what)
        if name == "done":
            q.add_argument("json", help="the part's JSON")
    rows = sub.add_parser("rows")
    rows.add_argument("out")
    rows.add_argument("reports", nargs="+")
    return p


def main(argv: list[str] | None = None) -> int:
    """The subcommands above. Bad input: one line on stderr naming the flag and the fix, exit 2."""
    a = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if a.command == "plan":
            plan = _plan(a)
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            Path(a.out).write_text(json.dumps(plan, indent=1) + "\n", encoding="utf-8")
            print("\n".join(table(plan)), flush=True)
        elif a.command == "rows":
            m, lines = rows_report(a.reports)
            Path(a.out).write_text(json.dumps(m, indent=1) + "\n", encoding="utf-8")
            print("\n".join(lines), flush=True)
        else:
            plan = json.loads(Path(a.plan).read_text(encoding="utf-8"))
            if a.command == "done":
                record_lease(Path(a.json), plan, a.part, a.seconds)
                return 0
            planned = next((p["planned_s"] for p in plan["parts"] if p["part"] == a.part), None)
            if planned is None:
                raise ValueError(f"{a.part!r} is not in {a.plan}: plan it first (plan --parts)")
            if not fits(planned, a.seconds, plan["budget_s"]):
                print(skip_line(a.part, planned, a.seconds, plan["budget_s"]), flush=True)
                return 1
    except (OSError, KeyError, ValueError) as err:
        print(f"timing_budget: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
