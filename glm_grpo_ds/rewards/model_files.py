"""A reward's model files and libraries, checked before any model loads: each reward class may have a
``check_args(args)`` (static) that raises :class:`RewardError` in one line naming the argument, what is wrong and
how to get it (``hf download ...``, the download address, the pip extra). The registry calls it when a run checks
its rewards (``check_reward_specs``: every rank, before the process group) and before it builds one
(``build_reward``: ``glm-grpo score`` and the other tools).

    check_transformers_model("clip_model", "/models/clip-vit-large-patch14", "aesthetic", CLIP_L14)
    check_file("head", "/models/sac+logos+ava1-l14-linearMSE.pth", "aesthetic", AESTHETIC_HEAD_URL)
    check_installed("ocr", "rapidocr_onnxruntime", "rapidfuzz", extra="ocr")
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from .base import RewardError

CLIP_L14 = "openai/clip-vit-large-patch14"  # the CLIP the LAION aesthetic head was trained on
AESTHETIC_HEAD_URL = (
    "https://github.com/christophschuhmann/improved-aesthetic-predictor/raw/main/sac+logos+ava1-l14-linearMSE.pth"
)
HOW_TO_SET = "(config: rewards: [{{name: {reward}, args: {{{arg}: ...}}}}]; glm-grpo score: --reward-arg {arg}=...)"


def _looks_like_path(value: str) -> bool:
    """A filesystem path rather than a Hub id: absolute, relative with ./ or ~, or more than one slash."""
    return value.startswith(("/", "./", "../", "~")) or value.count("/") != 1 or Path(value).exists()


def check_transformers_model(arg: str, value, reward: str, example_id: str, key: str | None = None) -> None:
    """``value`` is a local transformers checkpoint directory (``config.json`` in it) or a Hub id, which
    ``from_pretrained`` downloads into the Hugging Face cache (offline: it must be there already). ``key``: the
    config key the messages name instead of the reward's ``arg`` (a model outside ``rewards``)."""
    how = HOW_TO_SET.format(reward=reward, arg=arg)
    named, arg = (f"reward {reward}: {arg}", arg) if key is None else (key, key)
    if not value:
        raise RewardError(
            f"reward {reward} needs args {arg}: a local checkpoint directory or a Hub id such as {example_id} {how}"
        )
    value = str(value)
    if _looks_like_path(value):
        path = Path(value).expanduser()
        if not path.exists():
            raise RewardError(
                f"{named} {value} does not exist; get it with `hf download {example_id} --local-dir "
                f"{value}` (or the checkpoint you mean), or give the Hub id: {arg}: {example_id}"
            )
        if not (path / "config.json").is_file():
            raise RewardError(
                f"{named} {value} is not a transformers checkpoint directory (no config.json in it); "
                f"give the directory `hf download {example_id} --local-dir DIR` writes, or the Hub id {example_id}"
            )
        return
    from huggingface_hub import constants, try_to_load_from_cache

    if constants.is_offline_mode():  # what from_pretrained follows (read once, at import, from HF_HUB_OFFLINE)
        if not isinstance(try_to_load_from_cache(value, "config.json"), str):
            raise RewardError(
                f"{named} {value} is not in the Hugging Face cache and HF_HUB_OFFLINE=1 forbids "
                f"downloading it; run `hf download {value}` where the Hub is reachable (same HF_HOME), or give a local "
                "directory"
            )


def check_file(arg: str, value, reward: str, url: str) -> None:
    """``value`` is an existing file (a state dict the reward reads with torch / safetensors)."""
    how = HOW_TO_SET.format(reward=reward, arg=arg)
    name = url.rsplit("/", 1)[-1]
    if not value:
        raise RewardError(f"reward {reward} needs args {arg}: the path of {name} {how}")
    path = Path(str(value)).expanduser()
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "does not exist"
        raise RewardError(f"reward {reward}: {arg} {value} {what}; get it with `wget -O {value} {url}`")


def check_installed(reward: str, *modules: str, extra: str) -> None:
    """Every module of ``modules`` can be imported (found, not imported: cheap)."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise RewardError(
            f"reward {reward} needs {', '.join(missing)}, which is not installed: pip install 'glm-grpo-ds[{extra}]'"
        )
