"""A step's experience: sample token grids, decode them to images, score the images.

- path.py: :class:`ExperienceMaker` (training, the in-training evaluation and the tools collect through it) and
  :class:`Experience`, what one collect returns;
- drawn.py: :class:`Drawn`, a rollout sampled and not yet decoded, with its checkpoint format;
- scoring.py: :func:`decode_and_score`, the decode and the (optionally streamed) rewards;
- off_policy.py: where a step's rollout comes from: now (:class:`NoAhead`) or drawn one step ahead on a background
  thread (:class:`RolloutAhead`, ``rollout.one_step_off``), with the rules that make sharing the policy safe;
- resumed.py: a one-step-off checkpoint's pending rollout on resume (taken, sampled again, or its prompts requeued).
"""

from .drawn import Drawn
from .off_policy import NoAhead, PolicyInUse, RolloutAhead
from .path import Experience, ExperienceMaker
from .scoring import ToScore, decode_and_score

__all__ = [
    "Drawn",
    "Experience",
    "ExperienceMaker",
    "NoAhead",
    "PolicyInUse",
    "RolloutAhead",
    "ToScore",
    "decode_and_score",
]
