"""Rank-aware console logging for the trainer (stdlib ``logging``).

Global rank 0 prints at the chosen level (``--log-level``, default info): info to stdout, warnings
and errors to stderr. Other ranks print errors only, so an N-rank run shows each message once;
:func:`warning_once` with ``all_ranks=True`` is the exception for problems only one rank may see
(a reward that raised on that rank's batch).

    from . import log
    log.setup("info", rank)
    log.info("resumed from ...")
    log.warning_once("reward:clip", "reward clip raised ...", all_ranks=True)
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time

LEVELS = ("debug", "info", "warning", "error")
_LOGGER = logging.getLogger("glm_grpo")
_FATAL = logging.getLogger("glm_grpo.fatal")  # fatal() lines, for the run's log file only (run_log.py)
_FATAL.propagate = False
_FATAL.addHandler(logging.NullHandler())  # without a file: nothing (not logging's last-resort stderr print)
_FILE_ONLY = logging.getLogger("glm_grpo.progress")  # to_file() lines: the run's log file, never the console
_FILE_ONLY.propagate = False
_FILE_ONLY.setLevel(logging.INFO)  # whatever --log-level the console has
_FILE_ONLY.addHandler(logging.NullHandler())
_warned: set[str] = set()
_rank = 0


class _AllRanksFilter(logging.Filter):
    """On ranks other than 0 let through errors, and warnings flagged ``all_ranks``."""

    def filter(self, record: logging.LogRecord) -> bool:
        return _rank == 0 or record.levelno >= logging.ERROR or getattr(record, "all_ranks", False)


class _Below(logging.Filter):
    def __init__(self, level: int):
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < self.level


class ConsoleHandler(logging.StreamHandler):
    """A console handler that lifts tqdm's bars off the terminal while it writes (the step bar, the step status
    of glm_grpo_ds/observability/step_status.py; redrawn below the line), so a line never lands at the end of a
    bar's. Without a bar (a log file: none is drawn) it is a plain StreamHandler."""

    def emit(self, record: logging.LogRecord) -> None:
        std = sys.modules.get("tqdm.std")  # no tqdm imported: no bar
        if std is None or not getattr(std.tqdm, "_instances", None):
            super().emit(record)
            return
        with std.tqdm.external_write_mode(file=self.stream):
            super().emit(record)


def env_rank() -> int:
    """The global rank from the launcher's environment (0 when run as one process)."""
    return int(os.environ.get("RANK", "0"))


def setup(level: str = "info", rank: int | None = None) -> None:
    """(Re)configure the ``glm_grpo`` logger for this process."""
    global _rank
    _rank = env_rank() if rank is None else rank
    _LOGGER.handlers.clear()
    _FATAL.handlers[1:] = []  # the NullHandler stays
    _FILE_ONLY.handlers[1:] = []
    _LOGGER.propagate = False
    _LOGGER.setLevel(getattr(logging, level.upper()))
    out = ConsoleHandler(sys.stdout)
    out.addFilter(_Below(logging.WARNING))
    err = ConsoleHandler(sys.stderr)
    err.setLevel(logging.WARNING)
    for handler in (out, err):
        handler.addFilter(_AllRanksFilter())
        handler.setFormatter(logging.Formatter("%(message)s"))
        _LOGGER.addHandler(handler)


def rank_filter() -> logging.Filter:
    """The console rule of this module for other handlers: rank 0 everything, other ranks errors."""
    return _AllRanksFilter()


def add_file_handler(handler: logging.Handler) -> None:
    """Also send our records (and :func:`fatal` and :func:`to_file` lines) to ``handler`` (the run's log file),
    every rank."""
    for logger in (_LOGGER, _FATAL, _FILE_ONLY):
        if handler not in logger.handlers:
            logger.addHandler(handler)


def set_rank(rank: int) -> None:
    global _rank
    _rank = rank


def debug(msg: str) -> None:
    _LOGGER.debug(msg)


def info(msg: str) -> None:
    _LOGGER.info(msg)


def warning(msg: str) -> None:
    _LOGGER.warning(msg)


def error(msg: str) -> None:
    _LOGGER.error(msg)


def warning_once(key: str, msg: str, all_ranks: bool = False) -> None:
    """Warn the first time ``key`` is seen in this process; later calls are silent."""
    if key in _warned:
        return
    _warned.add(key)
    prefix = f"[rank {_rank}] " if all_ranks and _rank != 0 else ""
    _LOGGER.warning(prefix + msg, extra={"all_ranks": all_ranks})


if not _LOGGER.handlers:  # importing code (tests, tools) gets rank-0 info logging by default
    setup("info", env_rank())


# The deepspeed launcher polls its ranks about once a second and terminates the others at the first non-zero exit:
# a rank other than 0 that failed and left at once could take rank 0's line with it (seen in a loaded suite run:
# exit 2 and no line). Those ranks wait this long after the line before they exit.
FATAL_GRACE_S = 3.0


def to_file(msg: str) -> None:
    """A line for the run's log file only (``logs/rank_<r>.log``; nothing without one): what the console shows
    another way, e.g. each step's progress line, which the console prints every ``logging.log_every`` steps or
    draws as a bar."""
    _FILE_ONLY.info(msg)


def fatal(msg: str, node_alone: bool = False, every_rank: bool = False) -> None:
    """The run's final error line: rank 0 only (every rank fails alike), on stderr, at any level. The other ranks
    then wait :data:`FATAL_GRACE_S`, so that rank 0 prints it before the launcher ends the job.

    ``node_alone``: the ranks failed before the process group, each node on its own inputs (its driver, its copy
    of a path not on shared storage), so other nodes may not fail alike: each node's first rank prints it too,
    named (``[rank 8, node2] ...``), or a node whose model folder is missing would end the job without a word.
    ``every_rank``: a failure only this rank may have met (mid-run), printed by whichever rank it is, named, with
    no wait: the others fail in their next collective and wait instead (glm_grpo_ds/train.py), so that the launcher
    reports this rank's exit status."""
    first_on_node = node_alone and os.environ.get("LOCAL_RANK", "0") == "0"
    if _rank == 0:
        print(msg, file=sys.stderr, flush=True)
    elif first_on_node or every_rank:
        print(f"[rank {_rank}, {socket.gethostname()}] {msg}", file=sys.stderr, flush=True)
    _FATAL.error(msg)
    if _rank != 0 and not every_rank:  # every_rank: its exit, the first, is the status the launcher reports
        time.sleep(FATAL_GRACE_S)
