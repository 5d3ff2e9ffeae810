"""Rank 0's work after a checkpoint that no other rank needs: pruning old checkpoints
(``save_total_limit``) and uploading the new adapter (``hub.push_checkpoints``).

The jobs run on one worker thread, in the order submitted, while training goes on: deleting a 100 GB
full-fine-tuning checkpoint or a slow upload then never holds the other ranks in a barrier or the next
step's first collective, whose timeout (``dist_timeout_minutes``) would end the run. One thread, so a
prune never deletes a checkpoint an earlier upload is still reading (the upload came first).

At most one job of each kind is pending: submitting one first waits for the previous one of its kind
(an upload slower than ``save_steps`` steps then holds rank 0 until it is done, not the queue growing
without end). :meth:`Background.wait` waits for all of them: at the end of training, and before a
preempted run exits. Jobs report their own failures (one warning line each); an exception that escapes
one is raised again by the next wait.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable


class Background:
    """One worker thread for rank 0's jobs (started at the first job; idle ranks have none)."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._pending: dict[str, Future] = {}

    def submit(self, kind: str, job: Callable[[], object]) -> None:
        """Run ``job()`` after the jobs submitted before it, once the previous job of ``kind`` is done."""
        previous = self._pending.pop(kind, None)
        if previous is not None:
            previous.result()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="glm-grpo-rank0")
        self._pending[kind] = self._pool.submit(job)

    def wait(self) -> None:
        """Until every submitted job is done."""
        while self._pending:
            self._pending.pop(next(iter(self._pending))).result()
