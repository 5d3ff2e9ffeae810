"""``glm-grpo merge``: fold a trained LoRA adapter into GLM-Image and write a normal pipeline.

    glm-grpo merge --base /models/GLM-Image --adapter outputs/run/final_adapter --out /models/GLM-Image-grpo [--dtype bf16]

``--adapter`` is a peft adapter directory (``adapter_config.json`` + ``adapter_model.safetensors``),
e.g. a run's ``final_adapter/``. The output is a complete ``GlmImagePipeline`` directory: the AR
(``vision_language_encoder/``) with the adapter merged into its weights, every other component
copied unchanged, so ``GlmImagePipeline.from_pretrained(OUT)`` works as for the base model.

Memory: one copy of the base AR in ``--dtype`` plus the adapter (the merge is in place; nothing
else is loaded). The output is written to ``OUT.tmp`` and renamed at the end, so an interrupted
merge never leaves a half-written pipeline at ``OUT``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from .config import MergeConfig
from .policy import DTYPES, check_pipeline_dir, load_ar

AR_DIR = "vision_language_encoder"


def find_adapter(path: str | os.PathLike) -> Path:
    """An adapter directory, given it or a directory that holds one (``final_adapter`` / ``adapter``)."""
    p = Path(path)
    for candidate in (p, p / "adapter", p / "final_adapter"):
        if (candidate / "adapter_config.json").is_file():
            return candidate
    raise FileNotFoundError(f"{p} holds no peft adapter (adapter_config.json); pass a run's final_adapter/ directory")


def merge_adapter(base: str | os.PathLike, adapter: str | os.PathLike, out: str | os.PathLike, dtype: str = MergeConfig.dtype) -> Path:
    from peft import PeftModel

    base = check_pipeline_dir(base)
    adapter_dir = find_adapter(adapter)
    out = Path(out)
    if out.exists():
        raise FileExistsError(f"{out} already exists; choose a new --out directory")
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    model = load_ar(base, DTYPES[dtype])
    merged = PeftModel.from_pretrained(model, adapter_dir).merge_and_unload()
    shutil.copytree(base, tmp, ignore=lambda d, names: [AR_DIR] if Path(d) == base else [])
    merged.save_pretrained(tmp / AR_DIR, safe_serialization=True)
    tmp.rename(out)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="glm-grpo merge", description=__doc__.splitlines()[0])
    p.add_argument("--base", required=True, help="the base GlmImagePipeline directory")
    p.add_argument("--adapter", required=True, help="peft adapter directory (a run's final_adapter/)")
    p.add_argument("--out", required=True, help="new pipeline directory to write")
    p.add_argument("--dtype", choices=["bf16", "fp32"], default=MergeConfig().dtype, help="dtype of the merged AR weights")
    a = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        out = merge_adapter(a.base, a.adapter, a.out, a.dtype)
    except (FileNotFoundError, FileExistsError, ValueError) as err:
        print(f"glm-grpo merge: {err}", file=sys.stderr)
        return 2
    print(f"wrote merged pipeline to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
