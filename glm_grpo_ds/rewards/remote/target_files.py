"""Where a reward server keeps the target images its requests bring: files a likeness reward opens by path."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path

from .protocol import file_key

# A target file unused this long may be removed past the budget: far longer than a request is scored in.
TARGET_IDLE_S = 600.0


class TargetFiles:
    """The requests' target images as files in ``folder``, one per content (named by its SHA-256, so load_target's
    cache by path serves a repeated target), each file's time refreshed when a request uses it. Past ``budget``
    bytes the least recently used files unused for :data:`TARGET_IDLE_S` are removed (a request in progress has
    used its own moments ago); thread-safe (requests are decoded on a thread pool)."""

    def __init__(self, folder: Path, budget: int):
        self.folder, self.budget, self.bytes = folder, budget, 0
        self._lock = threading.Lock()

    def put(self, raw: bytes) -> str:
        path = self.folder / file_key(raw)
        with self._lock:
            if path.exists():
                os.utime(path)
                return str(path)
            with tempfile.NamedTemporaryFile(dir=self.folder, suffix=".part", delete=False) as tmp:
                tmp.write(raw)
            os.replace(tmp.name, path)
            self.bytes += len(raw)
            if self.bytes > self.budget:
                self._evict()
        return str(path)

    def _evict(self) -> None:
        now = time.time()
        kept = ((f.stat(), f) for f in self.folder.iterdir() if f.suffix != ".part")  # not a write in progress
        files = sorted(kept, key=lambda x: x[0].st_mtime)
        for st, f in files:
            if self.bytes <= self.budget or now - st.st_mtime < TARGET_IDLE_S:
                break
            f.unlink(missing_ok=True)
            self.bytes -= st.st_size
