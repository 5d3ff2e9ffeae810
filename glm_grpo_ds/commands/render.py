"""Render prompts to PNG files with a GLM-Image pipeline directory (AR + DiT), offline.

    glm-grpo render --model outputs/tiny --prompt "a red cube" --height 64 --width 96 --out outputs/render

Useful to look at a base model, a merged model after training, or the embedded tiny model.
Writes ``<out>/<index>.png`` for each prompt and prints the paths.
"""

from __future__ import annotations

import argparse
import os
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


def main(argv: list[str] | None = None) -> int:
    d = RenderConfig()
    parser = argparse.ArgumentParser(prog="glm-grpo render", description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="GlmImagePipeline directory")
    parser.add_argument("--prompt", action="append", required=True, help="repeat for several prompts")
    parser.add_argument("--height", type=int, default=d.height)
    parser.add_argument("--width", type=int, default=d.width)
    parser.add_argument("--steps", type=int, default=d.num_inference_steps, help="DiT denoising steps")
    parser.add_argument("--guidance", type=float, default=d.guidance_scale, help="DiT classifier-free guidance scale")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--out", default=d.out, help="output directory")
    args = parser.parse_args(argv)

    for name, value in (("--height", args.height), ("--width", args.width)):
        if value <= 0 or value % 32:
            print(f"glm-grpo render: {name} {value} must be a positive multiple of 32", file=sys.stderr)
            return 2
    if not (Path(args.model) / "model_index.json").is_file():
        print(
            f"glm-grpo render: {args.model} is not a GlmImagePipeline directory (no model_index.json)", file=sys.stderr
        )
        return 2

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from diffusers import GlmImagePipeline

    pipe = GlmImagePipeline.from_pretrained(args.model)
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
