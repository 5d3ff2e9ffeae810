"""Where an accelerator ran out of memory, marked on the error (``torch.OutOfMemoryError``) as it passes outwards:
the step's phase that was measuring it (``observability/metrics.py measure``: rollout, decode, reward, update, ...)
and the parts it passed through (``reward ocr``, ``the evaluation after step 20``). The innermost phase stays; the
parts are joined, the innermost first (``reward ocr in the evaluation after step 20``). The run's one line
(glm_grpo_ds/memory/oom.py) reads them.

    with marking(phase="decode", part="reward ocr"):   # an out-of-memory error leaving the block is marked
        ...
    phase, part = marks(out_of_memory(err))            # the run's line: where it was met
"""

from __future__ import annotations

import contextlib

from .error_chain import chain

_PHASE, _PART = "_glm_grpo_phase", "_glm_grpo_part"


def mark(err: BaseException, phase: str | None = None, part: str | None = None) -> None:
    """Mark ``err`` with the phase it left (unless an inner one marked it already) and / or a part it passed through
    (after the inner ones)."""
    if phase is not None and getattr(err, _PHASE, None) is None:
        setattr(err, _PHASE, phase)
    if part is not None:
        inner = getattr(err, _PART, None)
        setattr(err, _PART, part if inner is None else f"{inner} in {part}")


def marks(err: BaseException) -> tuple[str | None, str | None]:
    """``(phase, part)`` that ``err`` was marked with (None where it passed through none)."""
    return getattr(err, _PHASE, None), getattr(err, _PART, None)


def out_of_memory(err: BaseException | None) -> BaseException | None:
    """The out-of-memory error ``err`` is, or that caused it (a CUDA graph's capture that failed because an
    allocation inside it did raises its own error over it); None when none did."""
    import torch  # here: the rest of this module needs no torch

    return next((e for e in chain(err) if isinstance(e, torch.OutOfMemoryError)), None)


@contextlib.contextmanager
def marking(phase: str | None = None, part: str | None = None):
    """Mark the out-of-memory error leaving the block (itself, or under the error it caused) with ``phase`` /
    ``part`` (:func:`mark`); every error leaves as it came."""
    try:
        yield
    except RuntimeError as err:
        starved = out_of_memory(err)
        if starved is not None:
            mark(starved, phase, part)
        raise
