"""Prompt datasets and their deterministic split across ranks.

Files (``data.train_file``):

* ``.txt``: one prompt per line (blank lines skipped);
* ``.jsonl``: one JSON object per line with ``prompt`` (required), ``target_image`` (optional, a
  path relative to the file) and ``text`` (optional text to render); other keys are kept and
  passed to rewards.

Each step, :class:`PromptSampler` takes the next ``world_size * prompts_per_rank`` prompts of a
seeded permutation (a new one per epoch) and gives rank r its own slice, so no two ranks train on
the same prompt in a step and every rank can compute every other rank's prompts (no communication).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path


class DataError(ValueError):
    """A problem with the prompt file; the message names the file and line."""


@dataclass(frozen=True)
class PromptRow:
    index: int  # row number in the file (0-based, stable: seeds and metrics refer to it)
    prompt: str
    target_image: str | None = None  # absolute path
    text: str | None = None
    extra: dict = field(default_factory=dict)

    def reward_sample(self) -> dict:
        """What a reward function sees of this row besides the image and prompt (glm_grpo_ds/rewards/base.py)."""
        return dict(self.extra, target_image=self.target_image, text=self.text, index=self.index)


def load_prompts(path: str | Path, key: str = "data.train_file") -> list[PromptRow]:
    """Rows of a prompt file; ``key`` names the config key in error messages."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{key} {p} does not exist")
    rows: list[PromptRow] = []
    lines = p.read_text(encoding="utf-8").splitlines()
    if p.suffix == ".txt":
        for line in lines:
            if line.strip():
                rows.append(PromptRow(index=len(rows), prompt=line.strip()))
    elif p.suffix == ".jsonl":
        for lineno, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{p}:{lineno}: not valid JSON ({err.msg} at column {err.colno})") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str) or not obj["prompt"].strip():
                raise DataError(f'{p}:{lineno}: each line needs a non-empty string field "prompt"')
            target = obj.pop("target_image", None)
            if target is not None:
                target = str(_check_target(p, lineno, target))
            text = obj.pop("text", None)
            prompt = obj.pop("prompt").strip()
            rows.append(PromptRow(index=len(rows), prompt=prompt, target_image=target, text=text, extra=obj))
    else:
        raise DataError(f"{key} {p} must end in .txt or .jsonl")
    if not rows:
        hint = "one prompt per line" if p.suffix == ".txt" else 'one JSON object per line with a "prompt" field'
        raise DataError(f"{key} {p} holds no prompts; add {hint}")
    return rows


def _check_target(p: Path, lineno: int, target) -> Path:
    """The absolute path of a row's target image, checked now (header read: exists, readable, an
    image) so a bad row fails the run before training instead of at the step that samples it."""
    from PIL import Image, UnidentifiedImageError

    where = f"{p}:{lineno}: target_image {target}"
    if not isinstance(target, str) or not target:
        raise DataError(f"{where} must be a non-empty path string")
    path = (p.parent / target).resolve()
    if not path.is_file():
        raise DataError(f"{where} not found at {path}; fix the path (relative to the .jsonl file) or add the image")
    try:
        with Image.open(path) as img:
            img.size  # noqa: B018 - the header is read lazily; make sure it parses
    except (OSError, UnidentifiedImageError) as err:
        raise DataError(f"{where} cannot be read as an image ({err}); replace the file or drop the row") from None
    return path


class PromptSampler:
    """Deterministic per-step prompt batches, split across ranks.

    ``state()`` / ``load_state()`` capture the position, so a resumed run continues exactly.
    """

    def __init__(
        self, rows: list[PromptRow], world_size: int, rank: int, prompts_per_rank: int, seed: int, shuffle: bool = True
    ):
        self.rows, self.world_size, self.rank = rows, world_size, rank
        self.per_rank, self.seed, self.shuffle = prompts_per_rank, seed, shuffle
        self.epoch, self.position = 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self.rows)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def next_global(self) -> list[list[PromptRow]]:
        """The prompts of every rank for the next step: ``[rank][i]``."""
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
        rows = [self.rows[i] for i in picked]
        return [rows[r * self.per_rank : (r + 1) * self.per_rank] for r in range(self.world_size)]

    def next(self) -> list[PromptRow]:
        """This rank's prompts for the next step."""
        return self.next_global()[self.rank]

    def state(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._order = self._permutation(self.epoch)
