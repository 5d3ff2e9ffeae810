"""``samples.jsonl``: every ``logging.sample_records`` steps, one line per sample of the step's global batch, so what
each image was scored and taught can be read sample by sample (which prompt's samples a reward rated high, where a
reward failed, the advantage each got), not only as the step's means (TRL's ``log_completions``, as a file).

    {"step": 40, "sample": 5, "prompt_index": 12, "group_member": 1, "prompt": "a red apple",
     "reward": 0.81, "rewards": {"ocr": 0.9, "aesthetic": 0.63}, "advantage": 0.42}

``reward`` is the weighted total the advantages came from (a reward undefined for a sample: filled from its group,
advancing it neither way); ``rewards`` the raw value of each, null where it was undefined; ``advantage`` the one the
update used (after ``grpo.disagreement_gate``). A resumed run keeps the lines up to its checkpoint's step, as
``metrics.jsonl`` (records.MetricsWriter). The images themselves: the galleries (``logging.gallery_steps``).
"""

from __future__ import annotations

import torch

from ..ds import dist
from .metrics import finite_or_none


def sample_lines(
    step: int,
    prompt_index: list[int],
    prompts: list[str],
    per_reward: dict[str, torch.Tensor],
    totals: torch.Tensor,
    advantages: torch.Tensor,
    group_size: int,
) -> list[dict]:
    """The lines of one step: ``prompt_index`` / ``prompts`` per sample of the global batch (group by group), the
    gathered ``per_reward`` ``[N]`` values, their weighted ``totals`` ``[N]`` and the ``advantages`` ``[N]``."""
    values = {label: v.tolist() for label, v in per_reward.items()}
    total, adv = totals.tolist(), advantages.tolist()
    return [
        {
            "step": step,
            "sample": i,
            "prompt_index": prompt_index[i],
            "group_member": i % group_size,
            "prompt": prompts[i],
            "reward": finite_or_none(total[i]),
            "rewards": {label: finite_or_none(v[i]) for label, v in values.items()},
            "advantage": finite_or_none(adv[i]),
        }
        for i in range(len(prompt_index))
    ]


def record_samples(tracker, step: int, rows, all_rows, per_reward, totals, advantages, group_size: int) -> None:
    """Collective (every rank calls it): gathers each rank's samples' dataset rows (``rows``, this rank's, whose
    ``index`` points into ``all_rows``); rank 0's ``tracker`` writes :func:`sample_lines` to ``samples.jsonl``."""
    index = dist.all_gather(torch.tensor([r.index for r in rows], dtype=torch.int64)).tolist()
    writer = tracker.writers.get("samples")
    if writer is None or not writer.enabled:  # only rank 0 writes: the others read no rows
        return
    text = {i: all_rows[i].prompt for i in set(index)}  # a row read once, not once per sample
    prompts = [text[i] for i in index]
    for line in sample_lines(step, index, prompts, per_reward, totals.float(), advantages.float(), group_size):
        tracker.write("samples", line)
