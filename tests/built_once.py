"""What the test session builds once for all pytest-xdist workers (the tiny model, its prompt files, the
shared short training run): the first worker to ask builds it under a file lock, the others wait and
read it.

    from built_once import built_once   # a conftest or test module
"""

import os
import shutil

from filelock import FileLock


def built_once(tmp_path_factory, name: str, build):
    """``build(path)`` run once per test session, also across xdist workers (they share the parent of
    their base temporary directories); returns ``path``. A build that raised is retried by the next
    caller (no marker is written)."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    path = root / name
    with FileLock(str(root / f"{name}.lock")):
        done = root / f"{name}.done"
        if not done.exists():
            shutil.rmtree(path, ignore_errors=True)
            build(path)
            done.touch()
    return path
