"""The planned time of one training step on one GPU, from the GPU measurements of GLM-Image at its full size
scaled to a config's settings: rollout + image decode + update, each labelled, with what is left out said.
``glm-grpo estimate-memory`` prints it (glm_grpo_ds/commands/estimate_memory.py).

Every anchor was measured on one GPU (first one H200, torch 2.11 cu130, sdpa, random weights at the real sizes,
world size 1, G=16 at 1024x1024; docs/memory-and-speed.md): the decode step of each rollout variant, the DiT decode
per guided image-step, the update at ZeRO-2 and ZeRO-3. They live in glm_grpo_ds/memory/gpu_figures.py, the home
of every GPU measurement, in one marked block that ``python -m glm_grpo_ds.memory.step_time --write-docs OUT``
rewrites from a run of launch/gpu_timing.sh (measured values only, each tagged with its card and date;
glm_grpo_ds/memory/timing_docs.py). What this module does with them is arithmetic, not measurement:

    rollout = generated tokens x ms per decode step of the config's variant at its rows (:func:`decode_step_ms`:
              the 16-row measurement, moved to other rows and cache lengths by a computed roofline model)
    decode  = (images x DiT forwards - (G - 1) per group when the first step is guided: its unconditional pass runs
              once per group, decoder/first_uncond.py) x seconds per forward + the glyph encoder and VAE per image,
              x latent tokens / 4 096 (1024x1024). A forward is half the seconds of a guided image-step (0.289 s: a
              guided step runs two forwards, an unguided one, decoder.guidance_steps' later steps too), over the
              measured speed-up of the config's DiT options (DIT_SPEEDUP; eager sdpa's figure where none is
              measured); the glyph encoder and the VAE ride inside the 0.289 s until a DiT timing measures them
              apart (DECODE_FIXED_S)
    update  = the measured update x (sequences x tokens) / (16 x 1 280) (LoRA; ZeRO-2 or ZeRO-3 at world size 1)

Rows per decode step (``batch.prompts_per_rank`` x G, all decoded as one batch) are **computed, not measured**
(until ``launch/gpu_timing.sh`` measures 16 and 64 rows; docs/memory-and-speed.md "More rows per decode
step"). A decode step reads all of the AR's weights whatever its rows and each row's whole static KV cache, and
does each row's matmuls, so its time is taken as

    ms(rows, slots) = overhead + max(bytes / bandwidth, FLOPs / peak)
    bytes = 17.83 GB of weights + rows x slots x 40 960 B of KV cache (40 layers x K,V x 2 KV heads x 128 x bf16:
            glm_grpo_ds/memory/sizes.py's FULL_AR_TEXT)
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

import json
from dataclasses import dataclass
from pathlib import Path

from ..decoder.settings import guided_steps
from .gpu_figures import (
    CARD,
    CARD_BYTES_PER_S,
    DECODE_FIXED_S,
    DECODE_STEP_MS,
    DIT_SPEEDUP,
    GUIDED_IMAGE_STEP_S,
    UPDATE_S,
)
from .measured import compared_lines, dit_options, train_record
from .measured import estimate_plan as _plan
from .measured import load as _load
from .measured import measured_lines as _measured_lines
from .measured import run_steps as _run
from .sizes import FULL_AR_TEXT as _AR

CARD_FLOPS = 989e12  # the H200's dense bf16 peak (an H100 SXM's too)
MEASURED_ROWS = 16  # rows per decode step of the rollout measurements
MEASURED_TOKENS = 1280  # generated tokens per image at 1024x1024 (1 024 + 256 preview)
MEASURED_SLOTS = 1408  # static KV cache slots of those measurements: prompt + 1 280 tokens, 11 buckets of 128
# The full-size AR (transformers' GlmImageConfig, counted on the meta device): what one decode step reads and computes
AR_WEIGHT_BYTES = 17_829_576_704  # language model + lm_head in bf16 (decode-timing's roofline counts the same)
AR_MATMUL_PARAMS = 8_226_398_208  # the same less the 688 M-parameter embedding table (a lookup, not a matmul)
# per row and cache slot: K and V x layers x KV heads x head dim x bf16 (40 960 B); QK^T and PV over the query heads
KV_BYTES_PER_SLOT = 2 * _AR["layers"] * _AR["kv_heads"] * _AR["head_dim"] * 2
ATTENTION_FLOPS_PER_SLOT = 4 * _AR["heads"] * _AR["head_dim"] * _AR["layers"]
MEASURED_LATENT_TOKENS = (1024 // 16) * (1024 // 16)


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
    runs fewer kernels than the unmerged loop it is counted as, so that figure is its upper bound until the captured
    fused step is measured: then its own)."""
    if not rollout.cuda_graph:
        return "eager", rollout.merge_lora
    if rollout.fuse_lora and not rollout.merge_lora and DECODE_STEP_MS.get(("graph_fused", False)) is not None:
        return "graph_fused", False
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


def _decoder_speedup(d) -> tuple[float, str]:
    """The config's DiT options' measured speed-up over eager sdpa (1.0 when it runs none, or none measured) and the
    clause the decode's part gains (benchmarks/dit_roofline.py computes what unmeasured ones could save)."""
    key = dit_options(d.compile, d.fp8, d.attention)
    if not key:
        return 1.0, ""
    names = " + ".join(f"decoder.{o}" if o in ("compile", "fp8") else f"decoder.attention={o}" for o in key.split("+"))
    if key in DIT_SPEEDUP:
        return DIT_SPEEDUP[key], f", {names}: {DIT_SPEEDUP[key]:.2f}x the eager sdpa decode (measured)"
    return 1.0, f", {names}: not yet measured, counted as the eager sdpa decode"


def step_time(cfg, zero_stage: int, tokens: int, prompt_tokens: int = 128) -> StepTime:
    """The planned time of one step of ``cfg`` at ``zero_stage``; ``tokens``: generated tokens per image;
    ``prompt_tokens``: the longest prompt, as the memory plan's KV cache counts it (its default, 128)."""
    rows = cfg.sequences_per_rank
    variant = rollout_variant(cfg.rollout)
    ms = decode_step_ms(variant, rows, prompt_tokens + tokens)
    rollout_s = tokens * ms / 1000
    d = cfg.decoder
    steps, guided = d.num_inference_steps, guided_steps(d.num_inference_steps, d.guidance_scale, d.guidance_steps)
    scale = (cfg.rollout.height // 16) * (cfg.rollout.width // 16) / MEASURED_LATENT_TOKENS
    speedup, options = _decoder_speedup(d)
    per_forward, fixed = GUIDED_IMAGE_STEP_S / 2 * scale / speedup, DECODE_FIXED_S * scale
    # the first step's unconditional pass runs on one row per group (decoder/first_uncond.py): G - 1 forwards fewer
    shared = cfg.batch.prompts_per_rank * (cfg.grpo.group_size - 1) if guided else 0
    forwards = rows * (steps + guided) - shared
    decode_s = forwards * per_forward + rows * fixed
    unmeasured_fused = cfg.rollout.fuse_lora and not variant[1] and variant[0] != "graph_fused"
    parts = {
        "rollout": f"{tokens} tokens x {ms:.1f} ms ({variant[0]}, LoRA {'merged' if variant[1] else 'unmerged'})"
        + (", fused: not yet measured, at most this" if unmeasured_fused else "")
        + ("" if rows == MEASURED_ROWS else f" at {rows} rows (computed from the {MEASURED_ROWS}-row measurement)"),
        "decode": f"{rows} images x {steps + guided} DiT forwards ({steps} steps, {guided} guided)"
        + (f" - {shared} (the first unconditional pass once per group)" if shared else "")
        + f" x {per_forward:.4f} s"
        + (f" + {fixed:.3f} s an image (glyph encoder, VAE)" if fixed else "")
        + options,
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
    update out: ``~161 s + the update (not measured)``."""
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


def measured_lines(records: list[dict], images: int, planned: dict | None = None) -> list[str]:
    """A run's measured steps as a table beside the plan on :data:`CARD` (glm_grpo_ds/memory/measured.py)."""
    return _measured_lines(records, images, planned, CARD)


USAGE = (
    "usage: python -m glm_grpo_ds.memory.step_time RUN_DIR [ESTIMATE.json] [--json OUT [--serial SERIAL_RUN]]\n"
    "       python -m glm_grpo_ds.memory.step_time --compare SERIAL_RUN_DIR ONE_STEP_OFF_RUN_DIR\n"
    "       python -m glm_grpo_ds.memory.step_time --write-docs GPU_TIMING_OUT [--root DIR]"
)


def _options(args: list[str], names: tuple[str, ...]) -> tuple[list[str], dict[str, str]]:
    """``args`` less ``--name VALUE`` pairs of ``names``, and those values. ValueError on a name without a value."""
    rest, values = [], {}
    it = iter(args)
    for arg in it:
        if arg in names:
            value = next(it, None)
            if value is None or value.startswith("--"):
                raise ValueError(f"{arg} needs a value: {USAGE.splitlines()[0].removeprefix('usage: ')}")
            values[arg] = value
        else:
            rest.append(arg)
    return rest, values


def main(argv: list[str] | None = None) -> int:
    """``python -m glm_grpo_ds.memory.step_time RUN_DIR [ESTIMATE.json]``: the run's steps measured (and planned,
    from estimate-memory's ``--json``), with ``--json OUT`` written as launch/gpu_timing.sh's JSON of a training part
    (``--serial RUN``: compared with that serial run's steady steps); ``--compare SERIAL_RUN ONE_STEP_OFF_RUN``: the
    two runs' steady steps compared (:func:`compared_lines`); ``--write-docs OUT [--root DIR]``: the docs, the README
    and this module's anchors from launch/gpu_timing.sh's JSONs (glm_grpo_ds/memory/timing_docs.py). Bad input: one
    line on stderr, exit 2."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--write-docs"]:
        from .timing_docs import main as write_docs

        return write_docs(args[1:])
    compare = args[:1] == ["--compare"]
    try:
        args, opts = _options(args, () if compare else ("--json", "--serial"))
    except ValueError as err:
        print(f"step_time: {err}", file=sys.stderr)
        return 2
    if len(args) not in ((3,) if compare else (1, 2)) or ("--serial" in opts and "--json" not in opts):
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
            planned = _load(args[1], _plan) if len(args) == 2 else None
            lines = measured_lines(records, images, planned)
            if "--json" in opts:
                compared = None
                if "--serial" in opts:
                    try:  # a run too short to compare still gets its JSON
                        compared = compared_lines(_load(opts["--serial"], _run)[0], records, images)
                        lines += compared
                    except ValueError as err:
                        lines.append(f"not compared with {opts['--serial']}: {err}")
                write_json(opts["--json"], train_record(Path(args[0]), planned, compared))
    except ValueError as err:
        print(f"step_time: {err}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


def write_json(path: str, m: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(m, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    raise SystemExit(main())
