"""Configuration dataclasses: the only place where defaults live.

Every tunable of the rollout, the decoder and (later) the trainer is a field here; command-line
tools and the trainer build these objects and never hard-code a default of their own.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SamplingConfig:
    """How the AR policy samples visual tokens during a rollout.

    The teacher-forced log-probs apply the *same* processing (codebook mask, temperature, top-k,
    top-p), so the loss sees the log-probs of the distribution the tokens were drawn from.
    """

    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off

    def validate(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"sampling.temperature must be > 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"sampling.top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"sampling.top_p must be in (0, 1] (1 = off), got {self.top_p}")


@dataclass
class DecoderConfig:
    """The frozen DiT + VAE + glyph encoder that render prior tokens to images."""

    num_inference_steps: int = 8
    guidance_scale: float = 1.5
    batch_size: int = 8  # images per DiT forward; bounds decode memory
    offload: bool = False  # keep on CPU between rollouts, move to the accelerator only to decode
    dtype: str = "auto"  # auto = bf16 on GPU, fp32 on CPU

    def validate(self) -> None:
        if self.num_inference_steps < 1:
            raise ValueError(f"decoder.num_inference_steps must be >= 1, got {self.num_inference_steps}")
        if self.batch_size < 1:
            raise ValueError(f"decoder.batch_size must be >= 1, got {self.batch_size}")
        if self.dtype not in ("auto", "bf16", "fp32", "fp16"):
            raise ValueError(f"decoder.dtype must be auto|bf16|fp32|fp16, got {self.dtype!r}")


@dataclass
class VerifyConfig:
    """``glm-grpo verify-logprobs``: sampler vs teacher-forced log-prob parity check."""

    height: int = 64
    width: int = 96
    group_size: int = 3
    num_prompts: int = 2
    dtype: str = "fp32"
    attn: str = "sdpa"
    tolerance: float | None = None  # None = per-dtype default below
    seed: int = 0
    device: str = "auto"  # auto = cuda if available, else cpu

    # Max |sampler - teacher-forced| log-prob accepted by default. fp32 agrees to ~1e-6 on the
    # tiny model; bf16 differs because the KV-cached decode and the full forward round differently.
    DEFAULT_TOLERANCE = {"fp32": 1e-4, "bf16": 5e-2, "fp16": 1e-2}

    def resolved_tolerance(self) -> float:
        return self.tolerance if self.tolerance is not None else self.DEFAULT_TOLERANCE[self.dtype]


@dataclass
class RenderConfig:
    """``glm-grpo render``: prompts -> PNG through a GLM-Image pipeline."""

    height: int = 64
    width: int = 64
    num_inference_steps: int = 8
    guidance_scale: float = 1.5
    seed: int = 0
    out: str = "outputs/render"
