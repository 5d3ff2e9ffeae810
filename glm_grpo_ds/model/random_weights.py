"""GLM-Image with random weights, built in the process on the device: ``model.path=random:glm-image``.

    model.path=random:glm-image                           GLM-Image at its full real size (AR 40 + DiT 30 layers)
    model.path=random:glm-image,ar_layers=8,dit_layers=2  the real widths with fewer layers (a 1-layer vision tower)
    model.path=random:tiny                                the embedded tiny test model's sizes (a CPU runs it)
    model.path=random:glm-image,seed=3                    other random weights (default seed 0)

What it is for: a cluster's memory and time per step measured before 35 GB are downloaded, and one GPU lease spent
on measuring instead of writing and reading the 34 GB a saved full-size model takes (``launch/gpu_timing.sh``).
The weights are noise: images, rewards and learning mean nothing; every output of such a run says so.

How. A ``random:`` name stands for a *configs-only* pipeline directory (every component's config, the processor and
its tokenizer, the scheduler; ~6 MB, no weights) in the temporary directory, written once per name by
glm_grpo_ds/testing/random_model.py when a command starts (the configs come from the same builders as
``glm-grpo tiny-model``), and marked by :data:`MARKER`. Everything that reads configs (the memory planner, the
processor, the sampling defaults, the token checks) reads that directory as it reads a real pipeline; the three
loaders of weights (:func:`glm_grpo_ds.model.policy.load_ar`, the decoder's components, ``glm-grpo render``) see the
marker and build the module from its config instead, on the device it will run on, seeded per component: the same
name and seed give the same weights on the same kind of device (on a GPU they come from its generator, so they
differ from a CPU build's). A 17 B-parameter GLM-Image initialises in about a second on an H200 (docs/real-width.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

PREFIX = "random:"
MARKER = "random_weights.json"  # in the configs directory: what was asked for (RandomSpec.record)
FORMAT = 2  # of the configs directory; a directory of another format is written again (2: the real vision tower)
KINDS = {"glm-image": (40, 30), "tiny": (2, 2)}  # name -> (AR layers, DiT layers) by default
REAL_VISION_LAYERS = 40  # GLM-Image's vision tower (image-to-image only: its 1.1 B weights held, never run here)
# each weighted component's seed offset from the spec's seed (as glm-grpo tiny-model's builders draw them)
SEED_OFFSET = {"vision_language_encoder": 0, "text_encoder": 1, "transformer": 2, "vae": 3}
_OPTION = re.compile(r"(ar_layers|dit_layers|seed)=(\d+)")


@dataclass(frozen=True)
class RandomSpec:
    """A parsed ``random:`` model name."""

    kind: str  # a KINDS key
    ar_layers: int
    dit_layers: int
    seed: int = 0

    @property
    def vision_layers(self) -> int:
        """The vision tower's layers: the real 40 at GLM-Image's full size (``ar_layers`` 40), one in a slice."""
        full = self.kind == "glm-image" and self.ar_layers == KINDS["glm-image"][0]
        return REAL_VISION_LAYERS if full else 1

    @property
    def name(self) -> str:
        """The canonical name: every option spelled out (what config.json and the cards record)."""
        return f"{PREFIX}{self.kind},ar_layers={self.ar_layers},dit_layers={self.dit_layers},seed={self.seed}"

    def record(self) -> dict:
        return {"format": FORMAT, "name": self.name, "kind": self.kind, "ar_layers": self.ar_layers,
                "dit_layers": self.dit_layers, "seed": self.seed}  # fmt: skip

    def directory(self) -> Path:
        """Where its configs live: one directory per name (the marker holds the seed the loaders build from), per
        user, under the temporary directory (TMPDIR)."""
        user = os.getuid() if hasattr(os, "getuid") else "user"
        root = Path(tempfile.gettempdir()) / f"glm-grpo-random-{user}"
        return root / f"{self.kind}-ar{self.ar_layers}-dit{self.dit_layers}-seed{self.seed}"


def is_random(name) -> bool:
    return str(name or "").startswith(PREFIX)


def parse(name: str, flag: str = "model.path") -> RandomSpec:
    """``random:KIND[,ar_layers=N][,dit_layers=M][,seed=S]`` -> :class:`RandomSpec`; ValueError naming ``flag`` and
    the accepted form otherwise."""
    form = f"{PREFIX}glm-image (or {PREFIX}tiny), optionally ,ar_layers=N,dit_layers=M,seed=S"
    kind, *options = str(name)[len(PREFIX) :].split(",")
    if kind not in KINDS:
        raise ValueError(f"{flag}={name}: unknown random model {kind!r}; give {form}")
    ar_layers, dit_layers = KINDS[kind]
    values = {"ar_layers": ar_layers, "dit_layers": dit_layers, "seed": 0}
    for option in options:
        match = _OPTION.fullmatch(option.strip())
        if match is None:
            raise ValueError(f"{flag}={name}: cannot read {option!r}; give {form}")
        values[match.group(1)] = int(match.group(2))
    if values["ar_layers"] < 1 or values["dit_layers"] < 1:
        raise ValueError(f"{flag}={name}: ar_layers and dit_layers must be at least 1; give {form}")
    return RandomSpec(kind, **values)


def spec_of(root: str | os.PathLike) -> RandomSpec | None:
    """The spec a configs directory was written for (and its seed), None for a pipeline with weights."""
    marker = Path(root) / MARKER
    if not marker.is_file():
        return None
    r = json.loads(marker.read_text(encoding="utf-8"))
    return RandomSpec(r["kind"], r["ar_layers"], r["dit_layers"], r["seed"])


def default_device() -> torch.device:
    """Where a random build initialises by default: this process's GPU when there is one (a CPU takes minutes for the
    full size), else the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


@contextlib.contextmanager
def _seeded(seed: int, device: torch.device, dtype: torch.dtype | None = None):
    """The block's modules created on ``device`` (in ``dtype`` as the default), from ``seed``, leaving the caller's
    random streams as they were (the trainer's own draws do not depend on how a model was made)."""
    devices = [device] if device.type == "cuda" else []
    old = torch.get_default_dtype()
    with torch.random.fork_rng(devices=devices), torch.device(device):
        torch.manual_seed(seed)
        if dtype is not None and dtype.is_floating_point:
            torch.set_default_dtype(dtype)
        try:
            yield
        finally:
            torch.set_default_dtype(old)


def build_ar(root: Path, spec: RandomSpec, dtype: torch.dtype, attn_implementation: str, device=None):
    """The AR of the configs directory ``root`` with random weights (eval mode). Under a live ZeRO-3 config
    transformers' ``_from_config`` partitions it as it builds, like ``from_pretrained``."""
    from transformers import GenerationConfig, GlmImageConfig, GlmImageForConditionalGeneration

    from .glm_image import AR_DIR

    config = GlmImageConfig.from_pretrained(root / AR_DIR)
    with _seeded(spec.seed + SEED_OFFSET[AR_DIR], torch.device(device or default_device())):
        model = GlmImageForConditionalGeneration._from_config(
            config, dtype=dtype, attn_implementation=attn_implementation
        )
    model.generation_config = GenerationConfig.from_pretrained(root / AR_DIR)
    return model.eval()


def build_component(root: Path, spec: RandomSpec, name: str, library: str, class_name: str, dtype: torch.dtype, device):
    """One of the DiT, the VAE and the glyph encoder (``model_index.json``'s ``library`` / ``class_name``) of the
    configs directory ``root`` (written for ``spec``), with random weights, created on ``device`` in ``dtype``."""
    import importlib

    cls = getattr(importlib.import_module(library), class_name)
    with _seeded(spec.seed + SEED_OFFSET[name], torch.device(device), dtype):
        if library == "transformers":
            from transformers import AutoConfig

            module = cls._from_config(AutoConfig.from_pretrained(root / name), dtype=dtype)
        else:
            module = cls.from_config(cls.load_config(root / name))
    return module.to(dtype).eval()
