"""An error and the errors it came from: its ``__cause__`` (``raise ... from``) or else its ``__context__`` (raised
while handling it), each once. What a full disk, a lost peer or an exhausted GPU is told by may sit under the
error that reached the caller (lifecycle/disk_space.py, ds/dist.py, runtime/oom.py)."""

from __future__ import annotations


def chain(err: BaseException | None) -> list[BaseException]:
    """``err`` first, then each error it came from, each once (a cycle ends the walk)."""
    seen: list[BaseException] = []
    while err is not None and all(err is not e for e in seen):
        seen.append(err)
        err = err.__cause__ or err.__context__
    return seen
