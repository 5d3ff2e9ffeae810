"""The planned time of one training step on one GPU, from the GPU measurements of GLM-Image at its full size
scaled to a config's settings: rollout + image decode + update, each labelled, with what is left out said.
``glm-grpo estimate-memory`` prints it (glm_grpo_ds/commands/estimate_memory.py).

Every anchor was measured on one H200 (torch 2.11 cu130, sdpa, random weights at the real sizes, world size 1,
G=16 at 1024x1024; docs/memory-and-speed.md): the decode step of each rollout variant, the DiT decode per guided
image-step, the update at ZeRO-2 and ZeRO-3. What this module does with them is arithmetic, not measurement:

    rollout = generated tokens x ms per decode step of the config's variant at its rows (:func:`decode_step_ms`:
              the 16-row measurement, moved to other rows and cache lengths by a computed roofline model)
    decode  = images x DiT forwards x seconds per forward (half the 0.289 s of a guided image-step: a guided step
              runs two forwards, an unguided one, decoder.guidance_steps' later steps too), x latent tokens / 4 096
              (1024x1024; the VAE rides along, inside the figure)
    update  = the measured update x (sequences x tokens) / (16 x 1 280) (LoRA; ZeRO-2 or ZeRO-3 at world size 1)

Rows per decode step (``batch.prompts_per_rank`` x G, all decoded as one batch) are **computed, not measured**
(until ``launch/gpu_timing.sh`` measures 16 / 32 / 64 / 128 rows; docs/memory-and-speed.md "More rows per decode
step"). A decode step reads all of the AR's weights whatever its rows and each row's whole static KV cache, and
does each row's matmuls, so its time is taken as

    ms(rows, slots) = overhead + max(bytes / bandwidth, FLOPs / peak)
    bytes = 17.83 GB of weights + rows x slots x 40 960 B of KV cache (40 layers x K,V x 2 KV heads x 128 x bf16)
    FLOPs = rows x (2 x 8.23 G matmul parameters + slots x 655 360 of attention)
    overhead = the measured 16-row ms - the same max at 16 rows and 1 408 slots (kernel latencies and gaps, and on
               the eager loops the host's launches: taken as the same at any rows)

at the H200's 4.8 TB/s and 989 TFLOP/s (dense bf16). So 16 -> 64 rows adds only 48 rows' KV reads (~0.6 ms on
9.4) and the per-image cost falls almost 4x, until compute binds (~670 rows at 1024x1024, where a row's matmuls
take longer than its share of the reads: 17.6 us against 12.0 us); from there each row adds 17.6 us. The model
ignores that small-M GEMMs reach less than peak and that more rows make the per-row kernels (sampling over the
16 512-token vocabulary, norms) longer: the measurement replaces it.

Not counted: the rewards (a CPU OCR or a CLIP: seconds), evaluation, checkpoints, ZeRO-3's gathers across GPUs at
world size > 1, full fine-tuning's update (not measured), another GPU (an H100: the rollout 1.16x, launch-bound,
docs/memory-and-speed.md; the DiT by its bf16 peak).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config.checks import guided_steps

CARD = "one H200"
CARD_BYTES_PER_S = 4.8e12  # the H200's HBM bandwidth (peak)
CARD_FLOPS = 989e12  # the H200's dense bf16 peak (an H100 SXM's too)
MEASURED_ROWS = 16  # rows per decode step of the rollout measurements
MEASURED_TOKENS = 1280  # generated tokens per image at 1024x1024 (1 024 + 256 preview)
MEASURED_SLOTS = 1408  # static KV cache slots of those measurements: prompt + 1 280 tokens, 11 buckets of 128
# The full-size AR (transformers' GlmImageConfig, counted on the meta device): what one decode step reads and computes
AR_WEIGHT_BYTES = 17_829_576_704  # language model + lm_head in bf16 (decode-timing's roofline counts the same)
AR_MATMUL_PARAMS = 8_226_398_208  # the same less the 688 M-parameter embedding table (a lookup, not a matmul)
KV_BYTES_PER_SLOT = 2 * 40 * 2 * 128 * 2  # per row and cache slot: K and V x 40 layers x 2 KV heads x 128 x bf16
ATTENTION_FLOPS_PER_SLOT = 4 * 32 * 128 * 40  # per row and cache slot: QK^T and PV, 32 query heads x 128, 40 layers
# ms per decode step of the full-size AR at G=16, 1024x1024, LoRA r=64 (glm-grpo decode-timing, issue #51's table)
DECODE_STEP_MS = {
    ("eager", False): 75.7,  # the eager loop, LoRA unmerged
    ("eager", True): 41.2,  # the eager loop, LoRA merged
    ("graph", False): 19.3,  # rollout.cuda_graph, LoRA unmerged
    ("graph", True): 13.0,  # rollout.cuda_graph + rollout.merge_lora
    ("compiled", True): 9.4,  # + rollout.compile with compile_scope layers
}
GUIDED_IMAGE_STEP_S = 0.289  # DiT (two forwards: guidance) + VAE share, per image and step, batch 8, 1024x1024
MEASURED_LATENT_TOKENS = (1024 // 16) * (1024 // 16)
UPDATE_S = {2: 4.85, 3: 20.2}  # LoRA update at 16 sequences of 1 280 tokens, world size 1 (ZeRO-1 runs ZeRO-2's)


@dataclass
class StepTime:
    rollout_s: float
    decode_s: float
    update_s: float | None  # None: not measured for this setting (full fine-tuning)
    parts: dict[str, str]  # each part's arithmetic, for the printed line
    overlapped: bool = False  # rollout.one_step_off: the next step's rollout runs beside this step's decode

    @property
    def total_s(self) -> float:
        """Serial: the three phases' sum. One step off (after the first step): the longer of the rollout and the
        decode, assuming the two share the GPU without slowing each other (an upper bound of the gain)."""
        beside = max(self.rollout_s, self.decode_s) if self.overlapped else self.rollout_s + self.decode_s
        return beside + (self.update_s or 0.0)


def rollout_variant(rollout) -> tuple[str, bool]:
    """The measured decode-step variant a ``rollout`` config section runs (the closest measured one; rollout.fuse_lora
    runs fewer kernels than the unmerged loop it is counted as, so that figure is its upper bound)."""
    if not rollout.cuda_graph:
        return "eager", rollout.merge_lora
    if rollout.compile and rollout.merge_lora:
        return "compiled", True
    return "graph", rollout.merge_lora


def roofline_ms(rows: int, slots: int) -> float:
    """The computed floor of one decode step of the full-size AR on :data:`CARD`, ms: ``rows`` rows over a static
    KV cache of ``slots`` slots, bound by reading the weights and the cache or by the rows' FLOPs, whichever is
    longer (module docstring)."""
    read = (AR_WEIGHT_BYTES + rows * slots * KV_BYTES_PER_SLOT) / CARD_BYTES_PER_S
    compute = rows * (2 * AR_MATMUL_PARAMS + slots * ATTENTION_FLOPS_PER_SLOT) / CARD_FLOPS
    return 1e3 * max(read, compute)


def compute_bound_rows(slots: int) -> float:
    """The rows from which a decode step over ``slots`` cache slots is compute-bound on :data:`CARD` (computed)."""
    per_row_compute = (2 * AR_MATMUL_PARAMS + slots * ATTENTION_FLOPS_PER_SLOT) / CARD_FLOPS
    per_row_read = slots * KV_BYTES_PER_SLOT / CARD_BYTES_PER_S
    return AR_WEIGHT_BYTES / CARD_BYTES_PER_S / (per_row_compute - per_row_read)


def decode_step_ms(variant: tuple[str, bool], rows: int, slots: int = MEASURED_SLOTS) -> float:
    """ms per decode step of ``variant`` (a :data:`DECODE_STEP_MS` key) at ``rows`` rows and ``slots`` cache slots:
    the measured 16-row, 1 408-slot figure with its overhead above :func:`roofline_ms` kept and the roofline
    moved. Computed, not measured, wherever rows or slots differ from the measurement's."""
    measured = DECODE_STEP_MS[variant]
    return measured - roofline_ms(MEASURED_ROWS, MEASURED_SLOTS) + roofline_ms(rows, slots)


def _unmeasured_decoder(d) -> str:
    """The clause the decode's part gains where the config's DiT runs options no GPU has timed yet (the figure is the
    eager sdpa decode's; benchmarks/dit_roofline.py computes what they could save)."""
    options = [
        f"decoder.{k}" for k, on in (("compile", d.compile), ("fp8", d.fp8), ("attention", d.attention != "sdpa")) if on
    ]
    return f", {' + '.join(options)}: not yet measured, counted as the eager sdpa decode" if options else ""


def step_time(cfg, zero_stage: int, tokens: int, prompt_tokens: int = 128) -> StepTime:
    """The planned time of one step of ``cfg`` at ``zero_stage``; ``tokens``: generated tokens per image;
    ``prompt_tokens``: the longest prompt, as the memory plan's KV cache counts it (its default, 128)."""
    rows = cfg.sequences_per_rank
    variant = rollout_variant(cfg.rollout)
    ms = decode_step_ms(variant, rows, prompt_tokens + tokens)
    rollout_s = tokens * ms / 1000
    d = cfg.decoder
    steps, guided = d.num_inference_steps, guided_steps(d.num_inference_steps, d.guidance_scale, d.guidance_steps)
    per_forward = GUIDED_IMAGE_STEP_S / 2 * (cfg.rollout.height // 16) * (cfg.rollout.width // 16)
    per_forward /= MEASURED_LATENT_TOKENS
    decode_s = rows * (steps + guided) * per_forward
    parts = {
        "rollout": f"{tokens} tokens x {ms:.1f} ms ({variant[0]}, LoRA {'merged' if variant[1] else 'unmerged'})"
        + (", fused: not yet measured, at most this" if cfg.rollout.fuse_lora and not variant[1] else "")
        + ("" if rows == MEASURED_ROWS else f" at {rows} rows (computed from the {MEASURED_ROWS}-row measurement)"),
        "decode": f"{rows} images x {steps + guided} DiT forwards ({steps} steps, {guided} guided) x "
        f"{per_forward:.4f} s" + _unmeasured_decoder(d),
    }
    update_s = None
    if cfg.lora is not None:
        update_s = UPDATE_S[3 if zero_stage == 3 else 2] * rows * tokens / (MEASURED_ROWS * MEASURED_TOKENS)
        parts["update"] = f"ZeRO-{3 if zero_stage == 3 else 2} LoRA, scaled to {rows} x {tokens} tokens"
    else:
        parts["update"] = "full fine-tuning: not measured, not counted"
    return StepTime(rollout_s, decode_s, update_s, parts, cfg.rollout.one_step_off)


def describe(t: StepTime) -> str:
    """The line estimate-memory prints. Without a measured update (full fine-tuning) the total says it leaves the
    update out: ``~163 s + the update (not measured)``."""
    update = "update not counted" if t.update_s is None else f"update {t.update_s:.1f} s"
    join = "beside" if t.overlapped else "+"
    off = " (one step off: the longer of the two, not yet measured)" if t.overlapped else ""
    total = f"~{t.total_s:.0f} s" + (" + the update (not measured)" if t.update_s is None else "")
    return (
        f"planned time per step on {CARD}: {total} = rollout {t.rollout_s:.1f} s {join} image decode "
        f"{t.decode_s:.1f} s{off} + {update} (GPU measurements at full size scaled to this config: "
        + "; ".join(f"{k}: {v}" for k, v in t.parts.items())
        + "); not counted: rewards, evaluation, checkpoints, ZeRO-3 gathers across GPUs"
    )


PHASES = ("rollout", "decode", "reward", "update")  # the step's phases in metrics.jsonl's time/*, in order


def step_seconds(record: dict) -> float:
    """A measured step's seconds on its path: its phases' sum; one step off (``rollout_overlapped``), the wait for
    the next rollout (after the rewards, before the update) instead of its rollout, drawn beside the previous step."""
    seconds = {p: float(record.get(f"time/{p}", 0.0)) for p in PHASES}
    total = sum(seconds.values()) + float(record.get("time/rollout_wait", 0.0))
    return total - (seconds["rollout"] if record.get("rollout_overlapped") else 0.0)


def measured_lines(records: list[dict], images: int, planned: dict | None = None) -> list[str]:
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
        lines.append(f"plan: glm-grpo estimate-memory's planned time on {CARD} (no reward counted)")
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


def _load(path: str, read):
    """``read(Path(path))``, its errors (a file missing, not JSON, a key absent) as one ValueError naming ``path``."""
    from pathlib import Path

    try:
        return read(Path(path))
    except (OSError, KeyError, ValueError) as err:
        raise ValueError(f"{path}: {type(err).__name__}: {err}") from None


def _run(run) -> tuple[list[dict], int]:
    """A run directory's timed steps (metrics.jsonl records with ``time/rollout``) and its images per step and rank."""
    import json

    cfg = json.loads((run / "config.json").read_text(encoding="utf-8"))["train"]
    lines = (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    records = [r for r in map(json.loads, lines) if "time/rollout" in r]
    return records, cfg["grpo"]["group_size"] * cfg["batch"]["prompts_per_rank"]


def _plan(path) -> dict:
    import json

    return json.loads(path.read_text(encoding="utf-8"))["step_time"]


USAGE = (
    "usage: python -m glm_grpo_ds.memory.step_time RUN_DIR [ESTIMATE.json]\n"
    "       python -m glm_grpo_ds.memory.step_time --compare SERIAL_RUN_DIR ONE_STEP_OFF_RUN_DIR"
)


def main(argv: list[str] | None = None) -> int:
    """``python -m glm_grpo_ds.memory.step_time RUN_DIR [ESTIMATE.json]``: the run's steps measured (and planned,
    from estimate-memory's ``--json``); ``--compare SERIAL_RUN ONE_STEP_OFF_RUN``: the two runs' steady steps
    compared (:func:`compared_lines`). Bad input: one line on stderr, exit 2."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    compare = args[:1] == ["--compare"]
    if len(args) not in ((3,) if compare else (1, 2)):
        print(USAGE, file=sys.stderr)
        return 2
    try:
        if compare:
            (serial, images), (off, other) = _load(args[1], _run), _load(args[2], _run)
            if images != other:
                raise ValueError(f"{args[1]} makes {images} images a step and rank, {args[2]} {other}: compare two "
                                 "runs of the same settings")  # fmt: skip
            lines = compared_lines(serial, off, images)
        else:
            records, images = _load(args[0], _run)
            lines = measured_lines(records, images, _load(args[1], _plan) if len(args) == 2 else None)
    except ValueError as err:
        print(f"step_time: {err}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
