"""``glm-grpo evaluate --export KIND DIR``: the sampled images in the layouts the official benchmark scorers read,
so those scorers (which need their own models) run on them unchanged. Every model gets its own folder; the
settings go to ``DIR/export.json``. The layouts, as the scorers' code reads them:

* ``geneval`` (djghosh13/geneval ``evaluation/evaluate_images.py``): ``DIR/<model>/<row:05d>/metadata.jsonl``
  (one JSON object: the prompt row, i.e. the N-th line of GenEval's ``evaluation_metadata.jsonl``) and
  ``samples/<k:05d>.png``, one image per sample;
* ``dpg`` (ELLA's ``dpg_bench/compute_dpg_bench.py``): ``DIR/<model>/<item_id>.png``, the first 4 samples as a
  2x2 grid without padding (tiles of ``--resolution`` = the image size; square images only), named by the
  row's ``item_id`` (the DPG prompt file's stem) or its row number;
* ``longtext`` (X-Omni ``textbench/evaluate_text_reward.py``): ``DIR/<model>/<prompt_id:04d>_<k>.png``, k from 1,
  one flat folder per model (and per language: use one prompt file per run), ``prompt_id`` from the row;
* ``oneig`` (OneIG-Benchmark ``scripts/``): ``DIR/<category>/<model>/<id:03d>.webp``, the first 4 samples as a
  2x2 grid without padding (``--image_grid 2,2``), the category folder from the row's ``category``
  (OneIG's CSV names such as ``Anime_Stylization`` map to ``anime``).

A row without the field a layout needs is one error naming the field. Each exporter returns the files it wrote,
which the progress store records per batch, so a resumed run re-exports a stored batch whose files are gone
(glm_grpo_ds/evaluation/paired.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import torch

from ..runtime.registries import Registry

# name -> fn(dir, model name, rows of a batch, images [P * K, 3, H, W] in [0, 1], K) -> the files written
EXPORTERS: Registry[Callable] = Registry("export layout")
ONEIG_FOLDERS = {
    "Anime_Stylization": "anime",
    "Portrait": "human",
    "General_Object": "object",
    "Text_Rendering": "text",
    "Knowledge_Reasoning": "reasoning",
    "Multilingualism": "multilingualism",
}


def _pil(images: torch.Tensor) -> list:
    from PIL import Image

    arr = (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    return [Image.fromarray(a, "RGB") for a in arr]


def grid_2x2(images: torch.Tensor):
    """The first four ``[3, H, W]`` images as one 2H x 2W picture, no padding: top-left, top-right, bottom-left,
    bottom-right (the order DPG-Bench and OneIG-Bench crop)."""
    from PIL import Image

    if images.shape[0] < 4:
        raise ValueError(f"a 2x2 grid needs 4 samples per prompt; give --samples-per-prompt 4 (got {images.shape[0]})")
    tiles = _pil(images[:4])
    w, h = tiles[0].size
    canvas = Image.new("RGB", (2 * w, 2 * h))
    for i, tile in enumerate(tiles):
        canvas.paste(tile, ((i % 2) * w, (i // 2) * h))
    return canvas


def _field(row, key: str, layout: str):
    value = row.extra.get(key)
    if value is None:
        why = "its scorer reads it" if layout == "geneval" else "the layout names files by it"
        raise ValueError(f"--export {layout}: prompt row {row.index} has no {key!r} field; {why}")
    return value


def _file_name(row, key: str, layout: str, value) -> str:
    """A row's field ``key`` (its ``value``) as one file or folder name inside the export directory: a field holding a
    path (``/x``, ``../x``, ``a/b``) would write outside it (a third-party prompt file's ``item_id`` could overwrite
    any file)."""
    name = str(value)
    if not name or name in (".", "..") or any(c in name for c in "/\\\0"):
        raise ValueError(
            f"--export {layout}: prompt row {row.index}'s {key!r} is {name!r}, not a plain file name; the layout "
            "names files by it"
        )
    return name


def _dpg_name(row) -> str:
    """A DPG grid's file name: the row's ``item_id`` (the DPG prompt file's stem), else its row number."""
    item = row.extra.get("item_id", row.index)
    return _file_name(row, "item_id", "dpg", _field(row, "item_id", "dpg") if item is None else item)  # None: refused


def _oneig_category(row) -> str:
    return _file_name(row, "category", "oneig", _field(row, "category", "oneig"))


@EXPORTERS.register("geneval")
def _geneval(out: Path, model: str, rows, images: torch.Tensor, k: int) -> list[Path]:
    written = []
    for i, row in enumerate(rows):
        folder = out / model / f"{row.index:05d}"
        (folder / "samples").mkdir(parents=True, exist_ok=True)
        (folder / "metadata.jsonl").write_text(json.dumps({**row.extra, "prompt": row.prompt}) + "\n")
        written.append(folder / "metadata.jsonl")
        for j, img in enumerate(_pil(images[i * k : (i + 1) * k])):
            img.save(folder / "samples" / f"{j:05d}.png")
            written.append(folder / "samples" / f"{j:05d}.png")
    return written


@EXPORTERS.register("dpg")
def _dpg(out: Path, model: str, rows, images: torch.Tensor, k: int) -> list[Path]:
    if images.shape[2] != images.shape[3]:
        raise ValueError(f"--export dpg: DPG-Bench crops square tiles; the images are {tuple(images.shape[2:])}")
    (out / model).mkdir(parents=True, exist_ok=True)
    written = []
    for i, row in enumerate(rows):
        written.append(out / model / f"{_dpg_name(row)}.png")
        grid_2x2(images[i * k : (i + 1) * k]).save(written[-1])
    return written


@EXPORTERS.register("longtext")
def _longtext(out: Path, model: str, rows, images: torch.Tensor, k: int) -> list[Path]:
    (out / model).mkdir(parents=True, exist_ok=True)
    written = []
    for i, row in enumerate(rows):
        prompt_id = int(_field(row, "prompt_id", "longtext"))
        for j, img in enumerate(_pil(images[i * k : (i + 1) * k])):
            written.append(out / model / f"{prompt_id:04d}_{j + 1}.png")
            img.save(written[-1])
    return written


@EXPORTERS.register("oneig")
def _oneig(out: Path, model: str, rows, images: torch.Tensor, k: int) -> list[Path]:
    written = []
    for i, row in enumerate(rows):
        category = _oneig_category(row)
        folder = out / ONEIG_FOLDERS.get(category, category) / model
        folder.mkdir(parents=True, exist_ok=True)
        written.append(folder / f"{int(_field(row, 'id', 'oneig')):03d}.webp")
        grid_2x2(images[i * k : (i + 1) * k]).save(written[-1])
    return written


def check_rows(layout: str, rows, samples_per_prompt: int, size: tuple[int, int]) -> None:
    """Refuse before sampling what the layout cannot write (one line naming the field or option)."""
    EXPORTERS.get(layout)
    # geneval: its scorer reads each metadata.jsonl's tag and include (a row without them was written, then unscorable)
    needs = {"geneval": ["tag", "include"], "longtext": ["prompt_id"], "oneig": ["category", "id"]}.get(layout, [])
    for row in rows:
        for key in needs:
            _field(row, key, layout)
        if layout == "oneig":
            _oneig_category(row)
        if layout == "dpg":
            _dpg_name(row)
    if layout in ("dpg", "oneig") and samples_per_prompt < 4:
        raise ValueError(f"--export {layout} writes 2x2 grids: give --samples-per-prompt 4 or more")
    if layout == "dpg" and size[0] != size[1]:
        raise ValueError(f"--export dpg: DPG-Bench crops square tiles; set rollout.height = rollout.width (got {size})")
