"""Tensors a checkpoint keeps of a run's own state beside DeepSpeed's: the KL's reset reference (reference.py) and
the adapter's moving average (ema.py). Safetensors files of one pattern (``<name>-00000.safetensors``, ...; several
where one would hold too much on rank 0's host), the state's step in their metadata; a resume opens them on every
rank and checks their names before any rank loads one (a rank that cannot read them would otherwise leave the
others in a collective load), and all raise one line if one cannot.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from ..ds import dist
from ..lifecycle.checkpoint import CheckpointError
from ..runtime.file_modes import follow_umask


def kept_files(directory, pattern: str) -> list[Path]:
    """The files of ``pattern`` in checkpoint ``directory``, in order ([] for none)."""
    return sorted(Path(directory).glob(pattern))


class KeptTensors:
    """A state a checkpoint keeps as tensors: ``step`` (0: nothing to keep yet, the state is its start), ``pattern``
    (its files' glob, ``*`` numbering them), ``expected`` (the tensor names a checkpoint's must hold). A subclass
    gives ``_shards(rank)`` (collective: rank 0's name -> tensor dicts, one per file) and ``_take(get, step)``
    (collective: ``get(name)`` reads a tensor; None = no files, the start)."""

    step = 0
    pattern = ""
    expected: set[str] = set()

    def write(self, directory, rank: int) -> None:
        """Write the state into checkpoint ``directory`` (rank 0; collective: every rank calls it); nothing at step
        0."""
        if not self.step:
            return
        from safetensors.torch import save_file

        for i, shard in enumerate(self._shards(rank)):
            if rank == 0:
                path = Path(directory) / self.pattern.replace("*", f"{i:05d}")
                save_file(shard, str(path), metadata={"step": str(self.step)})
                follow_umask(path)  # safetensors writes 0600

    def read(self, directory) -> None:
        """The state checkpoint ``directory`` holds (collective); the start when it holds none. Every rank opens the
        files and checks their names first; if one cannot, all raise."""
        from safetensors import SafetensorError, safe_open

        found, problem, step = kept_files(directory, self.pattern), None, 0
        with contextlib.ExitStack() as stack:
            try:
                opened = [stack.enter_context(safe_open(str(f), "pt")) for f in found]
                where = {name: f for f in opened for name in f.keys()}
                step = int(opened[0].metadata()["step"]) if opened else 0
                if opened and set(where) != self.expected:
                    missing, extra = sorted(self.expected - set(where)), sorted(set(where) - self.expected)
                    problem = f"does not fit this model: missing {missing[:3]}, unknown {extra[:3]}"
            except (SafetensorError, OSError, ValueError, KeyError, TypeError) as err:  # damaged, foreign, unreadable
                problem = str(err)
            if dist.any_rank(problem is not None):  # a load may be collective: no rank goes on alone
                what = problem or "another rank could not read them"
                raise CheckpointError(f"{directory}/{self.pattern}: {what}; resume from another checkpoint")
            self._take((lambda name: where[name].get_tensor(name)) if found else None, step)
