"""The configs directory a ``random:`` model name stands for (glm_grpo_ds/model/random_weights.py), written when a
command starts: every component's config, the processor and the scheduler, no weights.

    from glm_grpo_ds.testing.random_model import materialize
    materialize("random:glm-image")     # the directory; written once (~1 s), then reused

The commands that take a model (train, estimate-memory, render; profile bench, decode-timing, dit-timing) call
:func:`materialize` before they resolve the name; the loaders below them build the weights. The components are made
on the ``meta`` device by ``glm-grpo tiny-model``'s own builders (glm_grpo_ds/testing/slice.py for ``glm-image``,
glm_grpo_ds/testing/tiny.py for ``tiny``), so the configs are exactly those of the pipelines it writes.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from ..model.glm_image import AR_DIR
from ..model.random_weights import FORMAT, MARKER, is_random
from ..model.source import ModelSourceError, random_spec


def _components(spec) -> dict:
    with torch.device("meta"):
        if spec.kind == "glm-image":
            from .slice import build_slice_components

            # at its full size the real vision tower too (run for image-to-image only, but held in memory: 1.1 B
            # parameters); a slice's has one layer
            return build_slice_components(spec.ar_layers, spec.dit_layers, vision_layers=spec.vision_layers)
        from .tiny import build_tiny_components

        parts = build_tiny_components()
    parts[AR_DIR].config.text_config.num_hidden_layers = spec.ar_layers
    parts["transformer"].register_to_config(num_layers=spec.dit_layers)
    return parts


def _write(spec, out: Path) -> None:
    from diffusers import GlmImagePipeline

    parts = _components(spec)
    GlmImagePipeline(**parts).save_config(out)  # model_index.json: the component classes
    for name in (AR_DIR, "text_encoder"):  # transformers: the config alone
        parts[name].config.save_pretrained(out / name)
    for name in ("transformer", "vae"):  # diffusers
        parts[name].save_config(out / name)
    parts[AR_DIR].generation_config.save_pretrained(out / AR_DIR)
    for name in ("processor", "tokenizer", "scheduler"):
        parts[name].save_pretrained(out / name)
    (out / MARKER).write_text(json.dumps(spec.record(), indent=1) + "\n", encoding="utf-8")


def _format(marker: Path) -> int | None:
    try:
        return json.loads(marker.read_text(encoding="utf-8")).get("format")
    except (OSError, ValueError):  # absent, or cut while written
        return None


def _private(root: Path, flag: str, name: str) -> None:
    """The per-user folder of ``random:`` configs (under the shared TMPDIR, at a name anyone can predict) is made this
    user's alone: another user who made it first could give the model other shapes, or name another class to load, in
    ``model_index.json``. Refused (one line) when it belongs to someone else or is a link; closed (0700) when ours."""
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = root.lstat()
    if root.is_symlink() or (hasattr(os, "getuid") and st.st_uid != os.getuid()):
        raise ModelSourceError(
            f"{flag}={name}: {root} is a link or another user's (uid {st.st_uid}): its configs could be anyone's; "
            "remove it, or set TMPDIR to a directory of your own"
        )
    if st.st_mode & 0o077:
        root.chmod(0o700)  # ours, made open to reading by an earlier version


def materialize(name: str, flag: str = "model.path") -> str:
    """``name`` unchanged unless it is a ``random:`` name; then its configs directory is made sure of (written in a
    directory of its own and renamed into place, so ranks and processes starting together never read half of it)
    and ``name`` is returned for the resolver to find it. A bad name: ``random_spec``'s one line naming ``flag``."""
    if not is_random(name):
        return name
    spec = random_spec(name, flag)
    final = spec.directory()
    marker = final / MARKER
    _private(final.parent, flag, name)
    if _format(marker) == FORMAT:
        return name
    tmp = final.parent / f"{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    _write(spec, tmp)
    if final.exists() and _format(marker) != FORMAT:  # left by another version of the package: replaced
        shutil.rmtree(final, ignore_errors=True)
    try:
        os.rename(tmp, final)
    except OSError:  # another process renamed its (identical) copy first
        shutil.rmtree(tmp, ignore_errors=True)
    return name
