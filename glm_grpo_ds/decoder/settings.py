"""How a decode denoises: :class:`DecodeSettings` (DiT steps, classifier-free guidance and on how many steps,
:func:`guided_steps`), the pipeline's own defaults, and the step callback that ends guidance early."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple


def guided_steps(num_inference_steps: int, guidance_scale: float, guidance_steps: int | None) -> int:
    """The DiT steps of a decode that run the unconditional pass too: none at guidance <= 1, else the first
    ``guidance_steps`` (None: all). A decode runs steps + guided steps DiT forwards per image."""
    if guidance_scale <= 1:
        return 0
    return num_inference_steps if guidance_steps is None else max(0, min(guidance_steps, num_inference_steps))


class DecodeSettings(NamedTuple):
    """How a decode denoises: DiT steps and classifier-free guidance (<= 1: no unconditional pass), applied on
    the first ``guidance_steps`` steps only (None: on every step)."""

    num_inference_steps: int
    guidance_scale: float
    guidance_steps: int | None = None

    @property
    def guided_steps(self) -> int:
        """Steps that run the DiT's unconditional pass as well as its conditional one."""
        return guided_steps(*self)

    @property
    def pipeline_guidance(self) -> float:
        """The ``guidance_scale`` the pipeline is called with: 1 (no unconditional pass) when no step is guided,
        ``guidance_steps=0`` included, which :func:`guidance_stop` cannot turn off before the first step."""
        return self.guidance_scale if self.guided_steps else 1.0

    def record(self) -> dict:
        """The settings as a JSON record; ``guidance_steps`` only when set (older records stay as they were)."""
        return {k: v for k, v in self._asdict().items() if k != "guidance_steps" or v is not None}

    def describe(self) -> str:
        text = f"{self.num_inference_steps} DiT steps, guidance {self.guidance_scale:g}"
        if 0 < self.guided_steps < self.num_inference_steps:
            text += f" on the first {self.guided_steps}"
        return text


def pipeline_call_defaults() -> DecodeSettings:
    """What ``GlmImagePipeline`` denoises with when not told: the defaults of its ``__call__`` in the
    installed diffusers (50 steps, guidance 1.5 for GLM-Image), read from the signature so it follows them."""
    import inspect

    from diffusers import GlmImagePipeline

    call = inspect.signature(GlmImagePipeline.__call__).parameters
    return DecodeSettings(call["num_inference_steps"].default, call["guidance_scale"].default)


def resolve_settings(num_inference_steps: int | None, guidance_scale: float | None) -> DecodeSettings:
    """The settings given, with None taken from :func:`pipeline_call_defaults` (eval.*, decode-agreement)."""
    own = pipeline_call_defaults()
    return DecodeSettings(
        own.num_inference_steps if num_inference_steps is None else num_inference_steps,
        own.guidance_scale if guidance_scale is None else guidance_scale,
    )


def guidance_stop(settings: DecodeSettings) -> Callable | None:
    """The pipeline's step callback that ends classifier-free guidance after ``settings.guided_steps`` steps,
    None when every step is guided (or none). The pipeline reads ``_guidance_scale`` afresh each step (its
    ``do_classifier_free_guidance``); setting it from ``callback_on_step_end`` is diffusers' documented way to
    turn guidance off mid-run. Each call of the pipeline sets it again from its ``guidance_scale``."""
    guided = settings.guided_steps
    if guided in (0, settings.num_inference_steps):
        return None

    def stop(pipe, step: int, timestep, kwargs: dict) -> dict:
        if step + 1 == guided:
            pipe._guidance_scale = 1.0
        return kwargs

    return stop
