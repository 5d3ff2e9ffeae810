"""The run's log files, and how much of the libraries' output reaches the console.

Console of rank 0: our lines (the ``glm_grpo`` logger, log.py), our progress bar, and library
records at ERROR (those on every rank). Everything else the libraries say goes to
``output_dir/logs/rank_<r>.log`` (one file per rank, appended to across resumes, timestamped, with
our own lines too):

- the records of every third-party logger (transformers, diffusers, DeepSpeed, torch, peft, ...):
  the console handlers libraries put on their own loggers are removed and their records handed to
  the root logger (:func:`adopt_library_loggers`, at setup, after ``import deepspeed``, when the file
  opens, after the rewards are built and after the engine is: where libraries come in);
- Python ``warnings`` (``logging.captureWarnings``);
- what DeepSpeed ``print()``s (ds/engine.py runs those calls under :func:`prints_to_log`);

and the model-load progress bars ("Loading weights", "Loading pipeline components") are switched
off. At the end of a run rank 0 prints one line: where its file is and how many library warnings this
run wrote to it, by library.

Until ``output_dir`` is checked (config and input errors come first) records are kept in memory and
written to the file when it opens (:func:`open_file`); a run that stops on an input error before
that drops them, so the error stays one line (``--log-level debug`` shows them); an unexpected
exception prints the warnings among them to stderr before its traceback. ``--log-level debug``:
library records from INFO up go to the console too (and the file), and the progress bars stay on.

    run_log.setup(args.log_level, rank)   # train.main(), first thing
    run_log.open_file(output_dir, rank)   # Trainer, once output_dir is checked
    run_log.finish()                      # rank 0's summary line
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import os
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

from . import log

LOGS_DIR = "logs"
_MAX_BUFFERED = 20_000  # lines kept before the file opens (a startup logs a few dozen)
_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def log_path(output_dir, rank: int) -> Path:
    return Path(output_dir) / LOGS_DIR / f"rank_{rank}.log"


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return super().format(record).rstrip()  # Python warnings end in a newline


class _RunFile(logging.Handler):
    """Every record, formatted with its time: kept in memory until :meth:`open`, then appended to the
    file. Counts the library warnings (records at WARNING or above not from ``glm_grpo``)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.setFormatter(_Formatter(_FORMAT))
        self.buffer: list[tuple[int, str]] = []  # (level, line) until the file opens
        self.dropped = 0
        self.stream = None
        self.path: Path | None = None
        self.library_warnings: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if record.levelno >= logging.WARNING and not record.name.startswith("glm_grpo"):
                source = "py.warnings" if record.name == "py.warnings" else record.name.split(".")[0]
                self.library_warnings[source] += 1
            line = self.format(record)
            if self.stream is not None:
                self.stream.write(line + "\n")
                self.stream.flush()
            elif len(self.buffer) < _MAX_BUFFERED:
                self.buffer.append((record.levelno, line))
            else:
                self.dropped += 1
        except Exception:  # noqa: BLE001 - logging's own contract: report through handleError, never raise
            self.handleError(record)

    def open(self, path: Path, header: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.acquire()
        try:
            self.stream = path.open("a", encoding="utf-8")
            self.path = path
            self.stream.write(header + "\n")
            if self.dropped:
                self.buffer.append((logging.INFO, f"({self.dropped} earlier lines were not kept)"))
            self.stream.write("".join(line + "\n" for _, line in self.buffer))
            self.stream.flush()
            self.buffer, self.dropped = [], 0
        finally:
            self.release()

    def close(self) -> None:
        self.acquire()
        try:
            if self.stream is not None:
                self.stream.close()
                self.stream = None
        finally:
            self.release()
        super().close()


class _LibraryConsole(log.ConsoleHandler):
    """Library records on stderr: at ERROR (every rank), or from INFO up on rank 0 with --log-level debug."""

    def __init__(self, level: int):
        super().__init__(sys.stderr)
        self.setLevel(level)
        self.addFilter(log.rank_filter())
        self.setFormatter(_Formatter("[%(name)s] %(levelname)s: %(message)s"))


_file: _RunFile | None = None
_debug = False


def _is_console(handler: logging.Handler) -> bool:
    """A handler that prints to the terminal (torch's ``_StderrHandler`` is no StreamHandler but has a stream)."""
    if isinstance(handler, (logging.FileHandler, _RunFile, _LibraryConsole)):
        return False
    stream = getattr(handler, "stream", None)
    return isinstance(handler, logging.StreamHandler) or stream in (
        sys.stdout,
        sys.stderr,
        sys.__stdout__,
        sys.__stderr__,
    )


def adopt_library_loggers() -> None:
    """Hand every third-party logger that prints by itself (its own console handler, usually with
    ``propagate = False``: transformers, diffusers, DeepSpeed, torch) to the root logger, where the
    run's file and library-console handlers are. Idempotent; call it again after importing a library
    that installs its handler at import (ds/engine.py does, after ``import deepspeed``)."""
    if _file is None:
        return
    loggers = [logging.getLogger()] + [
        obj
        for name, obj in list(logging.root.manager.loggerDict.items())
        if isinstance(obj, logging.Logger) and name != "glm_grpo" and not name.startswith("glm_grpo.")
    ]
    for logger in loggers:
        console = [handler for handler in logger.handlers if _is_console(handler)]
        for handler in console:
            logger.removeHandler(handler)
        if console and logger is not logging.getLogger():
            logger.propagate = True
    if _debug:  # libraries that set their own level: let their INFO through too
        for name in ("DeepSpeed", "torch"):
            logging.getLogger(name).setLevel(logging.INFO)


def _quiet_hf_library(name: str) -> None:
    """transformers' or diffusers' logger (its console handler appears when the library is imported:
    adopted here) and load progress bars (off, unless debug; transformers' switch covers huggingface_hub's)."""
    lib = importlib.import_module(f"{name}.utils.logging")
    if _debug:
        lib.set_verbosity_info()
    else:
        lib.disable_progress_bar()
    adopt_library_loggers()


def setup(level: str = "info", rank: int | None = None) -> None:
    """Configure this process's logging for a training run (before any library logs anything): our
    console lines (log.py), the in-memory buffer of the run file, libraries routed to it, Python
    warnings captured, progress bars off (unless debug)."""
    global _file, _debug
    log.setup(level, rank)
    _debug = level == "debug"
    root = logging.getLogger()
    if _file is not None:
        for handler in list(root.handlers):
            if isinstance(handler, (_RunFile, _LibraryConsole)):
                root.removeHandler(handler)
        _file.close()
    _file = _RunFile()
    root.setLevel(logging.INFO if _debug else logging.WARNING)
    root.addHandler(_file)
    root.addHandler(_LibraryConsole(logging.INFO if _debug else logging.ERROR))
    log.add_file_handler(_file)
    logging.captureWarnings(True)
    # transformers now (~2 s): our input checks import it (glm_image.resolve_sampling) before the file
    # opens, and a warning there must not reach the console; diffusers (~6 s) when the file opens.
    _quiet_hf_library("transformers")
    if "diffusers" in sys.modules:
        _quiet_hf_library("diffusers")
    sys.excepthook = _excepthook


def verbose() -> bool:
    """``--log-level debug``: library progress bars and INFO records are wanted on the console."""
    return _debug


def setup_tool(level: str = "info") -> None:
    """The same console policy for a command other than ``train`` (render, merge, estimate-memory,
    tiny-model, ...; glm_grpo_ds/commands/cli.py calls it): our lines, library errors; library warnings
    (bitsandbytes' missing optional CPU kernels, FutureWarnings, transformers' advice), load bars and
    DeepSpeed's lines stay out, shown with ``--log-level debug``, or before a traceback if one comes. A
    tool has no run directory, so what is held back is never written to a file."""
    setup(level, 0)
    _quiet_hf_library("diffusers")  # its load bars (~1.5 s to import its logging; most tools load a pipeline)
    if "DS_ACCELERATOR" not in os.environ:
        import torch

        # Without CUDA, DeepSpeed's auto-detection picks the CPU anyway, but warns to stdout through a
        # handler of its own (bound at its import, so adopt_library_loggers comes too late): say it first.
        if not torch.cuda.is_available():
            os.environ["DS_ACCELERATOR"] = "cpu"


def open_file(output_dir, rank: int) -> Path | None:
    """Start writing ``output_dir/logs/rank_<rank>.log`` (after output_dir is checked and, for a fresh
    run, an earlier run's files removed): what was buffered first, then everything as it comes."""
    if _file is None:
        return None
    path = log_path(output_dir, rank)
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    _file.open(path, f"==== glm-grpo train, rank {rank}, pid {os.getpid()}, started {started}: {' '.join(sys.argv)}")
    _quiet_hf_library("diffusers")  # the models load next and import it anyway
    return path


def finish() -> None:
    """Rank 0's closing line (at info): the file, and the library warnings this process wrote to it."""
    if _file is None or _file.path is None:
        return
    counts = _file.library_warnings
    total = sum(counts.values())
    which = ", ".join(f"{name} {n}" for name, n in counts.most_common())
    log.info(f"      log {_file.path}" + (f" ({total} library warning{'s' * (total != 1)}: {which})" if total else ""))


@contextlib.contextmanager
def prints_to_log(source: str):
    """Lines a library ``print()``s to stdout inside the block become INFO records of logger
    ``printed.<source>`` (the run file; the console with --log-level debug). A no-op outside a run
    set up by :func:`setup` (tests, tools)."""
    if _file is None:
        yield
        return
    stream = _PrintedLines(logging.getLogger(f"printed.{source}"))
    try:
        with contextlib.redirect_stdout(stream):
            yield
    finally:
        stream.flush()


class _PrintedLines(io.TextIOBase):
    def __init__(self, logger: logging.Logger):
        super().__init__()
        self.logger, self.partial = logger, ""
        logger.setLevel(logging.INFO)

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        *lines, self.partial = (self.partial + text).split("\n")
        for line in lines:
            if line.strip():
                self.logger.info(line.rstrip())
        return len(text)

    def flush(self) -> None:
        if self.partial.strip():
            self.logger.info(self.partial.rstrip())
        self.partial = ""


def _excepthook(exc_type, exc, tb) -> None:
    """An unexpected exception: the library warnings kept in memory first (they may explain it), the
    traceback, and the traceback into the run file too."""
    if _file is not None and _file.stream is None:
        kept = [line for level, line in _file.buffer if level >= logging.WARNING]
        if kept:
            print("\n".join(kept), file=sys.stderr)
    sys.__excepthook__(exc_type, exc, tb)
    if _file is not None and _file.stream is not None:
        _file.stream.write("".join(traceback.format_exception(exc_type, exc, tb)))
        _file.stream.flush()
        print(f"glm-grpo: the run's log: {_file.path}", file=sys.stderr)
