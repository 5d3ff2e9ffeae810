"""A rollout sampled and not yet decoded (:class:`Drawn`), and its checkpoint format: with ``rollout.one_step_off`` a
checkpoint holds each rank's rollout drawn ahead for the next step (lifecycle/checkpoint.py ``ahead/rank_<r>.pt``),
written as plain tensors, lists and numbers so ``torch.load(weights_only=True)`` reads it back."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from ..data import PromptRow
from ..rollout import GridSpec, RolloutBatch
from ..rollout.backends import Sampled


@dataclass
class Drawn:
    """One rollout, sampled and not yet decoded (``ExperienceMaker.draw``): the dataset rows it sampled, the
    sampler's result, the rollout's seconds and peak memory."""

    rows: list[PromptRow]
    got: Sampled
    timings: dict[str, float]
    peaks: dict[str, float]

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor the rollout made (a CUDA stream hands them over: experience/off_policy.py)."""
        batch = self.got.batch
        found = [getattr(batch, f.name) for f in fields(batch)] + [self.got.ref_logps, self.got.old_logps]
        return [t for t in found if isinstance(t, torch.Tensor)]

    def state(self) -> dict:
        """The checkpoint form: the dataset rows by index, the batch's tensors, the prompts and grid, the
        log-probs computed while sampling, the seconds."""
        batch = self.got.batch
        return {
            "rows": [row.index for row in self.rows],
            "batch": {f.name: v for f in fields(batch) if isinstance(v := getattr(batch, f.name), torch.Tensor)},
            "prompts": list(batch.prompts),
            "grid": [list(batch.grid.large), list(batch.grid.preview)],
            "ref_logps": self.got.ref_logps,
            "old_logps": self.got.old_logps,
            "timings": dict(self.timings),
        }

    @staticmethod
    def same_prompts(state: dict, rows) -> bool:
        """Whether :meth:`state`'s samples were drawn for the prompts ``rows`` (the prompt set) holds at its row
        numbers now: a prompt file edited in place keeps its row numbers and changes what they say."""
        try:
            index = state["batch"]["prompt_index"].tolist()
            return [rows[state["rows"][i]].prompt for i in index] == list(state["prompts"])
        except (IndexError, KeyError, TypeError):
            return False

    @classmethod
    def from_state(cls, state: dict, rows, device: torch.device) -> Drawn:
        """:meth:`state`'s inverse; ``rows``: the prompt set (``rows[i]`` is dataset row ``i``); ValueError when
        the state's rows are not this prompt set's."""
        picked = [rows[i] for i in state["rows"]]
        if [row.index for row in picked] != state["rows"]:
            raise ValueError("the pending rollout's dataset rows are not this prompt set's")
        tensors = {k: v.to(device) for k, v in state["batch"].items()}
        large, preview = (tuple(x) for x in state["grid"])
        batch = RolloutBatch(**tensors, prompts=list(state["prompts"]), grid=GridSpec(large, preview))
        move = lambda t: None if t is None else t.to(device)
        got = Sampled(batch, move(state["ref_logps"]), move(state["old_logps"]))
        return cls(picked, got, dict(state["timings"]), {})
