"""The reward-server protocol (version 1): JSON over HTTP, images as base64 PNG.

Shared by the ``remote`` reward (the client, rewards/remote/client.py) and ``glm-grpo reward-server``
(rewards/remote/serving.py); docs/rewards.md#remote-rewards describes it for servers written in other
languages::

    GET  /health -> {"protocol": 1, "reward": "pixel_mse", "version": "0.1.0", "max_batch": 32,
                     "needs": {"field": "target_image", "fix": "..."} or null}
    POST /score  {"images": [PNG, ...], "prompts": [str, ...], "samples": [{...}, ...],
                  "target_images": {KEY: FILE, ...}}
              -> {"rewards": [float or null, ...]}        null = undefined (JSON has no NaN)

PNG and FILE are base64 (standard alphabet, padded). Images are 8-bit RGB PNGs of the [0, 1] float
images rounded to 1/255 (what every saved image is): a remote reward scores exactly
``round(image * 255) / 255``. ``samples[i]`` holds the dataset row's fields (``text``, ``index``, extra
JSONL keys); its ``target_image`` is a key of ``target_images`` (the target file's bytes, sent once
per request whatever the number of samples sharing it) or null. With a token, every request carries
``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import io
import math
from pathlib import Path

import torch

from ...runtime import log

PROTOCOL = 1
# zlib's fastest compressing level (every level is lossless): encoding is the client's main cost.
PNG_COMPRESS_LEVEL = 1


def _png(arr) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(arr, "RGB").save(buf, format="PNG", compress_level=PNG_COMPRESS_LEVEL)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def encode_pngs(images: torch.Tensor) -> list[str]:
    """``[N, 3, H, W]`` float in [0, 1] -> base64 8-bit RGB PNGs (values rounded to 1/255). The
    rounding runs once on the whole batch (per-image tensor ops cost more than small PNG writes).
    One thread: Pillow holds the GIL while it writes a PNG to memory, so threads would not help."""
    return [_png(a) for a in quantize_u8(images).permute(0, 2, 3, 1).contiguous().cpu().numpy()]


def decode_png(data: str) -> torch.Tensor:
    """base64 image (PNG, or another format of data/image_files.READ_FORMATS) -> ``[3, H, W]`` uint8; ValueError if
    unreadable."""
    try:
        raw = base64.b64decode(data, validate=True)
    except ValueError as err:  # binascii.Error is one
        raise _unreadable(err) from None
    return decode_image(raw)


def _unreadable(err: Exception) -> ValueError:
    return ValueError(f"not a base64 image ({type(err).__name__}: {err})")


def _opened(raw: bytes):
    from PIL import UnidentifiedImageError

    from ...data.image_files import open_image

    try:
        return open_image(io.BytesIO(raw))
    except (OSError, UnidentifiedImageError) as err:
        raise _unreadable(err) from None


def image_size(raw: bytes) -> tuple[int, int]:
    """``(width, height)`` of an image file's bytes, from its header alone; ValueError if unreadable."""
    with _opened(raw) as img:
        return img.size


def decode_image(raw: bytes) -> torch.Tensor:
    """An image file's bytes -> ``[3, H, W]`` uint8 RGB; ValueError if unreadable."""
    from PIL import UnidentifiedImageError

    try:
        with _opened(raw) as img:
            img = img.convert("RGB")
    except (OSError, UnidentifiedImageError) as err:  # a truncated file fails when decoded, not at its header
        raise _unreadable(err) from None
    from ..targets import rgb_tensor

    return rgb_tensor(img)


def quantize_u8(images: torch.Tensor) -> torch.Tensor:
    """``round(clamp(x, 0, 1) * 255)`` as uint8."""
    return (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8)


def quantize(images: torch.Tensor) -> torch.Tensor:
    """The float images a remote reward sees: ``round(clamp(x, 0, 1) * 255) / 255``."""
    return quantize_u8(images).float() / 255


def file_key(data: bytes) -> str:
    """The key of a target file in a request: its SHA-256 (equal contents share one entry)."""
    return hashlib.sha256(data).hexdigest()


_NOT_JSON = object()


def _as_json(value):
    """``value`` as JSON carries it: NaN / inf -> null (as the rewards), a date or time -> its ISO text, lists and
    string-keyed dicts of those; ``_NOT_JSON`` for what JSON cannot hold (an image, bytes, ...)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, (list, tuple)):
        items = [_as_json(v) for v in value]
        return _NOT_JSON if any(v is _NOT_JSON for v in items) else items
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        items = {k: _as_json(v) for k, v in value.items()}
        return _NOT_JSON if any(v is _NOT_JSON for v in items.values()) else items
    return _NOT_JSON


def _json_fields(sample: dict) -> dict:
    """A row's fields as the request carries them; those JSON cannot hold (a Hub dataset's image column, bytes) are
    left out, said once: the request would not encode otherwise, and every batch would score undefined."""
    out, dropped = {}, []
    for key, value in sample.items():
        value = _as_json(value)
        if value is _NOT_JSON:
            dropped.append(f"{key} ({type(sample[key]).__name__})")
        else:
            out[key] = value
    if dropped:
        log.warning_once(
            "remote-reward:fields",
            f"glm-grpo: warning: remote reward: the prompt rows' fields {', '.join(dropped)} cannot be sent as JSON "
            "and are left out of its requests (a field the server needs: give it as text or a number)",
        )
    return out


def request_body(images: torch.Tensor, prompts: list[str], samples: list[dict], read_file) -> dict:
    """The ``/score`` JSON of a batch; ``read_file(path) -> bytes`` reads a sample's target image."""
    targets: dict[str, str] = {}
    out_samples = []
    for sample in samples:
        path = sample.get("target_image")
        sample = _json_fields({k: v for k, v in sample.items() if k != "target_image"})
        if path:
            data = read_file(path)
            key = file_key(data)
            if key not in targets:
                targets[key] = base64.b64encode(data).decode("ascii")
            sample["target_image"] = key
        else:
            sample["target_image"] = None
        out_samples.append(sample)
    return {
        "images": encode_pngs(images),
        "prompts": list(prompts),
        "samples": out_samples,
        "target_images": targets,
    }


def rewards_to_json(values: torch.Tensor) -> list[float | None]:
    """``[N]`` floats -> JSON list, NaN / inf -> null."""
    return [v if math.isfinite(v) else None for v in values.double().tolist()]


def rewards_from_json(values: list) -> torch.Tensor:
    """JSON list (null = undefined) -> ``[N]`` float32 with NaN; TypeError for anything but a list of numbers and
    nulls (a string's characters are no rewards: "0000" scored four images 0)."""
    if not isinstance(values, list) or any(
        isinstance(v, bool) or not isinstance(v, (int, float, type(None))) for v in values
    ):
        raise TypeError("rewards must be a JSON list of numbers or nulls")
    return torch.tensor([float("nan") if v is None else float(v) for v in values], dtype=torch.float32)


def read_token(path: str, flag: str) -> str:
    """The token in file ``path`` (surrounding whitespace stripped); ValueError naming ``flag``."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ValueError(
            f"{flag} {path} does not exist; write a secret token into it: (umask 077; openssl rand -hex 32 > {path})"
        )
    try:
        token = p.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{flag} {path} cannot be read ({type(err).__name__}: {err})") from None
    if p.stat().st_mode & 0o077:  # as ssh says of a private key: others on the machine (or the NFS home) can read it
        mode = oct(p.stat().st_mode & 0o777)
        log.warning_once(f"token-mode:{p}", f"{flag} {path} is readable by other users ({mode}): chmod 600 it")
    if not token or any(c.isspace() for c in token):
        raise ValueError(f"{flag} {path} must hold one token (no spaces or newlines inside it)")
    return token
