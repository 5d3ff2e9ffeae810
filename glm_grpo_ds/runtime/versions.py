"""The versions of glm-grpo-ds and the libraries whose versions decide how a run behaves, read from the
installed packages' metadata (nothing is imported): ``glm-grpo env`` prints them, the trainer records them
in ``output_dir/config.json`` and the model cards list them (as TRL's cards do).

    from glm_grpo_ds.runtime.versions import framework_versions
    framework_versions()   # {"glm-grpo-ds": "0.1.0", "torch": "2.15.0", ..., "flash-attn": "not installed"}
"""

from __future__ import annotations

import importlib.metadata

# (name shown, distribution names to try)
PACKAGES = (
    ("glm-grpo-ds", ("glm-grpo-ds",)),
    ("torch", ("torch",)),
    ("torchvision", ("torchvision",)),
    ("deepspeed", ("deepspeed",)),
    ("transformers", ("transformers",)),
    ("diffusers", ("diffusers",)),
    ("peft", ("peft",)),
    ("accelerate", ("accelerate",)),
    ("bitsandbytes", ("bitsandbytes",)),
    ("flash-attn", ("flash-attn", "flash_attn")),
    ("huggingface_hub", ("huggingface-hub", "huggingface_hub")),
)
NOT_INSTALLED = "not installed"


def package_version(*dist_names: str) -> str:
    """The installed version of the first of ``dist_names`` found, else ``not installed``."""
    for name in dist_names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return NOT_INSTALLED


def framework_versions() -> dict[str, str]:
    """``{name shown: version}`` for :data:`PACKAGES`."""
    return {shown: package_version(*names) for shown, names in PACKAGES}
