"""Frozen image decoder: prior tokens -> images with GLM-Image's DiT + VAE + glyph encoder.

Reuses diffusers' ``GlmImagePipeline`` (loaded *without* its AR, which the trainer owns) and calls
it with ``prior_token_ids`` so it skips the AR. Everything is eval mode, ``requires_grad=False`` and
runs under ``torch.no_grad()``.

Determinism. Each row gets its initial noise from its own seed (drawn on the CPU, so it does not
depend on the device); the trainer gives all G rows of a group the same seed, so images in a group
differ only through their tokens. The pipeline left-pads the glyph embeddings of a batch to a
common length and the DiT attends to that padding, so an image would depend on the *other* prompts
in its DiT batch; we therefore only ever batch rows that share a prompt. The image of a row is then
a function of (prompt, tokens, seed, size) alone - independent of the other prompts, rank count or
micro-batching - up to the rounding of the batch's size (a group of 12 decodes in batches of 8 and 4; a GEMM
may round rows of different batch sizes differently: 1e-5 measured on a CPU, more in bf16 on a GPU). What the rows
of a group share is computed once: the first step's unconditional DiT pass (first_uncond.py), the glyph encoder's
embeddings (glyph_memo.py) and the initial noise.

Two decodes. The one that feeds training rewards uses ``decoder.num_inference_steps`` /
``decoder.guidance_scale`` (cheap: few steps, guidance 1.0 skips the DiT's unconditional pass); evaluation
and ``glm-grpo render`` decode with their own settings, by default the pipeline's own
(:func:`pipeline_call_defaults`: 50 steps, guidance 1.5). ``glm-grpo decode-agreement`` measures whether
the cheap decode ranks a group's samples like the full one.

    decoder = ImageDecoder("outputs/tiny", DecoderConfig(num_inference_steps=4), device="cpu")
    images = decoder.decode(batch.prior_token_ids, batch.prompts, 64, 96, seeds)  # [N, 3, H, W] in [0, 1]
    full = decoder.decode(ids, prompts, 64, 96, seeds, DecodeSettings(50, 1.5))     # another decode
"""

from __future__ import annotations

import functools
import importlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from ..config import ConfigError, DecoderConfig
from ..model.glm_image import check_pipeline_dir, resolve_dtype
from ..model.random_weights import build_component, spec_of
from ..runtime.capture_gate import CAPTURE_SAFE
from ..runtime.loading_info import refusal, unread_weights
from .compute import apply, check_device
from .first_uncond import FirstUncond
from .glyph_memo import GlyphMemo
from .settings import DecodeSettings, guidance_stop

WEIGHTS = ("transformer", "vae", "text_encoder")  # the pipeline components with weights (besides the AR)


def load_component(root: Path, name: str, dtype: torch.dtype, device: torch.device):
    """One weighted component of a pipeline directory, of the class ``model_index.json`` names, with
    every tensor placed on ``device`` as it is read (``device_map``): on a GPU the weights never sit
    whole in host memory. Loading every rank's 7B decoder on the CPU first and moving it after took
    ~15 GB of host RAM per rank at once (~120 GB per 8-GPU node); the safetensors files themselves are
    memory-mapped, page cache shared by the ranks of a node. A ``random:`` model's component is built with random
    weights on ``device`` instead."""
    library, class_name = json.loads((root / "model_index.json").read_text(encoding="utf-8"))[name]
    spec = spec_of(root)
    if spec is not None:  # a random: model (glm_grpo_ds/model/random_weights.py): built on the device
        return build_component(root, spec, name, library, class_name, dtype, device)
    cls = getattr(importlib.import_module(library), class_name)
    try:
        model, info = cls.from_pretrained(root / name, dtype=dtype, device_map={"": device}, output_loading_info=True)
    except NotImplementedError as err:  # diffusers placing a weight it left on the meta device: one it did not read
        if "meta tensor" not in str(err):
            raise
        raise ConfigError(refusal(root / name, "weights are not in its files")) from None
    problem = unread_weights(info)
    if problem:
        raise ConfigError(refusal(root / name, problem))
    return model


def load_pipeline(root: Path, dtype: torch.dtype, device: torch.device):
    """The whole ``GlmImagePipeline`` of a pipeline directory, AR included, for the tools that call diffusers' own
    pipeline (``glm-grpo render``, ``glm-grpo profile bench``'s comparison). Every weighted component comes from the
    loaders that refuse a file missing a weight (:func:`load_component`, :func:`glm_grpo_ds.model.policy.load_ar`):
    diffusers' own ``from_pretrained`` fills such a weight with random values and says so only in its log. A
    ``random:`` model's components are built on ``device`` (the AR as a trainer's on this device)."""
    from diffusers import GlmImagePipeline

    from ..model.glm_image import AR_DIR
    from ..model.policy import load_ar

    root = check_pipeline_dir(root)
    parts = {name: load_component(root, name, dtype, device) for name in WEIGHTS}
    parts[AR_DIR] = load_ar(root, dtype, "sdpa")
    return GlmImagePipeline.from_pretrained(root, dtype=dtype, **parts)


def _own_memory(module: torch.nn.Module) -> None:
    """Copy ``module``'s tensors out of the safetensors file mapping they may still be views of.

    Weights already in the load dtype stay pages of the mapped file, read from disk at their first use:
    on a CPU the first decode, mid-step, would then add the whole decoder to the resident set (1.2 GiB
    at GLM-Image's size in bf16, measured on the real-width slice). Copied, they are resident from the
    load on, as on a GPU, where the memory plan counts them (docs/real-width.md)."""
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            tensor.data = tensor.data.clone()


class ImageDecoder:
    """The DiT, VAE and glyph encoder of a GLM-Image pipeline directory, frozen."""

    def __init__(self, model_path: str | os.PathLike, cfg: DecoderConfig, device: torch.device | str = "cpu"):
        from diffusers import GlmImagePipeline

        cfg.validate()
        self.cfg = cfg
        self.device = torch.device(device)
        self.dtype = resolve_dtype(cfg.dtype, on_gpu=self.device.type == "cuda")
        # With offload the decoder lives on the CPU and visits the accelerator only inside decode().
        self.home = torch.device("cpu") if cfg.offload else self.device
        check_device(cfg, self.device, self.dtype)
        root = check_pipeline_dir(model_path)
        pipe = GlmImagePipeline.from_pretrained(
            root,
            vision_language_encoder=None,
            processor=None,
            dtype=self.dtype,
            **{name: load_component(root, name, self.dtype, self.home) for name in WEIGHTS},
        )
        pipe.set_progress_bar_config(disable=True)
        mapped = spec_of(root) is None  # a random: model's weights were built in memory, not read from a file
        for module in (pipe.transformer, pipe.vae, pipe.text_encoder):
            module.eval().requires_grad_(False)
            if self.home.type == "cpu" and mapped:
                _own_memory(module)
        self.pipe = pipe
        apply(pipe.transformer, cfg)  # its attention kernel, FP8 linears (decoder/compute.py)
        if cfg.compile:
            # regional: every block shares one compiled graph (diffusers' _repeated_blocks), cold start in seconds
            pipe.transformer.compile_repeated_blocks()
        # each call that runs the decoder's kernels is shared work of the capture gate (see _outside_captures)
        for module, method in ((pipe.transformer, "forward"), (pipe.text_encoder, "forward"), (pipe.vae, "decode")):
            _outside_captures(module, method)
        pipe.transformer.forward = self._first_uncond = FirstUncond(pipe, pipe.transformer.forward)
        pipe._get_glyph_embeds = self._glyphs = GlyphMemo(pipe._get_glyph_embeds)
        self.training = DecodeSettings(cfg.num_inference_steps, cfg.guidance_scale, cfg.guidance_steps)

    def _latents(self, seeds: list[int], height: int, width: int) -> torch.Tensor:
        vsf = self.pipe.vae_scale_factor
        shape = (self.pipe.transformer.config.in_channels, height // vsf, width // vsf)
        # drawn once per seed: the G rows of a group share one (glm_grpo_ds/runtime/seeding.py)
        noise = {s: torch.randn(shape, generator=torch.Generator().manual_seed(s)) for s in dict.fromkeys(seeds)}
        return torch.stack([noise[s] for s in seeds]).to(self.device, self.dtype)

    def decode(
        self,
        prior_token_ids: torch.Tensor,
        prompts: list[str],
        height: int,
        width: int,
        seeds: list[int],
        settings: DecodeSettings | None = None,
        on_images: Callable[[int], None] | None = None,
    ) -> torch.Tensor:
        """``prior_token_ids`` ``[N, (H/16)*(W/16)]`` -> float32 images ``[N, 3, H, W]`` in [0, 1], denoised
        with ``settings`` (default: the training decode's, ``decoder.*``). ``on_images(n)``: after each DiT
        batch, its number of images (the step status, glm_grpo_ds/observability/step_status.py)."""
        images = torch.empty(len(prompts), 3, height, width, dtype=torch.float32, device=self.device)
        for idx, part in self.decode_batches(prior_token_ids, prompts, height, width, seeds, settings):
            images[idx] = part
            if on_images is not None:
                on_images(len(idx))
        return images

    def decode_batches(
        self,
        prior_token_ids: torch.Tensor,
        prompts: list[str],
        height: int,
        width: int,
        seeds: list[int],
        settings: DecodeSettings | None = None,
    ) -> Iterator[tuple[list[int], torch.Tensor]]:
        """:meth:`decode` one DiT batch at a time: yields ``(rows, images [len(rows), 3, H, W])`` as each is
        done (rows of one prompt, at most ``decoder.batch_size``), so a caller can score a batch while the
        next one decodes. Every row comes exactly once; the images equal :meth:`decode`'s."""
        settings = settings or self.training
        n = prior_token_ids.shape[0]
        if len(prompts) != n or len(seeds) != n:
            raise ValueError(f"decode got {n} token grids, {len(prompts)} prompts and {len(seeds)} seeds")
        expected = (height // 16) * (width // 16)
        if prior_token_ids.shape[1] != expected:
            raise ValueError(
                f"prior_token_ids has {prior_token_ids.shape[1]} ids per row; {height}x{width} needs {expected}"
            )
        if self.cfg.offload:
            self.pipe.to(self.device)
        try:
            # Only rows of one prompt share a DiT batch (see the module docstring).
            by_prompt: dict[str, list[int]] = {}
            for i, p in enumerate(prompts):
                by_prompt.setdefault(p, []).append(i)
            for prompt, rows in by_prompt.items():
                for start in range(0, len(rows), self.cfg.batch_size):
                    idx = rows[start : start + self.cfg.batch_size]
                    seed = {seeds[i] for i in idx}  # one seed: the first unconditional pass is shared
                    key = (prompt, *seed, height, width, settings) if len(seed) == 1 else None
                    with torch.no_grad(), self._first_uncond.pipeline_call(key):
                        out = self.pipe(
                            callback_on_step_end=guidance_stop(settings),
                            prompt=[prompt] * len(idx),
                            prior_token_ids=prior_token_ids[idx].to(self.device),
                            height=height,
                            width=width,
                            num_inference_steps=settings.num_inference_steps,
                            guidance_scale=settings.pipeline_guidance,
                            latents=self._latents([seeds[i] for i in idx], height, width),
                            output_type="pt",
                        ).images
                    yield idx, out.to(device=self.device, dtype=torch.float32)
        finally:
            self._first_uncond.forget()
            self._glyphs.forget()
            if self.cfg.offload:
                self.pipe.to(self.home)

    @staticmethod
    def to_pil(images: torch.Tensor) -> list:
        """``[N, 3, H, W]`` in [0, 1] -> PIL images (for logging and galleries)."""
        from PIL import Image

        arr = (images.detach().clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
        return [Image.fromarray(a) for a in arr]


def _outside_captures(module: torch.nn.Module, method: str) -> None:
    """Each call of ``module.method`` (the DiT's and the glyph encoder's forward, the VAE's decode) is shared work of
    the capture gate (runtime/capture_gate.py): it never starts while another thread captures a CUDA graph
    (rollout.one_step_off's rollout), because a device-wide synchronize fails that capture, and a compile's or
    recompile's autotuning at a kernel's first run does one, as may a library's setup at its first call on the
    device. Per call, not per decode: a capture waits for one forward, not for a whole DiT batch."""
    call = getattr(module, method)

    @functools.wraps(call)
    def gated(*args, **kwargs):
        with CAPTURE_SAFE.shared():
            return call(*args, **kwargs)

    setattr(module, method, gated)
