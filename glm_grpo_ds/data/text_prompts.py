"""A small generated set of text-rendering prompts with their target strings, for the offline text-rendering
benchmark (``glm-grpo evaluate --rewards ocr_word_accuracy ocr_region_ned``) and its tests.

    glm-grpo text-prompts outputs/text_prompts.jsonl [--num 32] [--seed 0]   # glm_grpo_ds/commands/text_prompts.py

Each row: ``prompt`` (the texts quoted, as GLM-Image reads glyphs), ``text`` (the list of regions, in order)
and ``category`` (``one_region`` / ``two_regions``). Deterministic in ``seed``. CVTG-2K or LongText-Bench
prompt files work the same way when you have them (a ``text`` column, or quoted spans in the prompts).
"""

from __future__ import annotations

import random

SURFACES = ("shop sign", "poster", "book cover", "street sign", "label on a jar", "banner", "chalkboard", "mug")
WORDS = (
    "OPEN", "CLOSED", "SALE", "COFFEE", "BAKERY", "EXIT", "HELLO", "WORLD", "FRESH", "BREAD", "NIGHT", "MARKET",
    "GARDEN", "RIVER", "STATION", "MUSEUM", "LIBRARY", "WELCOME", "SUMMER", "WINTER", "NORTH", "SOUTH", "BOOKS", "TEA",
)  # fmt: skip


def text_prompts(num: int = 32, seed: int = 0) -> list[dict]:
    """``num`` rows (see the module docstring); every third has two regions."""
    if num < 1:
        raise ValueError(f"--num must be >= 1, got {num}")
    rng = random.Random(seed)
    rows = []
    for i in range(num):
        surface = rng.choice(SURFACES)
        first = " ".join(rng.sample(WORDS, rng.randint(1, 3)))
        if i % 3 == 2:
            second = " ".join(rng.sample(WORDS, 2))
            prompt = f'A {surface} with the title "{first}" and below it "{second}"'
            rows.append({"prompt": prompt, "text": [first, second], "category": "two_regions"})
        else:
            rows.append({"prompt": f'A {surface} that says "{first}"', "text": [first], "category": "one_region"})
    return rows
