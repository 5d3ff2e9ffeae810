"""The planned time of one training step on one GPU, from the GPU measurements of GLM-Image at its full size
scaled to a config's settings: rollout + image decode + update, each labelled, with what is left out said.
``glm-grpo estimate-memory`` prints it (glm_grpo_ds/commands/estimate_memory.py).

Every anchor was measured on one H200 (torch 2.11 cu130, sdpa, random weights at the real sizes, world size 1,
G=16 at 1024x1024; docs/memory-and-speed.md): the decode step of each rollout variant, the DiT decode per guided
image-step, the update at ZeRO-2 and ZeRO-3. What this module does with them is arithmetic, not measurement:

    rollout = generated tokens x ms per decode step of the config's variant (measured at 16 rows; a decode step is
              launch-bound, so fewer rows cost the same and more cost more)
    decode  = images x DiT steps x seconds per image-step (0.289 s guided, half without guidance: one DiT
              forward instead of two), x latent tokens / 4 096 (1024x1024; the VAE rides along, inside the figure)
    update  = the measured update x (sequences x tokens) / (16 x 1 280) (LoRA; ZeRO-2 or ZeRO-3 at world size 1)

Not counted: the rewards (a CPU OCR or a CLIP: seconds), evaluation, checkpoints, ZeRO-3's gathers across GPUs at
world size > 1, full fine-tuning's update (not measured), another GPU (an H100: the rollout 1.16x, launch-bound,
docs/memory-and-speed.md; the DiT by its bf16 peak).
"""

from __future__ import annotations

from dataclasses import dataclass

CARD = "one H200"
MEASURED_ROWS = 16  # rows per decode step of the rollout measurements
MEASURED_TOKENS = 1280  # generated tokens per image at 1024x1024 (1 024 + 256 preview)
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

    @property
    def total_s(self) -> float:
        return self.rollout_s + self.decode_s + (self.update_s or 0.0)


def rollout_variant(rollout) -> tuple[str, bool]:
    """The measured decode-step variant a ``rollout`` config section runs (the closest measured one)."""
    if not rollout.cuda_graph:
        return "eager", rollout.merge_lora
    if rollout.compile and rollout.merge_lora:
        return "compiled", True
    return "graph", rollout.merge_lora


def step_time(cfg, zero_stage: int, tokens: int) -> StepTime:
    """The planned time of one step of ``cfg`` at ``zero_stage``; ``tokens``: generated tokens per image."""
    rows = cfg.sequences_per_rank
    variant = rollout_variant(cfg.rollout)
    ms = DECODE_STEP_MS[variant] * max(1.0, rows / MEASURED_ROWS)
    rollout_s = tokens * ms / 1000
    guided = cfg.decoder.guidance_scale > 1
    per_image_step = GUIDED_IMAGE_STEP_S * (1 if guided else 0.5)
    latent = (cfg.rollout.height // 16) * (cfg.rollout.width // 16) / MEASURED_LATENT_TOKENS
    steps = cfg.decoder.num_inference_steps
    decode_s = rows * steps * per_image_step * latent
    parts = {
        "rollout": f"{tokens} tokens x {ms:.1f} ms ({variant[0]}, LoRA {'merged' if variant[1] else 'unmerged'})",
        "decode": f"{rows} images x {steps} steps x {per_image_step * latent:.3f} s"
        + (" (guided)" if guided else " (no guidance)"),
    }
    update_s = None
    if cfg.lora is not None:
        update_s = UPDATE_S[3 if zero_stage == 3 else 2] * rows * tokens / (MEASURED_ROWS * MEASURED_TOKENS)
        parts["update"] = f"ZeRO-{3 if zero_stage == 3 else 2} LoRA, scaled to {rows} x {tokens} tokens"
    else:
        parts["update"] = "full fine-tuning: not measured, not counted"
    return StepTime(rollout_s, decode_s, update_s, parts)


def describe(t: StepTime) -> str:
    """The line estimate-memory prints."""
    update = "update not counted" if t.update_s is None else f"update {t.update_s:.1f} s"
    return (
        f"planned time per step on {CARD}: ~{t.total_s:.0f} s = rollout {t.rollout_s:.1f} s + image decode "
        f"{t.decode_s:.1f} s + {update} (GPU measurements at full size scaled to this config: "
        + "; ".join(f"{k}: {v}" for k, v in t.parts.items())
        + "); not counted: rewards, evaluation, checkpoints, ZeRO-3 gathers across GPUs"
    )
