"""The deterministic split of a prompt set across ranks, step by step.

Each step, :class:`PromptSampler` takes the next ``world_size * prompts_per_rank`` row numbers of a
seeded permutation (a new one per epoch) and gives rank r its own slice, so no two ranks train on
the same prompt in a step and every rank can compute every other rank's prompts (no communication).
Only the rows a step samples are read (``rows[i]``); the permutation is an ``array`` of 4-byte ints
(8 above 2**31 rows), shuffled by ``random.Random.shuffle`` exactly as a list would be, so the order
is the same as it always was for a given seed.
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Sequence

from .rows import DataError, PromptRow


class PromptSampler:
    """Deterministic per-step prompt batches, split across ranks.

    ``state()`` / ``load_state()`` capture the position, so a resumed run continues exactly.
    """

    def __init__(
        self,
        rows: Sequence[PromptRow],
        world_size: int,
        rank: int,
        prompts_per_rank: int,
        seed: int,
        shuffle: bool = True,
    ):
        if len(rows) < world_size * prompts_per_rank:
            # a step gives each rank its own prompts: fewer rows than a step needs would repeat prompts within it
            raise DataError(
                f"data.train_file has {len(rows)} prompts but a step needs {world_size * prompts_per_rank} distinct "
                f"ones (world size {world_size} x batch.prompts_per_rank {prompts_per_rank})"
            )
        self.rows, self.world_size, self.rank = rows, world_size, rank
        self.per_rank, self.seed, self.shuffle = prompts_per_rank, seed, shuffle
        self.epoch, self.position = 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> Sequence[int]:
        n = len(self.rows)
        if not self.shuffle:
            return range(n)  # file order, no memory at all
        order = array("i" if n < 2**31 else "q", range(n))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)  # same swaps as on a list
        return order

    def _next_indices(self) -> list[int]:
        """Row numbers of the next step, every rank's, rank-major."""
        need = self.world_size * self.per_rank
        picked: list[int] = []
        while len(picked) < need:
            if self.position >= len(self._order):
                self.epoch += 1
                self.position = 0
                self._order = self._permutation(self.epoch)
            take = self._order[self.position : self.position + need - len(picked)]
            picked += take
            self.position += len(take)
        return picked

    def next_global(self) -> list[list[PromptRow]]:
        """The prompts of every rank for the next step: ``[rank][i]``."""
        picked = self._next_indices()
        return [
            [self.rows[i] for i in picked[r * self.per_rank : (r + 1) * self.per_rank]] for r in range(self.world_size)
        ]

    def next(self) -> list[PromptRow]:
        """This rank's prompts for the next step (only they are read)."""
        picked = self._next_indices()
        return [self.rows[i] for i in picked[self.rank * self.per_rank : (self.rank + 1) * self.per_rank]]

    def state(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._order = self._permutation(self.epoch)
