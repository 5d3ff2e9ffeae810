"""The deterministic split of a prompt set across ranks, step by step.

Each step, :class:`PromptOrder` takes the next ``world_size * prompts_per_rank`` row numbers of a
seeded permutation (a new one per epoch) - the step's draw - and gives rank r its own places in it
(:meth:`PromptOrder.places`), so no two ranks train on the same prompt in a step and every rank can compute every
other rank's prompts (no communication). The places are rank r's slice of the draw; with ``batch.mini_batches`` K
dividing ``prompts_per_rank``, rank r's slice of each K-th of the draw instead, so that where K does not divide
the group size (else each mini-batch is a K-th of every group: update.py ``mini_batch_order``) the k-th optimizer
step of a step trains the same prompts (the k-th K-th of the draw) on every number of ranks where K divides the
prompts per rank; the sampling streams follow the places (runtime/seeding.py), so a prompt samples the same tokens
on whichever rank.
A step that crosses into the next epoch and meets a prompt it already took at the end of the last one
takes the next row instead; that prompt comes first in the following step (no prompt twice in a step).
Only the rows a step samples are read (``rows[i]``); the permutation is an ``array`` of 4-byte ints
(8 above 2**31 rows), shuffled by ``random.Random.shuffle`` exactly as a list would be, so the order
is the same as it always was for a given seed.

Dead prompts (``data.dead_prompt_skip_prob``): after each step the trainer tells the sampler which of the
step's groups had no reward variance (:meth:`PromptOrder.observe`, the same global list on every rank).
When such a prompt's turn comes again it is skipped with probability p, drawn from (seed, epoch, row)
alone, and the next row of the permutation is taken instead - every rank makes the same draws, so the
ranks still agree on every rank's prompts. A prompt that shows variance again stops being dead. At most
``len(rows)`` skips per step: when nearly every prompt is dead the step takes them anyway.
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Sequence

from .rows import DataError, PromptRow


def check_enough(rows: int, world_size: int, prompts_per_rank: int) -> None:
    """DataError unless ``rows`` prompts fill a step: each rank takes its own ``prompts_per_rank`` (fewer rows than a
    step needs would repeat prompts within it). The ranks check it at start, ``train --check`` before the job queues."""
    if rows < world_size * prompts_per_rank:
        raise DataError(
            f"data.train_file has {rows} prompts but a step needs {world_size * prompts_per_rank} distinct "
            f"ones (world size {world_size} x batch.prompts_per_rank {prompts_per_rank})"
        )


class PromptOrder:
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
        dead_skip_prob: float = 0.0,
        mini_batches: int = 1,
    ):
        check_enough(len(rows), world_size, prompts_per_rank)
        self.rows, self.world_size, self.rank = rows, world_size, rank
        self.per_rank, self.seed, self.shuffle = prompts_per_rank, seed, shuffle
        # the draw's blocks, one per optimizer step: whole prompts per rank in each, else one block
        self.blocks = mini_batches if prompts_per_rank % mini_batches == 0 else 1
        self.epoch, self.position = 0, 0
        # the permutation of the current epoch is drawn with these (a resume with another seed / data.shuffle keeps
        # the checkpoint's to the end of its epoch: else its rows would be partly repeated, partly never drawn)
        self._epoch_seed, self._epoch_shuffle = seed, shuffle
        self._order = self._permutation(0)
        self.dead_skip_prob = dead_skip_prob
        self.dead: set[int] = set()  # rows whose last group had no reward variance
        self.last_picked: list[int] = []  # the last step's rows, every rank's: its draw
        self.deferred: list[int] = []  # rows the next step takes first (met twice by a step crossing epochs)
        self.last_skipped = 0  # dead rows passed over to pick them
        self.skipped_total = 0

    def _permutation(self, epoch: int) -> Sequence[int]:
        n = len(self.rows)
        if not self._epoch_shuffle:
            return range(n)  # file order, no memory at all
        order = array("i" if n < 2**31 else "q", range(n))
        random.Random(self._epoch_seed * 1_000_003 + epoch).shuffle(order)  # same swaps as on a list
        return order

    def _skips(self, row: int) -> bool:
        """Pass over dead ``row`` this epoch? The same draw on every rank and after a resume."""
        if row not in self.dead:
            return False
        return random.Random((self.seed * 1_000_003 + self.epoch) * 2**40 + row).random() < self.dead_skip_prob

    def _next_indices(self) -> list[int]:
        """Row numbers of the next step, every rank's: its draw (rank r's at :meth:`places`)."""
        need = self.world_size * self.per_rank
        # rows a step crossing into a new epoch met again: taken first now (see below)
        picked: list[int] = []
        rest: list[int] = []
        for row in self.deferred:
            (picked if len(picked) < need and row not in picked else rest).append(row)
        self.deferred = rest
        skipped = 0
        while len(picked) < need:
            if self.position >= len(self._order):
                self.epoch += 1
                self.position = 0
                self._epoch_seed, self._epoch_shuffle = self.seed, self.shuffle  # a resume's own from here
                self._order = self._permutation(self.epoch)
            # one row at a time: each may be skipped; a step that crosses into a new epoch may meet a row it
            # already took at the end of the last one: no prompt twice in a step, that row waits for the next
            row = self._order[self.position]
            self.position += 1
            if row in picked:
                # skipped dead rows can carry a step across two epochs: a row owed already is owed once
                if row not in self.deferred:
                    self.deferred.append(row)
            elif skipped < len(self.rows) and self._skips(row):
                skipped += 1
            else:
                picked.append(row)
        self.last_picked, self.last_skipped = picked, skipped
        self.skipped_total += skipped
        return picked

    def places(self, rank: int) -> list[int]:
        """Where rank ``rank``'s prompts are in a step's draw, in its order: its slice of each of the draw's blocks
        (one block, or ``mini_batches`` when they divide prompts_per_rank: see the module docstring)."""
        each = self.per_rank // self.blocks
        block = self.world_size * each
        return [b * block + rank * each + j for b in range(self.blocks) for j in range(each)]

    def observe(self, dead: list[bool | None]) -> None:
        """Which groups of the last step had no reward variance, rank after rank (each rank's in its order, as
        every rank gathers them); None: unknown (a reward failed there), the row's state stays. Collective in
        spirit: call it on every rank with the same list."""
        if len(dead) != len(self.last_picked):
            raise ValueError(f"observe got {len(dead)} groups for a step of {len(self.last_picked)} prompts")
        if self.dead_skip_prob == 0:
            return  # nothing would read it: keep no per-prompt state
        rows = [self.last_picked[p] for r in range(self.world_size) for p in self.places(r)]
        for row, is_dead in zip(rows, dead):
            if is_dead is None:
                continue
            if is_dead:
                self.dead.add(row)
            else:
                self.dead.discard(row)

    def next_global(self) -> list[list[PromptRow]]:
        """The prompts of every rank for the next step: ``[rank][i]``."""
        picked = self._next_indices()
        return [[self.rows[picked[p]] for p in self.places(r)] for r in range(self.world_size)]

    def next(self) -> list[PromptRow]:
        """This rank's prompts for the next step (only they are read)."""
        picked = self._next_indices()
        return [self.rows[picked[p]] for p in self.places(self.rank)]

    def state(self) -> dict:
        state = {"epoch": self.epoch, "position": self.position, "seed": self._epoch_seed}
        state["shuffle"] = self._epoch_shuffle
        if self.deferred:
            state["deferred"] = list(self.deferred)
        if self.dead_skip_prob > 0:
            state.update(dead=sorted(self.dead), skipped_total=self.skipped_total)
        return state

    def load_state(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        # the epoch under way goes on in its own order (checkpoints before these keys: this run's settings)
        self._epoch_seed = int(state.get("seed", self.seed))
        self._epoch_shuffle = bool(state.get("shuffle", self.shuffle))
        self._order = self._permutation(self.epoch)
        # rows past the end of a prompt file shortened since (its change is warned of at start) are gone
        n = len(self.rows)
        self.deferred = [int(row) for row in state.get("deferred", []) if int(row) < n]
        # a checkpoint of a run without skipping has none: every prompt starts alive
        self.dead = {int(row) for row in state.get("dead", []) if int(row) < n} if self.dead_skip_prob > 0 else set()
        self.skipped_total = int(state.get("skipped_total", 0))
