"""Where an accelerator ran out of memory, marked on the error (``torch.OutOfMemoryError``) as it passes outwards:
the step's phase that was measuring it (``observability/metrics.py measure``: rollout, decode, reward, update, ...)
and the part of it that allocated (``reward ocr``, ``grpo.diversity_features``). The innermost mark of each kind
stays; the run's one line (glm_grpo_ds/memory/oom.py) reads them.

    except torch.OutOfMemoryError as err:
        mark(err, part=f"reward {label}")
        raise
    phase, part = marks(err)
"""

from __future__ import annotations

_PHASE, _PART = "_glm_grpo_phase", "_glm_grpo_part"


def mark(err: BaseException, phase: str | None = None, part: str | None = None) -> None:
    """Mark ``err`` with the phase and / or the part it passed through, unless an inner one marked it already."""
    for attr, value in ((_PHASE, phase), (_PART, part)):
        if value is not None and getattr(err, attr, None) is None:
            setattr(err, attr, value)


def marks(err: BaseException) -> tuple[str | None, str | None]:
    """``(phase, part)`` that ``err`` was marked with (None where it passed through none)."""
    return getattr(err, _PHASE, None), getattr(err, _PART, None)
