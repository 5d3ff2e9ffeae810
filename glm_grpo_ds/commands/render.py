"""Render prompts to PNG files with a GLM-Image pipeline (AR + DiT), optionally with a trained LoRA adapter.

    glm-grpo render --model outputs/tiny --prompt "a red cube" --height 64 --width 96 --out outputs/render
    glm-grpo render --model zai-org/GLM-Image --adapter outputs/glm_image_lora/final_adapter \
        --prompt "a red cube" --height 1024 --width 1024 --steps 30 --out outputs/render

Useful to look at a base model, a trained adapter (``--adapter``: loaded into the pipeline's
``vision_language_encoder`` with ``load_adapter``, not merged; the images equal those of the
``glm-grpo merge`` output for the same seeds), a merged model, or the embedded tiny model. ``--model``
is a pipeline directory or a Hub id (glm_grpo_ds/model_source.py). Writes ``<out>/<index>.png`` for
each prompt and prints the paths.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass
class RenderConfig:
    """``glm-grpo render``: prompts -> PNG through a GLM-Image pipeline."""

    height: int = 64
    width: int = 64
    num_inference_steps: int = 8
    guidance_scale: float = 1.5
    seed: int = 0
    out: str = "outputs/render"
    dtype: str = "auto"  # auto = bf16 on a GPU, fp32 on CPU
    device: str = "auto"  # auto = cuda when available, else cpu


def main(argv: list[str] | None = None) -> int:
    d = RenderConfig()
    parser = argparse.ArgumentParser(prog="glm-grpo render", description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="GlmImagePipeline: a directory or a Hub id (org/name)")
    parser.add_argument("--revision", default=None, help="Hub revision of --model (commit, branch or tag; main)")
    parser.add_argument("--adapter", default=None, help="peft LoRA adapter to apply (a run's final_adapter/)")
    parser.add_argument("--prompt", action="append", required=True, help="repeat for several prompts")
    parser.add_argument("--height", type=int, default=d.height)
    parser.add_argument("--width", type=int, default=d.width)
    parser.add_argument("--steps", type=int, default=d.num_inference_steps, help="DiT denoising steps")
    parser.add_argument("--guidance", type=float, default=d.guidance_scale, help="DiT classifier-free guidance scale")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--dtype", choices=["auto", "bf16", "fp32", "fp16"], default=d.dtype)
    parser.add_argument("--device", default=d.device, help="auto = cuda when available, else cpu")
    parser.add_argument("--out", default=d.out, help="output directory")
    args = parser.parse_args(argv)

    for name, value in (("--height", args.height), ("--width", args.width)):
        if value <= 0 or value % 32:
            print(f"glm-grpo render: {name} {value} must be a positive multiple of 32", file=sys.stderr)
            return 2
    from ..adapters import find_adapter
    from ..model_source import resolve_model

    try:
        model = resolve_model(args.model, args.revision, flag="--model", revision_flag="--revision").path
        adapter = find_adapter(args.adapter) if args.adapter else None
    except FileNotFoundError as err:
        print(f"glm-grpo render: {err}", file=sys.stderr)
        return 2

    from ..data.rows import DataError
    from ..policy import load_processor
    from ..token_ids import check_token_ids, embedding_rows

    try:  # before the weights load: a prompt the AR cannot embed is one line, not an IndexError mid-render
        rows = embedding_rows(model)
        check_token_ids(load_processor(model), rows, model, args.prompt, "--prompt", args.height, args.width)
    except DataError as err:
        print(f"glm-grpo render: {err}", file=sys.stderr)
        return 2

    import torch
    from diffusers import GlmImagePipeline

    from ..policy import resolve_dtype

    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    pipe = GlmImagePipeline.from_pretrained(model, dtype=resolve_dtype(args.dtype, device.type == "cuda"))
    if adapter is not None:
        pipe.vision_language_encoder.load_adapter(str(adapter))  # LoRA layers on top, base weights untouched
    pipe.to(device)
    pipe.set_progress_bar_config(disable=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for i, prompt in enumerate(args.prompt):
        generator = torch.Generator().manual_seed(args.seed + i)
        image = pipe(
            prompt,
            height=args.height,
            width=args.width,
            num_inference_steps=args.steps,
            guidance_scale=args.guidance,
            generator=generator,
        ).images[0]
        path = out / f"{i:03d}.png"
        image.save(path)
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
