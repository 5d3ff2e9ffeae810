"""Give files we write the permissions the process's umask asks for.

safetensors writes weight files with mode 0600 (owner only) whatever the umask, so on shared storage a
teammate could read a run's metrics but not its ``final_adapter/adapter_model.safetensors``. The trainer
(glm_grpo_ds/ds/io.py, for final weights and checkpoint adapters) and ``glm-grpo merge`` call
:func:`follow_umask` on what they wrote; tested in tests/unit/test_file_modes.py.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def umask() -> int:
    """This process's umask, read without changing it (os.umask sets it, a race with other threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    current = os.umask(0o022)  # no /proc (not Linux): the only portable way is to set and restore it
    os.umask(current)
    return current


def follow_umask(root: str | os.PathLike) -> None:
    """Widen every regular file under ``root`` (or ``root`` itself) to ``0o666 & ~umask`` where the writer
    made it narrower; never narrows a file, never touches directories or links."""
    wanted = 0o666 & ~umask()
    root = Path(root)
    files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]
    for f in files:
        mode = stat.S_IMODE(f.stat().st_mode)
        if mode | wanted != mode:
            f.chmod(mode | wanted)
