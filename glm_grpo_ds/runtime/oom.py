"""Where an accelerator ran out of memory, marked on the error (``torch.OutOfMemoryError``) as it passes outwards:
the step's phase that was measuring it (``observability/metrics.py measure``: rollout, decode, reward, update, ...)
and the parts it passed through (``reward ocr``, ``the evaluation after step 20``). The innermost phase stays; the
parts are joined, the innermost first (``reward ocr in the evaluation after step 20``). The run's one line
(glm_grpo_ds/memory/oom.py) reads them.

    except torch.OutOfMemoryError as err:
        mark(err, part=f"reward {label}")
        raise
    phase, part = marks(err)
"""

from __future__ import annotations

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


def within(err: BaseException | None) -> BaseException | None:
    """The out-of-memory error ``err`` is, or that caused it (its chain of causes and contexts: a CUDA graph's
    capture that failed because an allocation inside it did raises its own error from it); None when none did."""
    import torch  # here: the rest of this module needs no torch

    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, torch.OutOfMemoryError):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None
