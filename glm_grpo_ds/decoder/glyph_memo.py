"""The glyph encoder run once per text of a decode, not once per image.

diffusers' ``GlmImagePipeline`` encodes the quoted text of every prompt of a call with the glyph encoder (ByT5), one
forward per prompt, and the empty negative prompt once more per image when guided: a DiT batch of rows of one prompt
(the decoder never mixes prompts: image_decoder.py) encodes the same two texts 2 x rows times, each forward a few ms
of launches and two host synchronisations that drain the device's queue. :class:`GlyphMemo` stands in for the
pipeline's ``_get_glyph_embeds``: a call whose prompts are all one text is that text's embedding, encoded once per
decode and repeated, which is what diffusers builds for such a call (each prompt encoded alone, all of one length,
so no padding): the same bits (tests/integration/test_decoder.py)."""

from __future__ import annotations

from collections.abc import Callable

import torch


class GlyphMemo:
    def __init__(self, encode: Callable[..., torch.Tensor]):
        self._encode = encode
        self._kept: dict[tuple, torch.Tensor] = {}

    def forget(self) -> None:
        """Drop the kept embeddings (at the end of a decode: the next one has other prompts)."""
        self._kept.clear()

    def __call__(self, prompt=None, max_sequence_length: int = 2048, device=None, dtype=None) -> torch.Tensor:
        texts = [prompt] if isinstance(prompt, str) else list(prompt)
        if len(set(texts)) != 1:  # several texts: padded to a common length by diffusers, as before
            return self._encode(prompt, max_sequence_length, device, dtype)
        key = (texts[0], max_sequence_length, device, dtype)
        if key not in self._kept:
            self._kept[key] = self._encode(texts[:1], max_sequence_length, device, dtype)
        return self._kept[key].expand(len(texts), *self._kept[key].shape[1:]).clone()
