"""Real-width slice report (issue #26): FLOPs per phase extrapolated to GLM-Image's 40 AR / 30 DiT layers,
the bf16 sampler-vs-trainer log-prob mismatch, and our rollout's tokens/s vs ``generate_prior_tokens``.

    glm-grpo tiny-model outputs/slices/n1m1 --real-width --ar-layers 1 --dit-layers 1
    glm-grpo tiny-model outputs/slices/n2m2 --real-width --ar-layers 2 --dit-layers 2
    HF_HUB_OFFLINE=1 python benchmarks/slice_report.py --model outputs/slices/n1m1 --slope-model outputs/slices/n2m2 \\
        --size 1024 --out outputs/slice_report.json

Runs on the CPU, in bf16, through the project's own code paths, so the shapes are the trainer's:

* FLOPs (``torch.utils.flop_counter.FlopCounterMode``: matmuls, convolutions and attention; elementwise
  ops are not counted). Every figure is the difference of the counter's running total across the forward
  calls of one module (:class:`CallFlops`), so each phase is attributed without relying on module names.

  - AR: one rollout (glm_grpo_ds/rollout/generate.py) of one row at ``--size``: the prefill per prompt token and the
    KV-cached decode step at batch 1 (language model + ``lm_head``; first step and mean over the rollout).
  - update, per sequence, of that rollout's sequence (glm_grpo_ds/logprobs.py ``completion_logprobs``):
    the policy with the config's LoRA and gradient checkpointing, in training mode: forward, then backward
    (which with checkpointing contains the recompute forward: both counted, also reported apart), and the
    adapter-off reference forward of ``beta > 0``.
  - DiT per denoising step and VAE per image: one ``ImageDecoder.decode`` (glm_grpo_ds/decoder/image_decoder.py) at
    ``--size`` with one step and the config's guidance (CFG > 1 runs two DiT forwards per step).

  Per layer: the forward calls of layer 0 (module), and, with ``--slope-model`` (the same slice with more
  layers), the difference of the two slices divided by the difference of layer counts. The extrapolated
  full model = slice + (40 - N) x per layer (30 - M for the DiT), with the slope when given. The doc
  arithmetic is docs/memory-and-speed.md's: 2 x parameters x tokens (the AR's parameters counted as the
  doc does: language model with its embedding, + lm_head) + attention 4 x layers x tokens x context x width.
* bf16 log-probs: a rollout of G rows (KV-cached, bf16, as the trainer samples) and the teacher-forced
  recomputation, as ``glm-grpo verify-logprobs`` does (its ``sampler_and_trainer_logprobs``): mean / max
  |dlogp| and the k3 estimate of KL(sampler || trainer) over the generated positions.
* rollout speed: our rollout vs ``GlmImagePipeline.generate_prior_tokens`` on the same weights, G rows, same
  size (``glm-grpo profile bench``'s ``rollout_vs_pipeline``).

Prints a table and writes ``--out`` (JSON). ``--parts`` picks what runs (the slope model always runs
only ``ar update decoder``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from a checkout

from glm_grpo_ds.commands.verify_logprobs import VerifyConfig, sampler_and_trainer_logprobs  # noqa: E402
from glm_grpo_ds.profiling.bench_workers import BENCH_PROMPT, rollout_vs_pipeline  # noqa: E402

PARTS = ("ar", "update", "decoder", "logprobs", "speed")
FLOP_PARTS = ("ar", "update", "decoder")
FULL_AR_LAYERS = 40  # GLM-Image's language model
FULL_DIT_LAYERS = 30  # GLM-Image's DiT


@dataclass
class ReportConfig:
    """``benchmarks/slice_report.py`` settings (see the module docstring)."""

    size: int = 1024  # image height = width
    group_size: int = 2  # rows of the log-prob and speed measurements
    repeats: int = 1  # rollout-vs-pipeline repeats (median)
    config: str = str(ROOT / "launch" / "configs" / "glm_image_lora.yaml")  # LoRA, checkpointing, guidance
    out: str = "outputs/slice_report.json"
    seed: int = 0


# ----------------------------------------------------------------------------- counting
class CallFlops:
    """FLOPs of each forward call of ``module`` under ``counter``: the counter's running total after the
    call minus before it (nested modules, recomputed forwards and any call order work alike). Set
    ``.counter`` to follow the calls into another counter (the backward's, for checkpoint recomputes)."""

    def __init__(self, counter: FlopCounterMode, module: torch.nn.Module):
        self.counter, self.calls, self._start = counter, [], []
        self._handles = [
            module.register_forward_pre_hook(lambda *_: self._start.append(self.counter.get_total_flops())),
            module.register_forward_hook(
                lambda *_: self.calls.append(self.counter.get_total_flops() - self._start.pop())
            ),
        ]

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def flop_counter() -> FlopCounterMode:
    return FlopCounterMode(display=False)


def params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def linear_params(module: torch.nn.Module) -> int:
    """Weights of the ``nn.Linear`` layers inside ``module`` (biases are additions, not matmul FLOPs)."""
    return sum(m.weight.numel() for m in module.modules() if isinstance(m, torch.nn.Linear))


# ----------------------------------------------------------------------------- models
def load_models(model: str, cfg, parts: tuple[str, ...]):
    """(ar, processor, decoder or None): the AR in bf16 with sdpa, the frozen decoder in bf16."""
    from glm_grpo_ds.config import DecoderConfig
    from glm_grpo_ds.decoder import ImageDecoder
    from glm_grpo_ds.model.glm_image import load_processor
    from glm_grpo_ds.model.policy import load_ar

    ar = load_ar(model, dtype="bf16", attn_implementation="sdpa")
    decoder = None
    if {"decoder", "speed"} & set(parts):
        dcfg = DecoderConfig(
            num_inference_steps=1, guidance_scale=cfg.decoder.guidance_scale, batch_size=1, dtype="bf16"
        )
        decoder = ImageDecoder(model, dcfg, device="cpu")
    return ar, load_processor(model), decoder


def text_layers(ar):
    from glm_grpo_ds.model.glm_image import ar_parts

    return ar_parts(ar)[0].language_model.layers


# ----------------------------------------------------------------------------- measurements
def ar_flops(ar, processor, size: int, sampling, seed: int = 0) -> tuple[dict, object]:
    """FLOPs of one rollout row at ``size``: prefill per prompt token, decode step at batch 1. Also
    returns the rollout's batch (the update and the decoder measure on it)."""
    from glm_grpo_ds.model.glm_image import ar_parts
    from glm_grpo_ds.rollout import rollout

    body, lm_head, _ = ar_parts(ar)
    gen = torch.Generator().manual_seed(seed)
    with flop_counter() as counter:
        # the rollout's decode loop calls the language model itself (glm_grpo_ds/rollout/decode_loop.py)
        hooks = {"body": CallFlops(counter, body.language_model), "head": CallFlops(counter, lm_head)}
        hooks["layer0"] = CallFlops(counter, text_layers(ar)[0])
        batch = rollout(ar, processor, [BENCH_PROMPT], 1, size, size, sampling, gen)
    for h in hooks.values():
        h.remove()
    plen, n = batch.prompt_len, batch.completion_ids.shape[1]
    body_calls, head_calls, layer_calls = (hooks[k].calls for k in ("body", "head", "layer0"))
    assert len(body_calls) == n and len(head_calls) == n, "one prefill + n-1 decode steps, n lm_head calls"
    head = head_calls[0]
    return (
        {
            "prompt_tokens": plen,
            "generated_tokens": n,
            "total": counter.get_total_flops(),
            "prefill_per_token": (body_calls[0] + head) / plen,  # lm_head runs on the last prompt position only
            "prefill_per_token_layer0": layer_calls[0] / plen,
            "decode_step_first": body_calls[1] + head,
            "decode_step_first_layer0": layer_calls[1],
            "decode_step_mean": sum(body_calls[1:]) / (n - 1) + head,
            "decode_step_mean_layer0": sum(layer_calls[1:]) / (n - 1),
            "lm_head_per_token": head,
        },
        batch,
    )


def update_flops(ar, batch, cfg) -> dict:
    """FLOPs of the teacher-forced update of ``batch`` (one sequence) as the trainer runs it: LoRA policy
    forward (training mode, checkpointing on), backward (recompute + gradients), reference forward."""
    from glm_grpo_ds.logprobs import completion_logprobs
    from glm_grpo_ds.model.policy import make_trainable

    policy = make_trainable(ar, cfg.lora, cfg.model.gradient_checkpointing, cfg.seed)
    layer0 = text_layers(policy)[0]
    sampling, chunk = cfg.grpo.sampling, cfg.grpo.logprob_chunk_size
    out = {"sequence_tokens": batch.input_ids.shape[1], "gradient_checkpointing": cfg.model.gradient_checkpointing}
    policy.eval()
    with flop_counter() as counter, torch.no_grad(), policy.disable_adapter():
        calls = CallFlops(counter, layer0)
        completion_logprobs(policy, batch, sampling, chunk)
    calls.remove()
    out["reference_forward"], out["reference_forward_layer0"] = counter.get_total_flops(), calls.calls[0]
    policy.train()
    # transformers checkpoints a layer's inner forward, so its recompute fires no hooks of the layer itself,
    # only of its attention and MLP (which hold every counted FLOP of the layer: norms and adds are not)
    with flop_counter() as counter:
        calls = CallFlops(counter, layer0)
        inner = [CallFlops(counter, layer0.self_attn), CallFlops(counter, layer0.mlp)]
        logp = completion_logprobs(policy, batch, sampling, chunk)
    calls.remove()
    out["policy_forward"], out["policy_forward_layer0"] = counter.get_total_flops(), calls.calls[0]
    for c in inner:
        c.calls.clear()
    with flop_counter() as counter:
        for c in inner:
            c.counter = counter
        logp.sum().backward()  # the GRPO loss on top is elementwise: no counted FLOPs
    for c in inner:
        c.remove()
    out["backward_with_recompute"] = counter.get_total_flops()
    # the recomputed forward of the checkpointed layer 0, inside backward (0 without checkpointing)
    out["recompute_layer0"] = sum(sum(c.calls) for c in inner)
    out["total"] = out["reference_forward"] + out["policy_forward"] + out["backward_with_recompute"]
    policy.eval()
    return out


def decoder_flops(decoder, prior_token_ids: torch.Tensor, prompt: str, size: int) -> dict:
    """FLOPs of one image through ``ImageDecoder.decode`` with one denoising step: DiT forwards of that
    step (2 with CFG), the glyph encoder, the VAE decode."""
    pipe = decoder.pipe
    with flop_counter() as counter:
        hooks = {
            "dit": CallFlops(counter, pipe.transformer),
            "dit_block0": CallFlops(counter, pipe.transformer.transformer_blocks[0]),
            "glyph": CallFlops(counter, pipe.text_encoder),
            "vae_decoder": CallFlops(counter, pipe.vae.decoder),
        }
        if getattr(pipe.vae, "post_quant_conv", None) is not None:
            hooks["vae_post_quant"] = CallFlops(counter, pipe.vae.post_quant_conv)
        decoder.decode(prior_token_ids, [prompt], size, size, [0])
    for h in hooks.values():
        h.remove()
    dit = hooks["dit"].calls
    return {
        "latent_patches": (size // pipe.vae_scale_factor // pipe.transformer.config.patch_size) ** 2,
        "dit_forwards_per_step": len(dit),
        "dit_forward": sum(dit) / len(dit),
        "dit_step": sum(dit),
        "dit_forward_block0": sum(hooks["dit_block0"].calls) / len(dit),
        "glyph_encoder": sum(hooks["glyph"].calls),
        "vae_decode": sum(sum(hooks[k].calls) for k in ("vae_decoder", "vae_post_quant") if k in hooks),
        "total": counter.get_total_flops(),
    }


def logprob_mismatch(ar, processor, size: int, group_size: int, sampling, seed: int = 0) -> dict:
    """bf16 sampler vs teacher-forced log-probs of one rollout of ``group_size`` rows at ``size``."""
    vcfg = VerifyConfig(height=size, width=size, group_size=group_size, num_prompts=1, dtype="bf16", seed=seed)
    t0 = time.perf_counter()
    batch, recomputed = sampler_and_trainer_logprobs(ar, processor, vcfg, sampling, torch.device("cpu"))
    return logprob_stats(batch.sampler_logps, recomputed) | {
        "rows": len(batch),
        "positions_per_row": batch.completion_ids.shape[1],
        "seconds": time.perf_counter() - t0,
    }


def logprob_stats(sampler: torch.Tensor, trainer: torch.Tensor) -> dict:
    """mean / max |dlogp| and k3 = exp(r) - 1 - r, r = trainer - sampler log-prob: with tokens drawn
    from the sampler, its mean estimates KL(sampler || trainer) (Schulman's unbiased, non-negative k3)."""
    r = (trainer - sampler).double()
    return {
        "mean_abs_dlogp": r.abs().mean().item(),
        "max_abs_dlogp": r.abs().max().item(),
        "mean_dlogp": r.mean().item(),
        "k3_kl": (r.exp() - 1 - r).mean().item(),
        "nonfinite": int((~torch.isfinite(trainer)).sum()),
    }


def rollout_speed(ar, processor, decoder, size: int, group_size: int, sampling, repeats: int) -> dict:
    """Our rollout vs ``generate_prior_tokens`` on the same AR object (no second copy), G rows."""
    from diffusers import GlmImagePipeline

    from glm_grpo_ds.rollout import rollout

    parts = decoder.pipe.components | {"vision_language_encoder": ar, "processor": processor}
    pipe = GlmImagePipeline(**parts)
    pipe.set_progress_bar_config(disable=True)

    def ours(seed: int):
        gen = torch.Generator().manual_seed(seed)
        t0 = time.perf_counter()
        with torch.no_grad():
            batch = rollout(ar, processor, [BENCH_PROMPT], group_size, size, size, sampling, gen)
        return batch, time.perf_counter() - t0

    out = rollout_vs_pipeline(ours, pipe, group_size, size, torch.device("cpu"), repeats)
    out["ours_over_pipeline"] = out["rollout_ours_tokens_per_s"] / out["rollout_pipeline_tokens_per_s"]
    return out | {"rows": group_size, "repeats": repeats}


# ----------------------------------------------------------------------------- one slice
def measure_slice(model: str, rcfg: ReportConfig, parts: tuple[str, ...]) -> dict:
    """Every measurement of ``parts`` on one slice directory, with its shape facts and wall times."""
    from glm_grpo_ds.config import SamplingConfig, load_config

    cfg = load_config(rcfg.config, [f"model.path={model}"])
    sampling = cfg.grpo.sampling if cfg.grpo.sampling is not None else SamplingConfig()
    torch.manual_seed(rcfg.seed)
    t0 = time.perf_counter()
    ar, processor, decoder = load_models(model, cfg, parts)
    text = ar.config.text_config
    res = {
        "model": str(model),
        "ar_layers": text.num_hidden_layers,
        "ar_hidden": text.hidden_size,
        "ar_attention_width": text_layers(ar)[0].self_attn.q_proj.out_features,  # heads x head_dim
        "ar_language_model_params": params(ar.model.language_model) + params(ar.lm_head),
        "ar_embedding_params": params(ar.model.language_model.embed_tokens),
        "ar_layer_params": params(text_layers(ar)[0]),
        "ar_layer_linear_params": linear_params(text_layers(ar)[0]),
        "seconds": {"load": time.perf_counter() - t0},
    }
    if decoder is not None:
        dit = decoder.pipe.transformer
        res.update(
            dit_layers=len(dit.transformer_blocks),
            dit_width=dit.config.num_attention_heads * dit.config.attention_head_dim,
            dit_params=params(dit),
            dit_block_params=params(dit.transformer_blocks[0]),
        )

    def timed(part, fn):
        t0 = time.perf_counter()
        res[part] = fn()
        res["seconds"][part] = time.perf_counter() - t0
        print(f"slice_report: {model}: {part} done in {res['seconds'][part]:.0f} s", file=sys.stderr, flush=True)

    sampling = cfg.grpo.sampling
    batch = None
    if set(FLOP_PARTS) & set(parts):  # the update and the decoder measure on this rollout's row
        t0 = time.perf_counter()
        res["ar"], batch = ar_flops(ar, processor, rcfg.size, sampling, rcfg.seed)
        res["seconds"]["ar"] = time.perf_counter() - t0
        print(f"slice_report: {model}: ar done in {res['seconds']['ar']:.0f} s", file=sys.stderr, flush=True)
    if "decoder" in parts:
        timed("decoder", lambda: decoder_flops(decoder, batch.prior_token_ids, BENCH_PROMPT, rcfg.size))
    if "logprobs" in parts:
        timed("logprobs", lambda: logprob_mismatch(ar, processor, rcfg.size, rcfg.group_size, sampling, rcfg.seed))
    if "speed" in parts:
        timed(
            "speed",
            lambda: rollout_speed(ar, processor, decoder, rcfg.size, rcfg.group_size, sampling, rcfg.repeats),
        )
    if "update" in parts:  # last: it adds the LoRA adapters to the AR in place
        timed("update", lambda: update_flops(ar, batch, cfg))
    return res


# ----------------------------------------------------------------------------- extrapolation
# (row, section, key, layered by: "ar" / "dit" / None, module per-layer key or None)
ROWS = [
    ("AR prefill, per prompt token", "ar", "prefill_per_token", "ar", "prefill_per_token_layer0"),
    ("AR decode step, batch 1, first", "ar", "decode_step_first", "ar", "decode_step_first_layer0"),
    ("AR decode step, batch 1, rollout mean", "ar", "decode_step_mean", "ar", "decode_step_mean_layer0"),
    ("update/seq: reference forward", "update", "reference_forward", "ar", "reference_forward_layer0"),
    ("update/seq: policy forward", "update", "policy_forward", "ar", "policy_forward_layer0"),
    ("update/seq: backward (+ recompute)", "update", "backward_with_recompute", "ar", None),
    ("update/seq: total", "update", "total", "ar", None),
    ("DiT forward", "decoder", "dit_forward", "dit", "dit_forward_block0"),
    ("DiT denoising step (x CFG)", "decoder", "dit_step", "dit", None),
    ("glyph encoder, per image", "decoder", "glyph_encoder", None, None),
    ("VAE decode, per image", "decoder", "vae_decode", None, None),
]


def doc_arithmetic(m: dict, full_ar_params: float, full_dit_params: float) -> dict:
    """docs/memory-and-speed.md's arithmetic for the full model at the slice's measured shapes:
    2 x params x tokens + attention 4 x layers x query tokens x keys x width (torch counts attention as
    a full square, causal or not). Update: forward, recompute and reference = 1 forward each and the
    backward of a LoRA policy = 1 (input gradients only): the doc's 8 x params x tokens."""
    out = {}
    if "ar" in m:
        a, L, d = m["ar"], FULL_AR_LAYERS, m["ar_attention_width"]
        plen, n = a["prompt_tokens"], a["generated_tokens"]
        out["prefill_per_token"] = 2 * full_ar_params + 4 * L * plen * d
        out["decode_step_first"] = 2 * full_ar_params + 4 * L * (plen + 1) * d
        out["decode_step_mean"] = 2 * full_ar_params + 4 * L * (plen + n / 2) * d  # contexts plen+1 .. plen+n-1
    if "update" in m:
        t = m["update"]["sequence_tokens"]
        fwd = 2 * full_ar_params * t + 4 * FULL_AR_LAYERS * t * t * m["ar_attention_width"]
        out.update(reference_forward=fwd, policy_forward=fwd, backward_with_recompute=2 * fwd, total=4 * fwd)
    if "decoder" in m and "dit_params" in m:
        dec = m["decoder"]
        s = dec["latent_patches"]
        out["dit_forward"] = 2 * full_dit_params * s + 4 * FULL_DIT_LAYERS * s * s * m["dit_width"]
        out["dit_step"] = out["dit_forward"] * dec["dit_forwards_per_step"]
    return out


def analyse(main: dict, slope: dict | None) -> list[dict]:
    """One row per quantity: slice value, per layer (module; slope of the two slices), extrapolated full
    model, the doc's arithmetic for it and full / doc."""
    full_ar = main["ar_language_model_params"] + (FULL_AR_LAYERS - main["ar_layers"]) * main["ar_layer_params"]
    full_dit = None
    if "dit_params" in main:
        full_dit = main["dit_params"] + (FULL_DIT_LAYERS - main["dit_layers"]) * main["dit_block_params"]
    doc = doc_arithmetic(main, full_ar, full_dit or 0)
    rows = []
    for name, section, key, layered, module_key in ROWS:
        if section not in main:
            continue
        value = main[section][key]
        row = {"quantity": name, "key": f"{section}.{key}", "slice": value}
        if layered:
            n_key = "ar_layers" if layered == "ar" else "dit_layers"
            full_layers = FULL_AR_LAYERS if layered == "ar" else FULL_DIT_LAYERS
            row["per_layer_module"] = main[section][module_key] if module_key else None
            row["per_layer_slope"] = None
            if slope is not None and section in slope and slope[n_key] != main[n_key]:
                row["per_layer_slope"] = (slope[section][key] - value) / (slope[n_key] - main[n_key])
            per_layer = row["per_layer_slope"] if row["per_layer_slope"] is not None else row["per_layer_module"]
            row["full"] = None if per_layer is None else value + (full_layers - main[n_key]) * per_layer
        else:  # not layered: the slice's figure is the full model's
            row["per_layer_module"] = row["per_layer_slope"] = None
            row["full"] = value
        row["doc"] = doc.get(key)
        row["full_over_doc"] = row["full"] / row["doc"] if row["full"] is not None and row["doc"] else None
        rows.append(row)
    return rows


def _fmt(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return f"{x:.4g}" if abs(x) < 1000 else f"{x:.3e}"


def format_report(report: dict) -> str:
    m = report["slice"]
    lines = [
        f"slice {m['model']}: AR {m['ar_layers']} layers, DiT {m.get('dit_layers', '-')} layers, "
        f"{report['size']}x{report['size']}; extrapolated to {FULL_AR_LAYERS} AR / {FULL_DIT_LAYERS} DiT layers"
        + (f"; slope from {report['slope_slice']['model']}" if report.get("slope_slice") else ""),
        "FLOPs (FlopCounterMode)",
    ]
    head = ("quantity", "slice", "layer(module)", "layer(slope)", "full", "doc", "full/doc")
    table = [head] + [
        (
            r["quantity"],
            _fmt(r["slice"]),
            _fmt(r["per_layer_module"]),
            _fmt(r["per_layer_slope"]),
            _fmt(r["full"]),
            _fmt(r["doc"]),
            "-" if r["full_over_doc"] is None else f"{r['full_over_doc']:.3f}",
        )
        for r in report["flops"]
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    lines += [
        "  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
        for row in table
    ]
    if "logprobs" in m:
        lp = m["logprobs"]
        lines.append(
            f"bf16 sampler vs trainer ({lp['rows']} rows x {lp['positions_per_row']} positions): mean |dlogp| "
            f"{lp['mean_abs_dlogp']:.3e}, max {lp['max_abs_dlogp']:.3e}, mean dlogp {lp['mean_dlogp']:.2e}, "
            f"k3 KL {lp['k3_kl']:.3e}, non-finite {lp['nonfinite']}"
        )
    if "speed" in m:
        sp = m["speed"]
        lines.append(
            f"rollout, G={sp['rows']}: ours {sp['rollout_ours_tokens_per_s']:.2f} tokens/s, generate_prior_tokens "
            f"{sp['rollout_pipeline_tokens_per_s']:.2f} tokens/s: ours / pipeline {sp['ours_over_pipeline']:.2f}x"
        )
    secs = ", ".join(f"{k} {v:.0f}" for k, v in m["seconds"].items())
    lines.append(f"wall seconds: {secs}; total {report['seconds']:.0f}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- command line
def parse_args(argv):
    d = ReportConfig()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="real-width slice directory (glm-grpo tiny-model DIR --real-width)")
    p.add_argument("--slope-model", default=None, help="the same slice with more layers: per-layer FLOPs by difference")
    p.add_argument("--size", type=int, default=d.size, help="image height = width (multiple of 32)")
    p.add_argument("--group-size", type=int, default=d.group_size, help="rows of the log-prob and speed measurements")
    p.add_argument("--repeats", type=int, default=d.repeats, help="rollout-vs-pipeline repeats (median)")
    p.add_argument("--config", default=d.config, help="training YAML: LoRA, checkpointing, chunk size, guidance")
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--out", default=d.out, help="JSON report path")
    a = p.parse_args(argv)
    if a.size <= 0 or a.size % 32:
        p.error(f"--size must be a positive multiple of 32, got {a.size}")
    if a.group_size < 1 or a.repeats < 1:
        p.error("--group-size and --repeats must be >= 1")
    for path in filter(None, (a.model, a.slope_model)):
        if not (Path(path) / "model_index.json").is_file():
            p.error(f"{path} is not a pipeline directory (no model_index.json)")
    return a


def run(a) -> dict:
    rcfg = ReportConfig(size=a.size, group_size=a.group_size, repeats=a.repeats, config=a.config, seed=a.seed)
    t0 = time.perf_counter()
    main_slice = measure_slice(a.model, rcfg, tuple(a.parts))
    slope = None
    if a.slope_model:
        slope = measure_slice(a.slope_model, rcfg, tuple(p for p in a.parts if p in FLOP_PARTS))
    report = {
        "size": a.size,
        "device": f"cpu ({torch.get_num_threads()} threads)",
        "slice": main_slice,
        "slope_slice": slope,
        "flops": analyse(main_slice, slope),
        "seconds": time.perf_counter() - t0,
    }
    return report


def main(argv: list[str] | None = None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    report = run(a)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(format_report(report))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
