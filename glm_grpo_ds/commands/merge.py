"""``glm-grpo merge``: fold a trained LoRA adapter into GLM-Image and write a normal pipeline.

    glm-grpo merge --base zai-org/GLM-Image --adapter outputs/run/final_adapter \
        --out /models/GLM-Image-grpo [--revision SHA] [--dtype bf16|fp32|fp16]

``--adapter`` is a peft adapter directory (``adapter_config.json`` + ``adapter_model.safetensors``),
e.g. a run's ``final_adapter/``, or a checkpoint directory (``output_dir/checkpoints/step_N``): its
exported ``adapter/`` is used, and without one the trainable parameters are consolidated from the
checkpoint's ZeRO shards - which is also how full fine-tuning checkpoints become a pipeline; a full
fine-tuning run's ``final_model/`` (the AR itself) takes the base AR's place as it is. The
output is a complete ``GlmImagePipeline`` directory: the AR (``vision_language_encoder/``) with the
adapter merged into its weights, every other component copied unchanged, so
``GlmImagePipeline.from_pretrained(OUT)`` works as for the base model. ``--base`` is a pipeline
directory or a Hub id (glm_grpo_ds/model/source.py: read from the Hugging Face cache, downloaded once
unless HF_HUB_OFFLINE=1). The merged AR is written in bf16 by default, the dtype GLM-Image is released
and trained in (fp32 doubles its size; the merge itself is computed in fp32 either way).

Memory: one fp32 copy of the base AR (~41 GB at GLM-Image's size) plus the adapter (the merge is in place;
nothing else is loaded). Cast to bf16, an adapter's change much smaller than bf16's spacing of the base weights
rounds away: the merge measures the share it keeps and says so below 90 % (``--dtype fp32`` keeps it all).
The output is written to ``OUT.tmp`` and renamed at the end, so an interrupted merge never leaves a half-written
pipeline at ``OUT``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from ..lifecycle.disk_space import free_bytes, size_text, tree_bytes
from ..model.adapters import check_adapters, find_adapter
from ..model.glm_image import AR_DIR, DTYPES, read_ar_config
from ..model.policy import is_ar_dir, load_ar
from ..model.source import resolve_model
from ..rollout.merged_lora import kept_fraction, lora_delta, lora_layers
from ..runtime.file_modes import follow_umask
from ..sharing.merged_card import write_merged_card
from .cli import parser_for


@dataclass
class MergeConfig:
    """``glm-grpo merge``: LoRA adapter -> merged GlmImagePipeline."""

    dtype: str = "bf16"  # dtype of the merged AR weights: bf16 | fp32 | fp16


KEPT_WARNING = 0.9  # below this share of the adapter's change kept by the cast, the merge says so


def _from_checkpoint(model, ckpt: Path, state: dict):
    """The AR with a checkpoint's trainable parameters consolidated from its ZeRO shards."""
    from ..ds import io as ds_io

    weights = ds_io.consolidated_state_dict(ckpt)
    if state["lora"]:
        from peft import get_peft_model

        from ..config import LoraConfig
        from ..model.adapters import peft_lora_config

        model = get_peft_model(model, peft_lora_config(LoraConfig(**state["config"]["lora"])))
    params = dict(model.named_parameters())
    missing = [k for k in weights if k not in params]
    if missing:
        raise ValueError(
            f"{ckpt}: {len(missing)} checkpoint parameters do not exist in the base model (e.g. {missing[0]})"
        )
    wrong = [k for k in weights if weights[k].shape != params[k].shape]
    if wrong:  # torch's own error: a traceback listing every size mismatch
        key = wrong[0]
        raise ValueError(
            f"{ckpt} does not fit --base: its {key} has shape {list(weights[key].shape)}, the base's "
            f"{list(params[key].shape)} ({len(wrong)} such); give the base model the run trained"
        )
    model.load_state_dict(weights, strict=False)
    return model


def _checked_source(src: Path) -> tuple[Path, dict | None, bool]:
    """``(what to merge, the trainer state of a checkpoint whose shards are read, whether it is a full fine-tuning's
    AR)``: a run folder of a full fine-tuning means its ``final_model/``; a checkpoint with its adapter export is
    merged as an adapter (no state), one without must be whole (its shards are read after the base model loads)."""
    from ..lifecycle import checkpoint, checkpoint_files

    if not (src / "adapter_config.json").is_file() and is_ar_dir(src / "final_model"):
        src = src / "final_model"
    is_checkpoint = (src / "trainer_state.json").is_file() and (src / "ds").is_dir()
    if is_checkpoint and not (src / "adapter" / "adapter_config.json").is_file():
        state = checkpoint.read_state(src)
        problem = checkpoint_files.damage(src, *checkpoint.written_on(state))
        if problem:
            raise ValueError(f"{src} is damaged: {problem}; copy it again from where it came")
        return src, state, False
    return src, None, is_ar_dir(src)


def _check_same_shape(ar_dir: Path, base: Path) -> None:
    """A full fine-tuning's AR in place of another base's: refused when their vocabularies or widths differ (the
    merge wrote a pipeline whose processor gave ids past the AR's embedding: IndexError at its first image)."""
    mine, theirs = json.loads((ar_dir / "config.json").read_text(encoding="utf-8")), read_ar_config(base)
    for section, key in (
        ("text_config", "vocab_size"),
        ("text_config", "hidden_size"),
        ("vq_config", "num_embeddings"),
    ):
        a, b = mine.get(section, {}).get(key), theirs.get(section, {}).get(key)
        if a != b:
            raise ValueError(
                f"{ar_dir} does not fit --base {base}: its {section}.{key} is {a}, the base's {b}; give the base "
                "model the run trained"
            )


def _out_room(out: Path, base: Path, ar_source: Path, dtype: str) -> Path:
    """``OUT.tmp`` created (an interrupted merge's removed first), with room for the merged pipeline: every base
    component but the AR copied, the AR at ``dtype``. Checked before the ~41 GB model loads: an output that could not
    be written failed after the merge with a traceback, leaving a partial ``OUT.tmp`` on a full disk."""
    if out.exists():
        raise FileExistsError(f"{out} already exists; choose a new --out directory")
    if out.resolve().is_relative_to(base.resolve()):  # the copy of the base would copy itself, again and again
        raise ValueError(f"--out {out} is inside --base {base}; choose an --out outside the base model's folder")
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():  # an interrupted merge's (a pipeline directory, or empty), else someone else's: left alone
        if not tmp.is_dir() or not ((tmp / "model_index.json").is_file() or not any(tmp.iterdir())):
            raise FileExistsError(f"{tmp} exists and is not an earlier merge's; move it away or choose another --out")
        shutil.rmtree(tmp)
    try:
        tmp.mkdir(parents=True)
    except OSError as err:
        raise ValueError(
            f"--out {out} cannot be written ({err.strerror}: {err.filename}); choose another --out"
        ) from None
    need = tree_bytes(base) - tree_bytes(base / AR_DIR) + _numel(ar_source) * DTYPES[dtype].itemsize
    free = free_bytes(tmp)
    if free < need:
        tmp.rmdir()
        raise ValueError(
            f"--out {out}: the merged pipeline needs ~{size_text(need)} and its file system has {size_text(free)} "
            "free; free space there or choose another --out"
        )
    return tmp


def _numel(folder: Path) -> int:
    """The number of weights in ``folder``'s safetensors files (their headers only)."""
    from safetensors import safe_open

    total = 0
    for file in folder.glob("*.safetensors"):
        with safe_open(str(file), framework="pt") as f:
            total += sum(math.prod(f.get_slice(key).get_shape()) for key in f.keys())
    return total


def merge_adapter(
    base: str | os.PathLike,
    adapter: str | os.PathLike,
    out: str | os.PathLike,
    dtype: str = MergeConfig.dtype,
    revision: str | None = None,
) -> Path:
    source = resolve_model(str(base), revision, flag="--base", revision_flag="--revision")
    base = source.path
    src, state, full_model = _checked_source(Path(adapter))
    adapter_dir = None if state or full_model else find_adapter(src)  # none: a checkpoint's shards or an AR
    if full_model:
        _check_same_shape(src, base)
    out = Path(out)
    tmp = _out_room(out, base, src if full_model else base / AR_DIR, dtype)
    try:
        merged = _merged(src, base, source, adapter_dir, state, full_model, dtype)
        shutil.copytree(base, tmp, ignore=lambda d, names: [AR_DIR] if Path(d) == base else [], dirs_exist_ok=True)
        merged.save_pretrained(tmp / AR_DIR, safe_serialization=True)
        follow_umask(tmp / AR_DIR)  # safetensors writes 0600; the copied components keep the base's modes
        write_merged_card(tmp, base, src, dtype, out)  # README.md: base, adapter, its card's results, dtype
    except BaseException:  # a refusal, a write that failed, Ctrl-C: nothing half-written is left
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    tmp.rename(out)
    return out


def _merged(src: Path, base: Path, source, adapter_dir: Path | None, state, full_model: bool, dtype: str):
    """The AR to write: the base with the adapter (or the checkpoint's trainable parameters) merged in fp32, or a full
    fine-tuning's AR, cast to ``dtype``."""
    from peft import PeftModel

    # consolidate / merge in fp32, then cast: merging in bf16 would round the base weights twice
    model = load_ar(src if full_model else base, DTYPES["fp32"])
    if adapter_dir is not None:
        # a shape that does not fit: one line before peft's traceback; another base: a warning (merging an
        # adapter into the wrong base of the same shapes is allowed, but said)
        warning = check_adapters([str(adapter_dir)], model, source.adapter_base(), "the adapter")[0]
        if warning:
            print(warning, file=sys.stderr)
        model = PeftModel.from_pretrained(model, adapter_dir)
    elif state is not None:
        model = _from_checkpoint(model, src, state)  # a LoRA checkpoint's adapter on the AR, or a full FT's AR
    if hasattr(model, "merge_and_unload"):
        # the share of the adapter's change the cast keeps (at GLM-Image's widths and lr 1e-5, bf16 kept 4 % after 1
        # step and 28 % after 40: benchmarks/merge_drift.py)
        pairs = ((w.to(DTYPES[dtype]), lora_delta(m)) for _, m, w in lora_layers(model))
        share = kept_fraction(pairs)[0]
        if share < KEPT_WARNING:
            print(
                f"glm-grpo merge: warning: the {dtype} weights keep {share:.0%} of the adapter's change (the rest "
                f"rounds away at {dtype}'s spacing of the base weights): --dtype fp32 keeps all of it (twice the "
                "size), or sample the adapter unmerged (glm-grpo render --adapter)",
                file=sys.stderr,
            )
        model = model.merge_and_unload()
    return model.to(DTYPES[dtype])


def main(argv: list[str] | None = None) -> int:
    p = parser_for("merge")
    p.add_argument("--base", required=True, help="the base GlmImagePipeline: a directory or a Hub id (org/name)")
    p.add_argument("--revision", default=None, help="Hub revision of --base (commit, branch or tag; default main)")
    p.add_argument(
        "--adapter",
        required=True,
        help="a run's final_adapter/ (a peft adapter), a checkpoint directory, or a full fine-tuning's final_model/",
    )
    p.add_argument("--out", required=True, help="new pipeline directory to write")
    p.add_argument(
        "--dtype", choices=sorted(DTYPES), default=MergeConfig().dtype, help="dtype of the merged AR weights"
    )
    a = p.parse_args(argv)
    try:
        out = merge_adapter(a.base, a.adapter, a.out, a.dtype, a.revision)
    except (FileNotFoundError, FileExistsError, ValueError) as err:
        print(f"glm-grpo merge: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a write that failed past the checks (another job filled the disk, a quota)
        print(f"glm-grpo merge: writing {a.out} failed ({err}); nothing was left there", file=sys.stderr)
        return 1
    print(f"wrote merged pipeline to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
