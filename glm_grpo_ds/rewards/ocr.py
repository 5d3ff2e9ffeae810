"""``ocr``: does the image show the text it should? RapidOCR (models ship inside the wheel,
offline) reads the image; the score is 1 - normalised Levenshtein distance (rapidfuzz) between what
it read and the text to render: the dataset row's ``text``, else the prompt's quoted spans as
GLM-Image extracts them. NaN when there is no text to render.

Args: ``case_sensitive`` (default false), ``min_confidence`` (drop OCR boxes below it, default 0.5).
Its onnxruntime sessions use this rank's share of the node's cores (glm_grpo_ds/threads.py).
Needs the ``ocr`` extra: ``pip install glm-grpo-ds[ocr]``.
"""

from __future__ import annotations

import torch

from ..threads import cores_per_local_rank
from .base import TEXT_TO_RENDER, normalise_text, text_to_render


class OCRReward:
    needs = TEXT_TO_RENDER  # undefined (NaN) for samples without it

    def __init__(self, case_sensitive: bool = False, min_confidence: float = 0.5):
        try:
            from rapidocr_onnxruntime import RapidOCR
        except ImportError:
            raise ValueError(
                "reward ocr needs rapidocr-onnxruntime and rapidfuzz: pip install 'glm-grpo-ds[ocr]'"
            ) from None
        # onnxruntime's sessions default to one thread per core, in every rank of the node
        n = cores_per_local_rank()
        self.engine = RapidOCR(intra_op_num_threads=n, inter_op_num_threads=n)
        self.case_sensitive, self.min_confidence = case_sensitive, min_confidence

    def read(self, image: torch.Tensor) -> str:
        """Text found in one ``[3, H, W]`` image in [0, 1], boxes in reading order."""
        arr = (image.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).cpu().numpy()
        result, _ = self.engine(arr)
        boxes = [r for r in (result or []) if float(r[2]) >= self.min_confidence]
        # reading order: top to bottom (by the box's top edge, in text-line steps), then left to right
        boxes.sort(key=lambda r: (round(min(p[1] for p in r[0]) / 10), min(p[0] for p in r[0])))
        return " ".join(r[1] for r in boxes)

    def __call__(self, images: torch.Tensor, prompts: list[str], samples: list[dict]) -> torch.Tensor:
        from rapidfuzz.distance import Levenshtein

        out = torch.full((images.shape[0],), float("nan"))
        for i, (prompt, sample) in enumerate(zip(prompts, samples)):
            expected = text_to_render(prompt, sample)
            if expected is None:
                continue
            found = normalise_text(self.read(images[i]), self.case_sensitive)
            out[i] = 1.0 - Levenshtein.normalized_distance(found, normalise_text(expected, self.case_sensitive))
        return out.to(images.device)
