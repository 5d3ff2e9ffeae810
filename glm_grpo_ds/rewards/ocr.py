"""``ocr``: does the image show the text it should? RapidOCR (models ship inside the wheel,
offline) reads the image; the score is 1 - normalised Levenshtein distance (rapidfuzz) between what
it read and the text to render: the dataset row's ``text``, else the prompt's quoted spans as
GLM-Image extracts them. NaN when there is no text to render.

Two more scores for text-rendering benchmarks (``glm-grpo evaluate --rewards ocr_word_accuracy ocr_region_ned``),
per text region - each quoted span of the prompt, or each entry of the row's ``text`` when it is a list:

* ``ocr_word_accuracy``: the fraction of the regions' words that the OCR read (each read occurrence counts
  once), as CVTG-2K / LongText-Bench report word accuracy;
* ``ocr_region_ned``: per region, 1 - the normalised edit distance to the closest stretch of what the OCR
  read (rapidfuzz's partial alignment), averaged over regions.

Both ignore spaces: RapidOCR often reads a line's words without them ("FRESHBREAD"), so a word counts as
read when it occurs in the OCR's text with the spaces taken out.

Both approximate the official scorers, which use other OCR models (docs/evaluate.md).

Args: ``case_sensitive`` (default false), ``min_confidence`` (drop OCR boxes below it, default 0.5).
Its onnxruntime sessions use this rank's share of the node's cores (glm_grpo_ds/runtime/threads.py).
Needs the ``ocr`` extra: ``pip install glm-grpo-ds[ocr]``.
"""

from __future__ import annotations

import torch

from ..runtime.threads import cores_per_local_rank
from .base import TEXT_TO_RENDER, RewardError, glyph_texts, normalise_text, text_to_render
from .model_files import check_installed


def text_regions(prompt: str, sample: dict) -> list[str] | None:
    """The texts the image should show, one per region: the row's ``text`` (a list: one region each), else the
    prompt's quoted spans; None if neither."""
    text = sample.get("text")
    if isinstance(text, (list, tuple)):
        regions = [str(t) for t in text if str(t).strip()]
    elif text:
        regions = [str(text)]
    else:
        regions = [s for s in glyph_texts(prompt) if s.strip()]
    return regions or None


def reading_order(boxes: list) -> list:
    """RapidOCR's ``(corner points, text, confidence)`` boxes in reading order: lines top to bottom, each box joining
    the line whose vertical extent holds its centre, then left to right within a line. (Fixed bands of the top edge
    put two words of one line in different lines when their tops straddle a band's edge: a pixel of jitter.)"""
    lines: list[list] = []  # [top, bottom, [(left, box), ...]]
    for box in sorted(boxes, key=lambda r: sum(p[1] for p in r[0]) / len(r[0])):
        ys, left = [p[1] for p in box[0]], min(p[0] for p in box[0])
        top, bottom = min(ys), max(ys)
        if lines and lines[-1][0] <= (top + bottom) / 2 <= lines[-1][1]:
            lines[-1][2].append((left, box))
        else:
            lines.append([top, bottom, [(left, box)]])
    return [box for _, _, line in lines for _, box in sorted(line, key=lambda b: b[0])]


class OCRReward:
    needs = TEXT_TO_RENDER  # undefined (NaN) for samples without it

    @staticmethod
    def check_args(args: dict) -> None:
        confidence = args.get("min_confidence", 0.5)
        if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0 <= confidence <= 1:
            raise RewardError(f"reward ocr: min_confidence {confidence!r} must be a number in [0, 1] (default 0.5)")
        check_installed("ocr", "rapidocr_onnxruntime", "rapidfuzz", extra="ocr")

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
        # RapidOCR takes an array as OpenCV's BGR (it converts only files and PIL images from RGB): red and blue
        # swapped change the contrast of coloured text its models were trained on
        result, _ = self.engine(arr[..., ::-1].copy())
        boxes = [r for r in (result or []) if float(r[2]) >= self.min_confidence]
        return " ".join(r[1] for r in reading_order(boxes))

    def __call__(self, images: torch.Tensor, prompts: list[str], samples: list[dict]) -> torch.Tensor:
        out = torch.full((images.shape[0],), float("nan"))
        for i, (prompt, sample) in enumerate(zip(prompts, samples)):
            value = self.score(images[i], prompt, sample)
            if value is not None:
                out[i] = value
        return out.to(images.device)

    def score(self, image: torch.Tensor, prompt: str, sample: dict) -> float | None:
        """One image's score; None (NaN) without text to render. The OCR runs only when there is some."""
        from rapidfuzz.distance import Levenshtein

        expected = text_to_render(prompt, sample)
        if expected is None:
            return None
        found = normalise_text(self.read(image), self.case_sensitive)
        return 1.0 - Levenshtein.normalized_distance(found, normalise_text(expected, self.case_sensitive))


def compact(text: str, case_sensitive: bool) -> str:
    """The text without whitespace (and lower-cased unless ``case_sensitive``)."""
    return normalise_text(text, case_sensitive).replace(" ", "")


class OCRWordAccuracy(OCRReward):
    """The fraction of the regions' words found in what the OCR read (each read occurrence counts once)."""

    def score(self, image: torch.Tensor, prompt: str, sample: dict) -> float | None:
        regions = text_regions(prompt, sample)
        wanted = [w for r in regions or [] for w in normalise_text(r, self.case_sensitive).split()]
        if not wanted:
            return None
        read = compact(self.read(image), self.case_sensitive)
        found = 0
        for word in sorted(wanted, key=len, reverse=True):  # long words first: "BREAD" before "READ"
            if word in read:
                read = read.replace(word, "\0", 1)  # each read occurrence counts once
                found += 1
        return found / len(wanted)


class OCRRegionNED(OCRReward):
    """Per region, 1 - normalised edit distance to the best-aligned stretch of the OCR's text; mean over regions."""

    def score(self, image: torch.Tensor, prompt: str, sample: dict) -> float | None:
        from rapidfuzz import fuzz
        from rapidfuzz.distance import Levenshtein

        regions = text_regions(prompt, sample)
        if regions is None:
            return None
        read = compact(self.read(image), self.case_sensitive)
        scores = []
        for region in regions:
            want = compact(region, self.case_sensitive)
            align = fuzz.partial_ratio_alignment(want, read) if read else None
            stretch = read[align.dest_start : align.dest_end] if align is not None else ""
            scores.append(1.0 - Levenshtein.normalized_distance(want, stretch))
        return sum(scores) / len(scores)
