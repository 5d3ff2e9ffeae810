"""Time the frozen DiT decode, variant by variant (attention kernel, compiled blocks, FP8 linears), and compare images.

    glm-grpo profile dit-timing --model random:glm-image                 # GPU: every variant this GPU can run
    glm-grpo profile dit-timing --model random:glm-image --variants sdpa,compiled,fp8,guidance_half
    glm-grpo profile dit-timing --model random:tiny --batch 2 --size 64 --steps 1,2 --device cpu  # the tests' CPU form
    bash launch/gpu_timing.sh                                            # this (its part 3), in one lease

``--model`` is a GlmImagePipeline directory or Hub id: GLM-Image itself (``zai-org/GLM-Image``), or a ``random:`` name
(``random:glm-image``: the real DiT with random weights built on the device; ``random:tiny``: the tiny one). For each
variant a fresh :class:`~glm_grpo_ds.decoder.ImageDecoder` (the trainer's decoder, ``decoder.*`` of the variant)
decodes one batch of ``--batch`` rows of one prompt: random prior token ids from a fixed generator and the same seeds
(one per row) for every variant. An untimed warm-up decode first (the compile happens there: its seconds are the
setup), then decodes at the two step counts S1 < S2 of ``--steps``, all guided (but ``guidance_half``'s), each
timed with CUDA events (perf_counter on a CPU), the fastest of ``--repeats`` (2). The seconds per guided image-step
are (T(S2) - T(S1)) / ((S2 - S1) x batch): the difference drops the glyph encoder and the VAE, which run once per
decode. Variants (``decoder.*`` overrides):

* ``sdpa``: diffusers' pipeline as it is (the reference; always run, first);
* ``sdpa_cudnn``, ``sdpa_flash``, ``sdpa_efficient``, ``sdpa_math``, ``flash_attn``, ``flash_attn_3``: the DiT's
  attention kernel (``decoder.attention``);
* ``compiled``: the transformer blocks compiled regionally (``decoder.compile``);
* ``fp8``: the block linears in float8 (``decoder.fp8``); ``fp8_compiled``: both; ``cudnn_compiled``: sdpa_cudnn
  with the blocks compiled (the lossless stack); ``fp8_cudnn_compiled``: all three;
* ``guidance_half``: the reference decoder with guidance on the first half of the steps only
  (``decoder.guidance_steps``): a decode of S steps guides the first ceil(S/2). Its figure is seconds per image-step
  of such a decode, not per guided step: of the S2 - S1 steps the difference times, ceil(S2/2) - ceil(S1/2) are
  guided (``guided_fraction``: one half when S1 and S2 are both odd or both even, as the default 1,3); its images
  differ from the reference's by design (fewer guided steps).

For each: seconds per guided image-step, the speed-up over ``sdpa``, the setup seconds, the S2 images against the
reference's (largest absolute difference, PSNR in dB with peak 1.0: inf when equal), the DiT's weight bytes and the
peak of allocated GPU memory over the variant's decodes. A variant this device or install cannot run
(glm_grpo_ds/decoder/compute.py) is listed as skipped with the reason; one that fails is listed with its error and
the command exits 1. Bad input: one line on stderr, exit 2.
"""

from __future__ import annotations

import datetime
import gc
import json
import math
import sys
import time
from pathlib import Path

import torch

from ..observability.metrics import finite_or_none
from .decode_timing import device_timer
from .tools import parser_for

REFERENCE = "sdpa"
VARIANTS: dict[str, dict] = {
    "sdpa": {},
    "sdpa_cudnn": {"attention": "sdpa_cudnn"},
    "sdpa_flash": {"attention": "sdpa_flash"},
    "sdpa_efficient": {"attention": "sdpa_efficient"},
    "sdpa_math": {"attention": "sdpa_math"},
    "flash_attn": {"attention": "flash_attn"},
    "flash_attn_3": {"attention": "flash_attn_3"},
    "compiled": {"compile": True},
    "fp8": {"fp8": True},
    "fp8_compiled": {"fp8": True, "compile": True},
    "cudnn_compiled": {"attention": "sdpa_cudnn", "compile": True},
    "fp8_cudnn_compiled": {"attention": "sdpa_cudnn", "compile": True, "fp8": True},  # every lever at once
    "guidance_half": {},  # the reference decoder; its decodes guide the first half of their steps (HALF_GUIDED)
}
HALF_GUIDED = {"guidance_half"}  # variants whose decodes of S steps guide the first ceil(S/2) only
PROMPT = 'A poster with the title "GRPO" above a red bicycle'  # one glyph text: the glyph encoder runs as in training
GIB = 2**30


def parse_args(argv):
    p = parser_for("dit-timing")
    p.add_argument("--model", required=True, help="a GlmImagePipeline directory (glm-grpo tiny-model) or a Hub id")
    p.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help=f"comma-separated, of {', '.join(VARIANTS)} (default: all; {REFERENCE} always runs, first)",
    )
    p.add_argument("--batch", type=int, default=8, help="rows of one prompt per DiT batch (decoder.batch_size)")
    p.add_argument("--size", type=int, default=1024, help="image height = width in pixels (a multiple of 32)")
    p.add_argument("--steps", default="1,3", help="the two DiT step counts S1,S2 timed (S2 > S1 >= 1)")
    p.add_argument("--guidance", type=float, default=1.5, help="classifier-free guidance of every step (> 1)")
    p.add_argument("--device", default="auto", help="auto (cuda when available, else cpu), cuda, cuda:N or cpu")
    p.add_argument("--repeats", type=int, default=2, help="each timed decode's time: the fastest of this many")
    p.add_argument("--seed", type=int, default=0, help="seeds the prior token ids and the rows' noise")
    p.add_argument("--out", default=None, help="write the report as JSON here")
    return p.parse_args(argv)


def check_args(a) -> None:
    """Normalize ``a`` in place (variants a list with the reference first, steps a pair, device a torch.device);
    ValueError / FileNotFoundError naming the flag and the fix on bad input."""
    from ..model.source import resolve_model
    from ..testing.random_model import materialize

    names = [v.strip() for v in a.variants.split(",") if v.strip()]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        raise ValueError(f"--variants: unknown {unknown[0]!r}; choose from {', '.join(VARIANTS)}")
    a.variants = [REFERENCE] + [v for v in dict.fromkeys(names) if v != REFERENCE]
    try:
        steps = tuple(int(s) for s in a.steps.split(","))
    except ValueError:
        steps = ()
    if len(steps) != 2 or not 1 <= steps[0] < steps[1]:
        raise ValueError(f"--steps {a.steps!r}: give two increasing positive step counts, e.g. --steps 1,3")
    a.steps = steps
    if a.repeats < 1:
        raise ValueError(f"--repeats {a.repeats}: give at least 1, e.g. --repeats 2")
    if a.batch < 1:
        raise ValueError(f"--batch {a.batch}: give at least 1 row, e.g. --batch 8")
    if a.size < 32 or a.size % 32:
        raise ValueError(f"--size {a.size}: give a positive multiple of 32 pixels, e.g. --size 1024")
    if a.guidance <= 1:
        raise ValueError(f"--guidance {a.guidance:g}: give a guidance > 1 (every timed step guided), e.g. 1.5")
    try:
        a.device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if a.device == "auto" else a.device)
    except RuntimeError as err:
        raise ValueError(f"--device {a.device!r}: {err}; give auto, cuda, cuda:N or cpu") from None
    if a.device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA GPU is available here; give --device cpu (or auto)")
    if a.device.type == "cuda":
        torch.cuda.set_device(a.device)  # the timer's events record on the current device's stream
    materialize(a.model, "--model")  # random:glm-image: the DiT built on the device (model/random_weights.py)
    a.model = str(resolve_model(a.model, flag="--model").path)  # a Hub id: from the cache, or downloaded once


def _inputs(pipe, batch: int, size: int, seed: int) -> tuple[torch.Tensor, list[int]]:
    """Random prior token ids ``[batch, (size/16)^2]`` in the DiT's codebook from a fixed generator, and one seed
    per row: the same for every variant."""
    codebook = pipe.transformer.config.prior_vq_quantizer_codebook_size
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, codebook, (batch, (size // 16) ** 2), generator=gen)
    return ids, [seed + 1000 + row for row in range(batch)]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def compare(images: torch.Tensor, ref: torch.Tensor) -> dict:
    """Largest absolute difference and PSNR (dB, peak 1.0; inf when equal) of ``images`` against ``ref``."""
    diff = (images.double() - ref.double()).abs()
    mse = float(diff.square().mean())
    return {"max_abs_diff": float(diff.max()), "psnr_db": math.inf if mse == 0 else -10 * math.log10(mse)}


def settings(name: str, steps: int, guidance: float):
    """The decode settings of variant ``name`` at ``steps`` steps: every step guided, or the first half of them."""
    from ..decoder import DecodeSettings

    return DecodeSettings(steps, guidance, math.ceil(steps / 2) if name in HALF_GUIDED else None)


def run_variant(name: str, a, device: torch.device) -> tuple[dict, torch.Tensor]:
    """One variant: its decoder built, a warm-up decode, then the timed decodes at S1 and S2; (record, the S2
    images on the CPU). The decoder is freed when this returns."""
    from ..config import DecoderConfig
    from ..decoder import ImageDecoder

    t0 = time.perf_counter()
    cfg = DecoderConfig(batch_size=a.batch, guidance_scale=a.guidance, **VARIANTS[name])
    decoder = ImageDecoder(a.model, cfg, device)
    _sync(device)
    load_s = time.perf_counter() - t0
    ids, seeds = _inputs(decoder.pipe, a.batch, a.size, a.seed)
    prompts = [PROMPT] * a.batch
    s1, s2 = a.steps
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    decoder.decode(ids, prompts, a.size, a.size, seeds, settings(name, s1, a.guidance))  # compiles here
    _sync(device)
    setup_s = time.perf_counter() - t0
    start, stop = device_timer(device)
    seconds = {s1: math.inf, s2: math.inf}
    for _ in range(a.repeats):
        for steps in (s1, s2):
            start()
            images = decoder.decode(ids, prompts, a.size, a.size, seeds, settings(name, steps, a.guidance))
            seconds[steps] = min(seconds[steps], stop())
    dit = decoder.pipe.transformer
    record = {
        "overrides": VARIANTS[name],
        "s_per_image_step": (seconds[s2] - seconds[s1]) / ((s2 - s1) * a.batch),
        "seconds": {str(k): v for k, v in seconds.items()},
        "load_s": load_s,
        "setup_s": setup_s,
        "dit_bytes": sum(t.numel() * t.element_size() for t in [*dit.parameters(), *dit.buffers()]),
        "peak_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
    }
    if name in HALF_GUIDED:
        guided = {s: settings(name, s, a.guidance).guided_steps for s in (s1, s2)}
        record["guided_steps"] = {str(s): g for s, g in guided.items()}
        record["guided_fraction"] = (guided[s2] - guided[s1]) / (s2 - s1)
    return record, images.cpu()


def _free(device: torch.device) -> None:
    """The variant's decoder and its compiled code gone: every compiled block shares one code object's dynamo cache,
    so without a reset later variants' compiles would pile onto the earlier ones' (up to its recompile limit, then
    eager without a word) and start warm."""
    torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _skipped(name: str, a, dtype: torch.dtype) -> str | None:
    """Why this device or install cannot run variant ``name`` (its lines joined), None when it can."""
    from ..config import DecoderConfig
    from ..decoder.compute import device_problems

    problems = device_problems(DecoderConfig(**VARIANTS[name]), a.device, dtype)
    return "; ".join(problems) or None


def _dit_shape(model: str) -> dict:
    """The DiT's layers and hidden width, from its config.json."""
    config = json.loads((Path(model) / "transformer" / "config.json").read_text(encoding="utf-8"))
    return {
        "dit_layers": config["num_layers"],
        "dit_hidden": config["num_attention_heads"] * config["attention_head_dim"],
    }


def measure(a, on_variant=None) -> dict:
    """Every variant of ``a.variants`` (checked by :func:`check_args`): the report as a JSON-able dict.
    ``on_variant(report)``: after each variant (timed, skipped or failed), the report so far, its ``pending`` the
    variants still to run (``--out`` is rewritten then: a run stopped at a lease's budget keeps what it timed)."""
    from ..model.glm_image import resolve_dtype

    device = a.device
    dtype = resolve_dtype("auto", on_gpu=device.type == "cuda")
    results, skipped, failed = {}, {}, {}
    ref_images = None
    for name in a.variants:
        why = _skipped(name, a, dtype)
        if why:
            skipped[name] = why
            print(f"  {name}: skipped ({why})", flush=True)
        else:
            ref_images = _time_variant(name, a, device, ref_images, results, failed)
        if on_variant is not None:
            on_variant(_report(a, device, dtype, results, skipped, failed))
    return _report(a, device, dtype, results, skipped, failed)


def _time_variant(name: str, a, device, ref_images, results: dict, failed: dict):
    """Variant ``name`` timed and compared with the reference's images into ``results``, or its error into
    ``failed`` (the reference's own error is raised); returns the reference's images, for the variants after it."""
    try:
        record, images = run_variant(name, a, device)
    except Exception as err:  # a kernel or compile this stack cannot run: reported, the others still timed
        if name == REFERENCE:
            raise
        failed[name] = f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0]}"
        print(f"  {name}: FAILED ({failed[name]})", flush=True)
        record = images = None
    if record is not None:
        ref_images = images if ref_images is None else ref_images
        record.update(compare(images, ref_images))
        results[name] = record
        per = "image-step, the first half guided" if name in HALF_GUIDED else "guided image-step"
        print(f"  {name}: {record['s_per_image_step']:.4g} s per {per}", flush=True)
    del images  # outside the except block: its traceback (and a failed decoder) released before the free
    _free(device)
    return ref_images


def _report(a, device, dtype, results: dict, skipped: dict, failed: dict) -> dict:
    """The report of the variants run so far (``pending``: the rest, in their order)."""
    for record in results.values():
        record["speedup_vs_sdpa"] = results[REFERENCE]["s_per_image_step"] / record["s_per_image_step"]
    done = results.keys() | skipped.keys() | failed.keys()
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
        "dtype": str(dtype).removeprefix("torch."),
        "model": str(a.model),
        "size": a.size,
        "batch": a.batch,
        "steps": list(a.steps),
        "guidance": a.guidance,
        "repeats": a.repeats,
        **_dit_shape(a.model),
        "prompt": PROMPT,
        "reference": REFERENCE,
        "variants": results,
        "skipped": skipped,
        "failed": failed,
        "pending": [name for name in a.variants if name not in done],
    }


def format_report(m: dict) -> str:
    s1, s2 = m["steps"]
    lines = [
        f"DiT decode on {m['device']} (torch {m['torch']}): {m['dtype']}, {m['size']}², batch {m['batch']}, "
        f"steps {s1},{s2} guided {m['guidance']:g}; DiT {m['dit_layers']} layers x {m['dit_hidden']} hidden",
        f"{'variant':<16}{'s/img-step':>12}{'x sdpa':>8}{'setup s':>9}{'max |diff|':>12}{'PSNR dB':>9}"
        f"{'DiT GiB':>9}{'peak GiB':>10}",
    ]
    for name, r in m["variants"].items():
        peak = f"{r['peak_bytes'] / GIB:.2f}" if r["peak_bytes"] is not None else "-"
        lines.append(
            f"{name:<16}{r['s_per_image_step']:>12.4g}{r['speedup_vs_sdpa']:>8.2f}{r['setup_s']:>9.2f}"
            f"{r['max_abs_diff']:>12.1e}{r['psnr_db']:>9.1f}{r['dit_bytes'] / GIB:>9.2f}{peak:>10}"
        )
    lines += [f"skipped {name}: {why}" for name, why in m["skipped"].items()]
    lines += [f"FAILED {name}: {why}" for name, why in m["failed"].items()]
    noisy = [name for name, r in m["variants"].items() if r["s_per_image_step"] <= 0]
    if noisy:
        lines.append(
            f"timing noise exceeded T({s2}) - T({s1}) for {', '.join(noisy)}: rerun on a quiet machine, with a "
            "larger second --steps or more --repeats"
        )
    half = [name for name in m["variants"] if name in HALF_GUIDED]
    lines += [
        f"{name}: guidance on the first half of the steps only ({m['variants'][name]['guided_fraction']:.0%} of the "
        "timed steps guided): seconds per image-step of such a decode, not per guided one"
        for name in half
    ]
    lines.append(
        f"s/img-step: (T({s2}) - T({s1})) / ({s2 - s1} x {m['batch']} rows), each T the fastest of {m['repeats']}; "
        f"max |diff| and PSNR (peak 1.0): the {s2}-step images against {m['reference']}'s; setup: the warm-up decode"
    )
    return "\n".join(lines)


def _strict(value):
    """``value`` with every non-finite float (the reference's PSNR against itself) as null: strict JSON (jq, JS)."""
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_strict(v) for v in value]
    return finite_or_none(value) if isinstance(value, float) else value


def main(argv: list[str] | None = None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        check_args(a)
    except (ValueError, FileNotFoundError) as err:
        print(f"glm-grpo profile dit-timing: {err}", file=sys.stderr)
        return 2
    write = None
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)

        def write(m: dict) -> None:
            Path(a.out).write_text(json.dumps(_strict(m), indent=1, allow_nan=False) + "\n", encoding="utf-8")

    m = measure(a, on_variant=write)  # written after each variant, so after the last as returned
    print(format_report(m))
    return 1 if m["failed"] else 0


if __name__ == "__main__":  # a process entry point (the bench's ranks too): no interpreter teardown
    from ..runtime import process_exit

    raise SystemExit(process_exit.exit_now(main()))
