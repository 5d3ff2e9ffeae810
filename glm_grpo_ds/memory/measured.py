"""What a GPU run measured, as the planned time's counterpart reads it (glm_grpo_ds/memory/step_time.py): a training
run's timed steps (metrics.jsonl's ``time/*``) per phase, per image and per GPU-second, a serial and a one-step-off run
compared, a training part's JSON for launch/gpu_timing.sh, and the names the planner's DiT anchors are keyed by (the
anchors themselves: glm_grpo_ds/memory/gpu_figures.py).
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

from .sizes import BUILTIN_DIT, FULL_AR_TEXT

PHASES = ("rollout", "decode", "reward", "update")  # the step's phases in metrics.jsonl's time/*, in order


def step_seconds(record: dict) -> float:
    """A measured step's seconds on its path: its phases' sum; one step off (``rollout_overlapped``), the wait for
    the next rollout (after the rewards, before the update) instead of its rollout, drawn beside the previous step."""
    seconds = {p: float(record.get(f"time/{p}", 0.0)) for p in PHASES}
    total = sum(seconds.values()) + float(record.get("time/rollout_wait", 0.0))
    return total - (seconds["rollout"] if record.get("rollout_overlapped") else 0.0)


def measured_lines(records: list[dict], images: int, planned: dict | None = None, card: str = "") -> list[str]:
    """A run's measured steps as a table: per step the seconds of each phase (``time/<phase>`` of metrics.jsonl),
    the step (their sum; one step off, the wait for the next rollout instead of an overlapped rollout), per image,
    and images per GPU-second (``images`` per rank and step over the step's
    seconds: one GPU per rank); ``planned``: estimate-memory's ``step_time`` (``--json``), printed beside."""
    head = (
        f"{'step':>5}" + "".join(f"{p + ' s':>11}" for p in PHASES) + f"{'step s':>9}{'s/image':>9}{'images/GPU-s':>14}"
    )

    def row(label, seconds: list[float | None], total: float) -> str:
        phases = "".join(f"{'-':>11}" if s is None else f"{s:>11.2f}" for s in seconds)
        return f"{label:>5}{phases}{total:>9.2f}{total / images:>9.3f}{images / total:>14.3f}"

    lines = [head]
    for r in records:
        lines.append(row(r["step"], [float(r.get(f"time/{p}", 0.0)) for p in PHASES], step_seconds(r)))
    if planned:
        lines.append(row("plan", [planned.get(f"{p}_s") for p in PHASES], planned["total_s"]))
        lines.append(f"plan: glm-grpo estimate-memory's planned time on {card} (no reward counted)")
    if any(r.get("rollout_overlapped") for r in records):
        lines.append("rollout.one_step_off: rollouts ran beside the previous step; step s = the rest + the wait")
    lines.append(f"{images} images per step and GPU")
    return lines


def compared_lines(serial: list[dict], off: list[dict], images: int) -> list[str]:
    """A serial run and a ``rollout.one_step_off`` run of the same settings, compared on their steady steps: the
    serial run's after its first (which compiles and captures) and the other's overlapped ones (its first is serial).
    Per run the mean step and phases, images per GPU-second, and how much the rollout and the decode slowed each
    other beside each other (their mean seconds against the serial run's). ValueError when a run has no such step."""
    if any(r.get("rollout_overlapped") for r in serial):
        raise ValueError("the first run drew rollouts one step off: give the serial run first, then the other")
    steady = {"serial": serial[1:], "one step off": [r for r in off if r.get("rollout_overlapped")]}
    for name, records in steady.items():
        if not records:
            raise ValueError(f"the {name} run has no step to compare: give each run 2 steps or more (TRAIN_STEPS=2)")

    def mean(name: str, key: str) -> float:
        return sum(float(r.get(key, 0.0)) for r in steady[name]) / len(steady[name])

    lines = ["serial vs one step off, steady steps (serial: after the first; one step off: the overlapped ones):"]
    step = {}
    for name, parts in (("serial", PHASES), ("one step off", ("decode", "reward", "rollout_wait", "update"))):
        step[name] = sum(step_seconds(r) for r in steady[name]) / len(steady[name])
        split = " + ".join(f"{p.replace('rollout_wait', 'wait')} {mean(name, f'time/{p}'):.2f}" for p in parts)
        lines.append(
            f"  {name + ':':<14}step {step[name]:7.2f} s = {split}; {images / step[name]:.3f} images/GPU-s "
            f"(mean of {len(steady[name])})"
        )
    slowed = {p: mean("one step off", f"time/{p}") / mean("serial", f"time/{p}") for p in ("rollout", "decode")}
    lines.append(
        f"  one step off makes {step['serial'] / step['one step off']:.2f}x the serial run's images per GPU-second; "
        f"beside each other the rollout took {slowed['rollout']:.2f}x its serial seconds, the decode "
        f"{slowed['decode']:.2f}x"
    )
    return lines


def load(path: str, read):
    """``read(Path(path))``, its errors (a file missing, not JSON, a key absent) as one ValueError naming ``path``."""
    try:
        return read(Path(path))
    except (OSError, KeyError, ValueError) as err:
        raise ValueError(f"{path}: {type(err).__name__}: {err}") from None


def run_steps(run) -> tuple[list[dict], int]:
    """A run directory's timed steps (metrics.jsonl records with ``time/rollout``) and its images per step and rank."""
    cfg = json.loads((run / "config.json").read_text(encoding="utf-8"))["train"]
    lines = (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    records = [r for r in map(json.loads, lines) if "time/rollout" in r]
    return records, cfg["grpo"]["group_size"] * cfg["batch"]["prompts_per_rank"]


def estimate_plan(path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))["step_time"]


def dit_options(compile: bool, fp8: bool, attention: str) -> str:
    """The key of a DiT option set in step_time's ``DIT_SPEEDUP``: its options sorted and joined by ``+`` (``compile``,
    ``fp8``, the attention kernel unless ``sdpa``); ``""`` for the eager sdpa decode itself."""
    options = [name for name, on in (("compile", compile), ("fp8", fp8), (attention, attention != "sdpa")) if on]
    return "+".join(sorted(options))


# GLM-Image at its full size (40 and 30 layers), the size the planner's anchors are measured at
FULL_AR_LAYERS, FULL_DIT_LAYERS = FULL_AR_TEXT["layers"], BUILTIN_DIT["num_layers"]


def full_size(record: dict) -> bool:
    """Whether a run's ``config.json`` ``record`` trained GLM-Image at its full size: its pipeline's AR 40 and DiT 30
    layers or, without config files to read there, a ``random:glm-image`` name at those layers."""
    from ..model.glm_image import read_ar_config
    from ..model.random_weights import is_random, parse

    model = str(record["train"]["model"]["path"])
    path = (record.get("model_source") or {}).get("path") or model
    try:
        ar = read_ar_config(path)["text_config"]["num_hidden_layers"]
        dit = json.loads((Path(path) / "transformer" / "config.json").read_text(encoding="utf-8"))["num_layers"]
        return (ar, dit) == (FULL_AR_LAYERS, FULL_DIT_LAYERS)
    except (OSError, KeyError, ValueError):
        if not is_random(model):
            return False
        spec = parse(model)
        return (spec.kind, spec.ar_layers, spec.dit_layers) == ("glm-image", FULL_AR_LAYERS, FULL_DIT_LAYERS)


def steady_steps(records: list[dict]) -> list[dict]:
    """The steps that show the steady state: one step off, the overlapped ones; serial, those after the first."""
    return [r for r in records if r.get("rollout_overlapped")] or records[1:] or records


def device_and_torch() -> tuple[str, str]:
    """This machine's first GPU by name (``cpu`` without one) and torch's version."""
    import torch

    return (torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"), torch.__version__


def train_record(run: Path, planned: dict | None, compared: list[str] | None) -> dict:
    """launch/gpu_timing.sh's JSON of a training part: the card, torch and the date, the settings the anchors are
    checked against, every timed step (``time/*``, ``memory/*``), the steady steps' means, the plan and the comparison
    with the serial run (``compared_lines``) when given."""
    record = load(str(run / "config.json"), lambda p: json.loads(p.read_text(encoding="utf-8")))
    records, images = load(str(run), run_steps)
    t, (device, torch_version), steady = record["train"], device_and_torch(), steady_steps(records)
    step_s = sum(step_seconds(r) for r in steady) / len(steady)
    phases = (*PHASES, "rollout_wait")
    keep = ("step", "rollout_overlapped")
    return {
        "part": run.name,
        "device": device,
        "torch": torch_version,
        "date": datetime.date.today().isoformat(),
        "model": t["model"]["path"],
        "full_size": full_size(record),
        "zero_stage": (record.get("deepspeed") or {}).get("zero_optimization", {}).get("stage"),
        "images": images,
        "size": [t["rollout"]["height"], t["rollout"]["width"]],
        "lora": t.get("lora") is not None,
        "rollout": {
            k: t["rollout"].get(k) for k in ("fuse_lora", "merge_lora", "cuda_graph", "compile", "one_step_off")
        },
        "decoder": {
            k: t["decoder"].get(k)
            for k in ("num_inference_steps", "guidance_scale", "guidance_steps", "compile", "fp8", "attention")
        },
        "steps": [{k: v for k, v in r.items() if k in keep or k.startswith(("time/", "memory/"))} for r in records],
        "steady": {
            "steps": len(steady),
            "step_s": step_s,
            "images_per_gpu_s": images / step_s,
            **{f"{p}_s": sum(float(r.get(f"time/{p}", 0.0)) for r in steady) / len(steady) for p in phases},
        },
        "planned": planned,
        "compared": compared,
    }
