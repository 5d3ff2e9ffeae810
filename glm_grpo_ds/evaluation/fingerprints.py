"""Content fingerprints for ``glm-grpo evaluate``'s resume check: a rerun into the same ``--out`` must not mix
batches sampled from other prompts or another adapter with new ones, and paths alone do not say that (a prompt
file edited in place, an adapter retrained into the same directory).

* :func:`rows_sha256`: the prompt rows the evaluation reads, as read (prompt, texts, extra fields, and the
  bytes of each target image, a file or an image stored in the dataset). Hashing the rows rather than the
  source's files covers every source alike (a file, a dataset directory, a Hub snapshot, the split chosen) and
  only the rows used (``--num-prompts``).
* :func:`adapter_sha256`: an adapter's ``adapter_config.json`` and weights file, or a full fine-tuning's AR's
  ``config.json`` and weight files (hashing GLM-Image's ~20 GB takes a minute or so, once per evaluation).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

CHUNK = 1 << 20
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def _stable(value):
    """``value`` as JSON-serialisable data that depends on its content only (never on an object's address)."""
    from ..data import DatasetImage

    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, DatasetImage):
        return {"image_sha256": hashlib.sha256(value.data).hexdigest()}
    if isinstance(value, (bytes, bytearray)):
        return {"bytes_sha256": hashlib.sha256(value).hexdigest()}
    if isinstance(value, dict):
        return {str(k): _stable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_stable(v) for v in value]
    if hasattr(value, "tobytes"):  # a decoded image (PIL) or array (numpy) from a datasets feature
        shape = getattr(value, "shape", None) or getattr(value, "size", None)
        return {type(value).__name__: hashlib.sha256(value.tobytes()).hexdigest(), "shape": str(shape)}
    return f"{type(value).__name__}:{value}"  # dates, decimals, ...: their text is their content


def rows_sha256(rows) -> str:
    """One digest of the rows' content, in order."""
    h = hashlib.sha256()
    targets: dict[str, str] = {}  # rows often share a target image: hash each file once
    for row in rows:
        target = row.target_image
        if isinstance(target, str):
            if target not in targets:
                targets[target] = file_sha256(target)
            target = targets[target]
        record = {"prompt": row.prompt, "target": _stable(target), "text": _stable(row.text)}
        record["extra"] = _stable(row.extra)
        h.update(json.dumps(record, sort_keys=True).encode())
        h.update(b"\n")
    return h.hexdigest()


def adapter_sha256(adapter_dir: str | Path) -> str:
    """One digest of an adapter directory's config and weights (the files peft loads), or of a full fine-tuning's
    AR directory's (its config, its weight files and their index)."""
    folder = Path(adapter_dir)
    files = [folder / name for name in ADAPTER_FILES if (folder / name).is_file()]
    if not files:
        files = [folder / "config.json", *sorted(folder.glob("*.safetensors")), *sorted(folder.glob("*.index.json"))]
    h = hashlib.sha256()
    for path in files:
        if path.is_file():
            h.update(f"{path.name}:{file_sha256(path)}\n".encode())
    return h.hexdigest()
