"""What a prompt set is to the trainer: :class:`PromptRow` (one row), :class:`PromptRows` (a list-like
view that reads a row only when it is indexed), :class:`DatasetImage` (a target image stored in the
dataset) and :class:`DataError` (bad input, one line)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Callable


class DataError(ValueError):
    """A problem with the prompt data; the message names the file (or dataset), the row and the fix."""


def reserved_clash(names, keys: tuple[str, str, str]) -> str | None:
    """`` "index" is reserved (...)`` when one of ``names`` (a row's other columns, besides ``keys``: the
    data.*_key names) is a name :meth:`PromptRow.reward_sample` sets, which would overwrite its values; else None."""
    given = {"index": "the row number", "target_image": f'data.target_image_key "{keys[1]}"'}
    given["text"] = f'data.text_key "{keys[2]}"'
    clash = next((name for name in given if name in names and name not in keys), None)
    if clash is None:
        return None
    fix = "rename it" if clash == "index" else f"rename it, or set data.{clash}_key={clash} if it is the one"
    return f'"{clash}" is reserved (the rewards get {given[clash]} under that name); {fix}'


@dataclass(frozen=True, repr=False)
class DatasetImage:
    """A target image stored in the dataset itself (a ``datasets.Image`` column): its encoded bytes,
    read from the memory-mapped table when the row is read, decoded only when a reward opens it.

    Hashable by content, so ``rewards.targets.load_target`` caches it like a path. ``open()`` gives
    a fresh PIL image each call (safe to use from several reward threads at once)."""

    data: bytes
    label: str  # where it comes from, e.g. "prompts.parquet row 17", for messages

    def open(self):
        from .image_files import open_image

        return open_image(io.BytesIO(self.data))

    def __str__(self) -> str:
        return f"<image in {self.label}>"

    __repr__ = __str__


@dataclass(frozen=True)
class PromptRow:
    index: int  # row number in the data set (0-based, stable: seeds and metrics refer to it)
    prompt: str
    target_image: str | DatasetImage | None = None  # absolute path, or an image stored in the dataset
    text: str | None = None
    extra: dict = field(default_factory=dict)

    def reward_sample(self) -> dict:
        """What a reward function sees of this row besides the image and prompt (glm_grpo_ds/rewards/base.py)."""
        return dict(self.extra, target_image=self.target_image, text=self.text, index=self.index)


class PromptRows(Sequence):
    """The rows of a prompt set, read one at a time: ``len()``, ``rows[i]`` (a :class:`PromptRow`),
    iteration and slicing (a view) like a list, without holding every row as a Python object - a
    step reads only the rows it samples. ``read(i)`` builds row ``i``; ``where`` names the source."""

    def __init__(self, read: Callable[[int], PromptRow], count: int, where: str, positions: range | None = None):
        self._read, self.where = read, where
        self._positions = range(count) if positions is None else positions

    def __len__(self) -> int:
        return len(self._positions)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return PromptRows(self._read, 0, self.where, self._positions[i])
        return self._read(self._positions[i])

    def __repr__(self) -> str:
        return f"PromptRows({self.where}, {len(self)} rows)"
