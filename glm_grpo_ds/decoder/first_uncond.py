"""The DiT's unconditional pass at the first denoising step, computed once per group instead of once per image.

With guidance, each step runs the DiT twice: on the prior tokens (conditional) and with every prior token dropped and
the empty prompt (unconditional). At the first step the unconditional pass sees only the initial noise, the empty
prompt's embedding and the first timestep (diffusers' ``prior_token_drop`` zeroes the tokens' embedding), and the
trainer gives the G rows of a group one noise seed (glm_grpo_ds/runtime/seeding.py): its output is one row's,
repeated. :class:`FirstUncond` runs it on the first row of a pipeline call whose rows share a seed and repeats it,
and keeps it for the group's next DiT batch: at G=16 and 8 guided steps that skips 15 of 256 image-passes (6 %; 8 %
with guidance on the first half of the steps). The images equal the unshared decode's up to the rounding of a DiT
batch of 1 against one of n rows (the module docstring of image_decoder.py; tests/integration/test_decoder.py).
Rows of several seeds in one call (an evaluation's fixed seeds) are decoded as before."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterator

import torch


class FirstUncond:
    """Wraps the DiT's ``forward``; :meth:`pipeline_call` marks each pipeline call with the key its rows share."""

    def __init__(self, pipe, forward: Callable):
        self.pipe, self._forward = pipe, forward
        self._key: Hashable | None = None
        self._calls = 0
        self._kept: dict[Hashable, tuple] = {}

    @contextlib.contextmanager
    def pipeline_call(self, key: Hashable | None) -> Iterator[None]:
        """Around one pipeline call: ``key`` (prompt, seed, size, settings) when every row has the same first
        unconditional input, None when not (nothing shared)."""
        self._key, self._calls = key, 0
        try:
            yield
        finally:
            self._key = None

    def forget(self) -> None:
        """Drop the kept outputs (at the end of a decode: the next one has other seeds)."""
        self._kept.clear()

    def __call__(self, *args, **kwargs):
        self._calls += 1
        # diffusers' loop calls the DiT conditional first, then unconditional when guided: the second call of a
        # pipeline call is the first step's unconditional pass exactly when the pipeline guides that step
        shared = self._key is not None and self._calls == 2 and self.pipe.do_classifier_free_guidance
        if args or not shared or kwargs.get("return_dict", True):
            return self._forward(*args, **kwargs)
        n = kwargs["hidden_states"].shape[0]
        kept = self._kept.get(self._key)
        if kept is None:
            first = {k: v[:1] if torch.is_tensor(v) and v.dim() and v.shape[0] == n else v for k, v in kwargs.items()}
            kept = self._kept[self._key] = tuple(self._forward(**first))
        # repeated into new tensors: what the pipeline does with its output never reaches the kept one
        return tuple(t.expand(n, *t.shape[1:]).clone() if torch.is_tensor(t) else t for t in kept)
