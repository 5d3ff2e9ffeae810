"""How the frozen DiT computes beyond diffusers' defaults: its attention kernel (``decoder.attention``) and FP8
linears (``decoder.fp8``). :func:`device_problems` says, before any model loads, what this device or install
cannot run (one line each), :func:`check_device` raises them; :func:`apply` sets both on a loaded DiT.

    problems = device_problems(cfg.decoder, torch.device("cuda"), torch.bfloat16)   # [] where it can
    check_device(cfg.decoder, device, dtype)                                        # ConfigError, a line each
    apply(pipe.transformer, cfg.decoder)
"""

from __future__ import annotations

import importlib.util

import torch

from ..config import ConfigError, DecoderConfig
from .fp8 import fp8_supported, to_fp8

# decoder.attention -> diffusers' attention backend (diffusers.models.attention_dispatch.AttentionBackendName)
ATTENTION_BACKENDS = {
    "sdpa": "native",  # torch's scaled_dot_product_attention; it picks the kernel itself
    "sdpa_cudnn": "_native_cudnn",
    "sdpa_flash": "_native_flash",
    "sdpa_efficient": "_native_efficient",
    "sdpa_math": "_native_math",
    "flash_attn": "flash",
    "flash_attn_3": "_flash_3",
}
GPU_ONLY = {"sdpa_cudnn", "sdpa_flash", "sdpa_efficient", "flash_attn", "flash_attn_3"}
PACKAGES = {"flash_attn": ("flash_attn", "flash-attn"), "flash_attn_3": ("flash_attn_interface", "flash-attn 3")}
# the kernels that take bf16 / fp16 only (diffusers checks this only with DIFFUSERS_ATTN_CHECKS set: mid-step)
HALF_ONLY = {"sdpa_cudnn", "sdpa_flash", "flash_attn", "flash_attn_3"}
HALF = (torch.bfloat16, torch.float16)
# the GPU generation each kernel needs (compute capability): flash kernels Ampere, flash-attn 3 Hopper
CAPABILITY = {"sdpa_flash": (8, 0), "flash_attn": (8, 0), "flash_attn_3": (9, 0)}
DTYPE_WORDS = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def device_problems(cfg: DecoderConfig, device: torch.device, dtype: torch.dtype) -> list[str]:
    """What ``device`` (with the decoder's ``dtype``) cannot run of ``cfg.attention`` and ``cfg.fp8``, one line
    each naming the key and the fix; [] when it can run all."""
    problems = []
    kernel, words = cfg.attention, DTYPE_WORDS.get(dtype, str(dtype))
    if kernel in GPU_ONLY and device.type != "cuda":
        problems.append(f"decoder.attention={kernel} needs a CUDA GPU (this run decodes on {device.type}); use sdpa")
    elif kernel in PACKAGES and importlib.util.find_spec(PACKAGES[kernel][0]) is None:
        package = PACKAGES[kernel][1]
        problems.append(f"decoder.attention={kernel} but {package} is not installed; install it or use sdpa")
    elif kernel in HALF_ONLY and dtype not in HALF:
        problems.append(f"decoder.attention={kernel} needs decoder.dtype bf16 or fp16 (got {words}); use sdpa")
    elif kernel in CAPABILITY and torch.cuda.get_device_capability(device) < CAPABILITY[kernel]:
        need, name = ".".join(map(str, CAPABILITY[kernel])), torch.cuda.get_device_name(device)
        problems.append(f"decoder.attention={kernel} needs a GPU of compute capability {need}+ ({name}); use sdpa")
    if cfg.fp8:
        why = fp8_supported(device)
        if why:
            problems.append(f"decoder.fp8=true: {why}; set decoder.fp8=false")
        elif device.type == "cuda" and dtype != torch.bfloat16:
            # torch's per-row scaled matmul on CUDA writes bf16 only
            problems.append(f"decoder.fp8=true on a GPU needs decoder.dtype bf16 (got {words}); set decoder.dtype=bf16")
    return problems


def check_device(cfg: DecoderConfig, device: torch.device, dtype: torch.dtype) -> None:
    """:func:`device_problems` as a :class:`ConfigError` (an input error: exit 2 before any model loads)."""
    problems = device_problems(cfg, device, dtype)
    if problems:
        raise ConfigError("\n".join(problems))


def apply(transformer: torch.nn.Module, cfg: DecoderConfig) -> None:
    """Set ``cfg.attention`` and, with ``cfg.fp8``, convert the DiT's block linears to FP8 (in place, once)."""
    if cfg.attention != "sdpa":
        transformer.set_attention_backend(ATTENTION_BACKENDS[cfg.attention])
    if cfg.fp8:
        to_fp8(transformer)
        if next(transformer.parameters()).is_cuda:
            # the full-precision weights' freed blocks, ~5.6 GiB at GLM-Image's size, back to the GPU: the fp8 ones
            # were allocated while each still lived, so the cache would otherwise keep them fragmented
            torch.cuda.empty_cache()
