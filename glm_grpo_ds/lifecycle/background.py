"""Rank 0's work after a checkpoint that no other rank needs: pruning old checkpoints
(``save_total_limit``) and uploading the new adapter (``hub.push_checkpoints``).

The jobs run on one worker thread, in the order submitted, while training goes on: deleting a 100 GB
full-fine-tuning checkpoint or a slow upload then never holds the other ranks in a barrier or the next
step's first collective, whose timeout (``dist_timeout_minutes``) would end the run. One thread, so a
prune never deletes a checkpoint an earlier upload is still reading (the upload came first).

At most one job of each kind is pending: submitting one waits up to ``wait_s`` for the previous one of its kind,
then, if that has not finished, skips the new one (``submit`` returns False and calls ``when_busy``): an upload
much slower than ``save_steps`` steps skips the checkpoints saved meanwhile (the caller says which), a prune
behind it is done by the next one. Waiting without end held rank 0 while the other ranks waited in the next
collective, which gives up after ``dist_timeout_minutes``; the caller keeps ``wait_s`` well inside it.
:meth:`Background.wait` waits for all of them: at the end of training, and before a preempted run exits. Jobs
report their own failures (one warning line each); an exception that escapes one is raised again by the next
submit of its kind or wait.
"""

from __future__ import annotations

from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable


class Background:
    """One worker thread for rank 0's jobs (started at the first job; idle ranks have none)."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._pending: dict[str, Future] = {}

    def submit(
        self, kind: str, job: Callable[[], object], wait_s: float = 0.0, when_busy: Callable[[], object] | None = None
    ) -> bool:
        """Run ``job()`` after the jobs submitted before it, and True; False (``job`` skipped, ``when_busy()``
        called) when the previous job of ``kind`` has not finished within ``wait_s`` seconds."""
        previous = self._pending.get(kind)
        if previous is not None:
            futures.wait([previous], timeout=wait_s)
            if not previous.done():
                if when_busy is not None:
                    when_busy()
                return False
            self._pending.pop(kind).result()  # its exception, if one escaped it
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="glm-grpo-rank0")
        self._pending[kind] = self._pool.submit(job)
        return True

    def wait(self) -> None:
        """Until every submitted job is done; then the idle worker ends (a later submit starts another): a non-daemon
        thread left alive made the process's exit wait for the interpreter's whole teardown (runtime/process_exit.py)
        and, after an error, for a job still running while the other ranks waited in a collective."""
        try:
            while self._pending:
                self._pending.pop(next(iter(self._pending))).result()
        finally:
            if self._pool is not None and not self._pending:
                self._pool.shutdown(wait=True)
                self._pool = None
