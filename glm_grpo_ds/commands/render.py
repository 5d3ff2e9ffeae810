"""Render prompts to PNG files with a GLM-Image pipeline (AR + DiT), optionally with a trained LoRA adapter.

    glm-grpo render --model outputs/tiny --prompt "a red cube" --height 64 --width 96 --out outputs/render
    glm-grpo render --model zai-org/GLM-Image --adapter outputs/glm_image_lora/final_adapter \
        --prompt "a red cube" --height 1024 --width 1024 --steps 30 --out outputs/render

Useful to look at a base model, a trained adapter (``--adapter``: loaded into the pipeline's
``vision_language_encoder`` with ``load_adapter``, not merged, as it was trained; the images equal those of a
``glm-grpo merge --dtype fp32`` output rendered with ``--dtype fp32`` for the same seeds: a bf16 merge, or that
merge cast to bf16 at load, rounds small adapter deltas away),
a merged model, or the embedded tiny model. ``--model``
is a pipeline directory or a Hub id (glm_grpo_ds/model/source.py). Writes ``<out>/000.png``, ``001.png``,
... (prompt i with seed ``--seed`` + i) and ``<out>/index.jsonl`` (one line per image: file, prompt, seed,
size, steps, guidance, model, adapter), and prints the paths. An ``--out`` holding an earlier render's images is
refused (one line) unless ``--overwrite``, which deletes them first, so ``index.jsonl`` always describes the
images present. Size, steps and guidance not given are the
model's own (:func:`model_defaults`: 1024x1024, 50 steps, guidance 1.5 for GLM-Image), named on stderr.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from .cli import parser_for


@dataclass
class RenderConfig:
    """``glm-grpo render``: prompts -> PNG through a GLM-Image pipeline. None = the model's own default
    (:func:`model_defaults`)."""

    height: int | None = None
    width: int | None = None
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    seed: int = 0
    out: str = "outputs/render"
    dtype: str = "auto"  # auto = bf16 on a GPU, fp32 on CPU
    device: str = "auto"  # auto = cuda when available, else cpu


INDEX = "index.jsonl"  # one line per image: file, prompt, seed and the settings it was rendered with


def model_defaults(model_dir: Path) -> dict:
    """What ``GlmImagePipeline`` is made to render when not told: its ``default_sample_size`` (the
    transformer config's ``sample_size``, else diffusers' 128) x the VAE's down-sampling, diffusers'
    documented convention (128 x 8 = 1024 for GLM-Image), and the step count and guidance of
    ``__call__``'s signature. Read from the pipeline directory's configs and the installed diffusers, so
    it follows both."""
    from ..decoder import pipeline_call_defaults

    transformer = json.loads((model_dir / "transformer" / "config.json").read_text())
    vae = json.loads((model_dir / "vae" / "config.json").read_text())
    size = transformer.get("sample_size", 128) * 2 ** (len(vae["block_out_channels"]) - 1)
    return {"height": size, "width": size, **pipeline_call_defaults().record()}


def earlier_render(out: Path) -> list[Path]:
    """What an earlier render left in ``out``: its ``NNN.png`` images and :data:`INDEX` (other files are not
    render's and stay)."""
    if not out.is_dir():
        return []
    return sorted(p for p in out.iterdir() if p.name == INDEX or (p.suffix == ".png" and p.stem.isdigit()))


class _Refused(Exception):
    """A one-line refusal: ``glm-grpo render: <message>`` on stderr, exit 2."""


def parse_args(argv: list[str] | None):
    d = RenderConfig()
    parser = parser_for("render")
    own = "default: the model's own, its DiT's sample_size x the VAE's scale: 1024 for GLM-Image"
    parser.add_argument("--model", required=True, help="GlmImagePipeline: a directory or a Hub id (org/name)")
    parser.add_argument(
        "--revision", default=None, help="Hub revision of --model: commit, branch or tag (default: main)"
    )
    parser.add_argument("--adapter", default=None, help="peft LoRA adapter to apply, e.g. a run's final_adapter/")
    parser.add_argument("--prompt", action="append", required=True, help="repeat for several prompts")
    parser.add_argument("--height", type=int, default=d.height, help=f"image height ({own})")
    parser.add_argument("--width", type=int, default=d.width, help=f"image width ({own})")
    parser.add_argument(
        "--steps", type=int, default=d.num_inference_steps, help="DiT denoising steps (default: the pipeline's, 50)"
    )
    parser.add_argument(
        "--guidance",
        type=float,
        default=d.guidance_scale,
        help="DiT classifier-free guidance scale (default: the pipeline's, 1.5)",
    )
    parser.add_argument("--seed", type=int, default=d.seed, help="prompt i uses seed + i (default: %(default)s)")
    parser.add_argument(
        "--dtype",
        choices=["auto", "bf16", "fp32", "fp16"],
        default=d.dtype,
        help="auto = bf16 on a GPU, else fp32 (default: %(default)s)",
    )
    parser.add_argument(
        "--device", default=d.device, help="auto = cuda when available, else cpu (default: %(default)s)"
    )
    parser.add_argument(
        "--out", default=d.out, help=f"output directory: 000.png, 001.png, ... and {INDEX} (default: %(default)s)"
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help=f"replace the images and {INDEX} an earlier render left in --out (without it such an --out is refused)",
    )
    return parser.parse_args(argv)


def _check_out_and_size(args) -> list[Path]:
    """What an earlier render left in ``--out`` (refused without ``--overwrite``), and ``--height`` / ``--width``
    checked: before any model loads, so nothing is touched."""
    earlier = earlier_render(Path(args.out))
    if earlier and not args.overwrite:
        raise _Refused(
            f"--out {args.out} already holds {len(earlier)} file(s) of an earlier render "
            f"({', '.join(p.name for p in earlier[:3])}{', ...' if len(earlier) > 3 else ''}); give another --out, "
            "or --overwrite to replace them"
        )
    for name, value in (("--height", args.height), ("--width", args.width)):
        if value is not None and (value <= 0 or value % 32):
            raise _Refused(f"{name} {value} must be a positive multiple of 32")
    return earlier


def _resolve(args):
    """``(model source, adapter directory or None)``: a missing directory or Hub id is a refusal."""
    from ..model.adapters import find_adapter
    from ..model.source import resolve_model
    from ..testing.random_model import materialize

    try:
        materialize(args.model, "--model")  # a random: model's configs (glm_grpo_ds/model/random_weights.py)
        source = resolve_model(args.model, args.revision, flag="--model", revision_flag="--revision")
        adapter = find_adapter(args.adapter) if args.adapter else None
    except FileNotFoundError as err:
        raise _Refused(err) from None
    return source, adapter


def _settings(args, model: Path) -> tuple[dict, list[str]]:
    """The pipeline call's size, steps and guidance: the flags', else the model's own (:func:`model_defaults`);
    and the names of those taken from the model."""
    own_defaults = model_defaults(model)
    settings = {
        "height": args.height,
        "width": args.width,
        "num_inference_steps": args.steps,
        "guidance_scale": args.guidance,
    }
    taken = [k for k, v in settings.items() if v is None]
    settings.update({k: own_defaults[k] for k in taken})
    return settings, taken


def _check_prompts(args, model: Path, settings: dict) -> None:
    """Before the weights load: a prompt the AR cannot embed is one line, not an IndexError mid-render."""
    from ..data.rows import DataError
    from ..model.glm_image import load_processor
    from ..model.token_ids import check_token_ids, embedding_rows

    try:
        rows = embedding_rows(model)
        height, width = settings["height"], settings["width"]
        check_token_ids(load_processor(model), rows, model, args.prompt, "--prompt", height, width)
    except DataError as err:
        raise _Refused(err) from None


def _pipeline(args, source, adapter):
    """The pipeline on its device, with the adapter loaded onto the AR unmerged (base weights untouched)."""
    import torch

    from ..config import ConfigError
    from ..decoder.image_decoder import load_pipeline
    from ..model.glm_image import resolve_dtype

    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    if source.random_weights:
        print(f"glm-grpo render: {source.random_weights}: random weights, the images are noise", file=sys.stderr)
    try:  # a file missing a weight: one line (runtime/loading_info.py), not an image of partly random weights
        pipe = load_pipeline(source.path, resolve_dtype(args.dtype, device.type == "cuda"), device)
    except ConfigError as err:
        raise _Refused(err) from None
    if adapter is not None:
        from ..model.adapters import check_adapters

        try:  # a shape that does not fit: one line, before peft's traceback; another base: a warning
            warning = check_adapters([str(adapter)], pipe.vision_language_encoder, source.adapter_base())[0]
        except ValueError as err:
            raise _Refused(err) from None
        if warning:
            print(warning, file=sys.stderr)
        pipe.vision_language_encoder.load_adapter(str(adapter))  # LoRA layers on top, base weights untouched
    pipe.to(device)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _render(pipe, args, settings: dict, earlier: list[Path]) -> None:
    """Prompt i with seed ``--seed`` + i to ``OUT/00i.png``, then ``OUT/index.jsonl``."""
    import torch

    out = Path(args.out)
    for path in earlier:  # --overwrite: the earlier render goes, so index.jsonl describes the files present
        path.unlink()
    out.mkdir(parents=True, exist_ok=True)
    index = []
    for i, prompt in enumerate(args.prompt):
        generator = torch.Generator().manual_seed(args.seed + i)
        image = pipe(prompt, generator=generator, **settings).images[0]
        path = out / f"{i:03d}.png"
        image.save(path)
        index.append({"file": path.name, "prompt": prompt, "seed": args.seed + i, **settings})
        print(path)
    meta = {"model": args.model, "revision": args.revision, "adapter": args.adapter}
    (out / INDEX).write_text("".join(json.dumps({**row, **meta}) + "\n" for row in index), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        earlier = _check_out_and_size(args)
        source, adapter = _resolve(args)
        settings, taken = _settings(args, source.path)
        _check_prompts(args, source.path, settings)
        if taken:  # say what the model's defaults came to: 1024x1024 at 50 steps takes a while on a CPU
            print(
                f"glm-grpo render: {settings['width']}x{settings['height']}, {settings['num_inference_steps']} steps, "
                f"guidance {settings['guidance_scale']} ({', '.join(taken)} from the model's defaults)",
                file=sys.stderr,
            )
        pipe = _pipeline(args, source, adapter)
    except _Refused as err:
        print(f"glm-grpo render: {err}", file=sys.stderr)
        return 2
    _render(pipe, args, settings, earlier)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
