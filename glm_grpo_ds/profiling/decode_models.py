"""What the decode measurements run (profiling/decode_timing.py, profiling/decode_counts.py): GLM-Image's AR
with random weights, at the real size or the tiny test model's, with peft LoRA adapters as the trainer has them
(``lora_B`` random, so merging changes the weights), one prompt, and transformers' ``generate``, the sampler
diffusers' pipeline uses, as the baseline the decode loop is compared with."""

from __future__ import annotations

import torch

PROMPT = "a lighthouse on a cliff at sunset with a sign that says 'KEEP OUT'"


def build_ar(tiny: bool, layers: int | None, device: torch.device, seed: int = 0):
    """GLM-Image's AR without adapters: the real size in bf16 (the tiny test model's in fp32 for ``tiny``), random
    weights drawn after ``torch.manual_seed(seed)`` on ``device``, ``layers`` decoder layers (None: the model's)."""
    from transformers import GlmImageForConditionalGeneration

    from ..testing.tiny import build_ar_config, tiny_vocab

    vocab = tiny_vocab()
    eos = vocab["<|endoftext|>"]
    config = build_ar_config(len(vocab), eos, eos, full_size=not tiny)
    if layers:
        config.text_config.num_hidden_layers = layers
    config.vision_config.depth = 1  # the vision tower does not run for text-to-image
    torch.manual_seed(seed)
    with torch.device(device):
        ar = GlmImageForConditionalGeneration._from_config(config, dtype=torch.float32 if tiny else torch.bfloat16)
    return ar.eval()


def load_model_ar(model: str, device: torch.device):
    """``(AR, processor)`` of ``model``: a ``random:`` name (its AR built on the GPU when there is one, else the
    CPU; fp32 for ``random:tiny``, else bf16) or a pipeline directory / cached Hub id (its weights, bf16 on a GPU)."""
    from ..model.glm_image import load_processor
    from ..model.policy import load_ar
    from ..model.random_weights import spec_of
    from ..model.source import resolve_model
    from ..testing.random_model import materialize

    source = resolve_model(materialize(model, "--model"), flag="--model")
    spec = spec_of(source.path)
    tiny = spec is not None and spec.kind == "tiny"
    dtype = torch.float32 if tiny or device.type != "cuda" else torch.bfloat16
    ar = load_ar(source.path, dtype, "sdpa").to(device)
    return ar, load_processor(source.path)


def build_policy(tiny: bool, layers: int | None, r: int, device: torch.device, seed: int = 0, model: str | None = None):
    """``(peft policy, processor)``: :func:`build_ar` (or ``model``'s AR, :func:`load_model_ar`) with LoRA adapters
    of rank ``r`` on every projection, ``lora_B`` random (peft starts it at zero, which would make merging a no-op)."""
    from peft import get_peft_model

    from ..config.model_sections import LoraConfig
    from ..model.adapters import peft_lora_config
    from ..testing.tiny import build_processor

    ar, processor = load_model_ar(model, device) if model else (build_ar(tiny, layers, device, seed), None)
    policy = get_peft_model(ar, peft_lora_config(LoraConfig(r=r, alpha=2 * r)))
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.02, generator=gen)
    return policy.eval(), processor or build_processor()


def hf_generate(ar, rows: dict, sampling, n: int, seed: int) -> None:
    """transformers' ``generate`` of exactly ``n`` tokens per row from the prompt ``rows`` (what diffusers'
    pipeline samples with), seeded with the global generator as the pipeline does."""
    torch.manual_seed(seed)
    ar.generate(
        **rows,
        max_new_tokens=n,
        min_new_tokens=n,
        do_sample=True,
        temperature=sampling.temperature,
        top_k=sampling.top_k or None,
        top_p=sampling.top_p,
    )
