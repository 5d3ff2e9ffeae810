"""Read back a W&B offline run (``output_dir/wandb/offline-run-*/``) without the network or wandb's
service, for tests: what was logged, at which step, and the run's config.

The ``run-*.wandb`` file is a LevelDB-style log (32 KiB blocks; each chunk a 7-byte header: CRC,
length, type full/first/middle/last) after a 7-byte file header (``:W&B``, 0xBEE1, version 0); each
record is a ``wandb.proto.wandb_internal_pb2.Record`` protobuf. wandb >= 0.19 dropped its Python
reader (the Go ``wandb-core`` writes and syncs the file), so this is the few lines it takes.

    from glm_grpo_ds.testing.wandb_offline import history, config
    rows = history(next(Path("out/wandb").glob("offline-run-*")))  # [{"_step": 1, "loss": 0.5, ...}]
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

BLOCK = 32768
HEADER = struct.Struct("<IHB")  # crc32, length, chunk type
FILE_HEADER = struct.Struct("<4sHB")
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(run_dir: str | Path, wait_s: float = 60.0) -> list:
    """Every record of the finished run's ``run-*.wandb`` file, in order, once the file holds the run's exit record:
    wandb's service process writes the file, and may still be writing it after ``finish()`` returned or the run's
    process exited (a loaded machine showed a file without its first records). TimeoutError after ``wait_s``."""
    from google.protobuf.message import DecodeError

    deadline = time.monotonic() + wait_s
    while True:
        try:
            found = _read(Path(run_dir))
        except (FileNotFoundError, struct.error, DecodeError):  # not there yet, or cut mid-header or mid-record
            found = []
        if any(record.WhichOneof("record_type") == "exit" for record in found):
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"{run_dir}: no exit record after {wait_s:.0f} s (the run did not finish)")
        time.sleep(0.2)


def _read(run_dir: Path) -> list:
    """The records of ``run-*.wandb`` as the file stands; FileNotFoundError while there is none yet, ValueError for
    two of them or a file that is not W&B's (neither waits)."""
    from wandb.proto import wandb_internal_pb2

    paths = list(run_dir.glob("run-*.wandb"))
    if not paths:
        raise FileNotFoundError(f"{run_dir} holds no run-*.wandb file")
    if len(paths) > 1:
        raise ValueError(f"{run_dir} holds {len(paths)} run-*.wandb files: {sorted(p.name for p in paths)}")
    (path,) = paths
    data = path.read_bytes()
    ident, magic, version = FILE_HEADER.unpack_from(data)
    if (ident, magic, version) != (b":W&B", 0xBEE1, 0):
        raise ValueError(f"{path} is not a W&B run file (header {data[:7]!r})")
    out, pending, pos = [], b"", FILE_HEADER.size
    while pos + HEADER.size <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER.size:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = HEADER.unpack_from(data, pos)
        if kind == 0:  # zero padding up to the end of the block
            pos += left
            continue
        start = pos + HEADER.size
        pending += data[start : start + length]
        pos = start + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
            pending = b""
    return out


def history(run_dir: str | Path) -> list[dict]:
    """One dict per history row: ``_step`` and every logged key (nested values, e.g. an image's
    ``{"_type": "images/separated", "filenames": [...]}``, rebuilt as dicts)."""
    rows = []
    for record in records(run_dir):
        if record.WhichOneof("record_type") != "history":
            continue
        row: dict = {}
        for item in record.history.item:
            keys = list(item.nested_key) or [item.key]
            node = row
            for key in keys[:-1]:
                node = node.setdefault(key, {})
            node[keys[-1]] = json.loads(item.value_json)
        rows.append(row)
    return rows


def config(run_dir: str | Path) -> dict:
    """The run's config: every ``config`` record's updates, merged in order (``_wandb`` left out)."""
    merged = {}
    for record in records(run_dir):
        kind = record.WhichOneof("record_type")
        updates = record.config.update if kind == "config" else record.run.config.update if kind == "run" else []
        merged.update({u.key: json.loads(u.value_json) for u in updates if u.key != "_wandb"})
    return merged


def run_info(run_dir: str | Path) -> dict:
    """The run record's project, display name and id."""
    for record in records(run_dir):
        if record.WhichOneof("record_type") == "run":
            return {"project": record.run.project, "name": record.run.display_name, "id": record.run.run_id}
    raise ValueError(f"{run_dir} holds no run record")
