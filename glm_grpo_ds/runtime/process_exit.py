"""How a glm-grpo process ends after a normal return: every atexit handler, then an immediate exit, without the
interpreter's teardown.

With torch, transformers, diffusers, DeepSpeed and bitsandbytes imported, CPython's teardown (clearing every
module, then full garbage collections over millions of objects) costs ~1.8 s of CPU per process (measured on
this project's 2-core machine: importing those five and exiting takes 7.2 s, 5.4 s without the teardown), for
every rank, launcher child and tool run, and the test suite starts hundreds of them. :func:`exit_now` keeps
what the teardown does that matters: it runs the registered atexit handlers (logging's flush and close, the
trackers', the libraries' own), in the order the interpreter would, and flushes Python's and C's output
buffers; then ``os._exit``. It leaves the normal shutdown alone when a non-daemon thread is still running (the
interpreter would wait for it). Only the process entry points call it (``glm-grpo``, ``python -m
glm_grpo_ds.train``), never code that tests or a notebook call in-process.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import sys
import threading


def others_running() -> bool:
    """Whether a non-daemon thread besides the main one is alive (the interpreter joins those before exiting)."""
    main = threading.main_thread()
    return any(t is not main and t.is_alive() and not t.daemon for t in threading.enumerate())


def exit_now(code: int) -> int:
    """Exit with ``code`` now: the atexit handlers, flushed output, ``os._exit(code)``. Returns ``code`` (for
    ``raise SystemExit(...)``, the normal shutdown) only when another non-daemon thread is running."""
    if others_running():
        return code
    atexit._run_exitfuncs()  # what Py_Finalize runs first; CPython's own entry point for it
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # closed or replaced by a caller: nothing left to write
            pass
    ctypes.CDLL(None).fflush(None)  # C's stdio buffers (extension modules printing from C/C++)
    os._exit(code)
