"""A Hugging Face hub cache entry written offline from a local directory, so tests exercise Hub ids
(``model.path=org/name``) with no network::

    from glm_grpo_ds.testing.hub_cache import write_hub_cache
    snapshot = write_hub_cache(tiny_dir, cache_root, "org/name", refs=("main", "v1"))
    # HF_HUB_CACHE=cache_root HF_HUB_OFFLINE=1 glm-grpo render --model org/name ...

The layout is huggingface_hub's own (``models--org--name/blobs/<sha256>``,
``snapshots/<commit>/<file>`` as relative symlinks to the blobs, ``refs/<name>`` holding the commit), so
``snapshot_download(..., local_files_only=True)`` and ``scan_cache_dir`` read it as a downloaded repo.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def repo_folder(cache_root: str | os.PathLike, repo_id: str) -> Path:
    """``<cache>/models--org--name`` (huggingface_hub's ``repo_folder_name``)."""
    return Path(cache_root) / ("models--" + repo_id.replace("/", "--"))


def write_hub_cache(
    src: str | os.PathLike,
    cache_root: str | os.PathLike,
    repo_id: str,
    commit: str | None = None,
    refs: tuple[str, ...] = ("main",),
) -> Path:
    """Store the files of ``src`` as commit ``commit`` of ``repo_id`` (default: a sha1 of their contents)
    and point each of ``refs`` (branches / tags) at it; return the snapshot directory."""
    src = Path(src)
    files = sorted(p for p in src.rglob("*") if p.is_file())
    if commit is None:
        h = hashlib.sha1()
        for p in files:
            h.update(str(p.relative_to(src)).encode() + b"\0" + p.read_bytes())
        commit = h.hexdigest()
    repo = repo_folder(cache_root, repo_id)
    snapshot = repo / "snapshots" / commit
    for p in files:
        data = p.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        if not blob.exists():
            blob.parent.mkdir(parents=True, exist_ok=True)
            blob.write_bytes(data)
        link = snapshot / p.relative_to(src)
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(os.path.relpath(blob, link.parent))
    for ref in refs:
        path = repo / "refs" / ref
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(commit)  # no newline: huggingface_hub reads the file as the commit hash
    return snapshot
