"""Startup check that every token id the rollout can feed the AR has a row in its embedding.

A tokenizer whose ids run past the AR's ``text_config.vocab_size`` (a processor from another model,
or a vocabulary that lists a token twice) otherwise fails mid-run, in the first rollout that meets
such a prompt, as a raw ``IndexError: index out of range in self``. Used by glm_grpo_ds/train.py
(before any model loads) and ``glm-grpo render``; tested in tests/unit/test_token_ids.py.
"""

from __future__ import annotations

from pathlib import Path

from ..data.rows import DataError
from .glm_image import read_ar_config
from .prompt_layout import build_prompt_inputs


def embedding_rows(model_dir: Path) -> int:
    """Rows of the AR's input embedding, from the pipeline directory's config (no weights read)."""
    return int(read_ar_config(model_dir)["text_config"]["vocab_size"])


def check_token_ids(processor, rows: int, model_dir, prompts, where: str, height: int, width: int) -> None:
    """Raise :class:`DataError` (one line) when a token id the rollout would use is ``>= rows``.

    When the tokenizer's largest id fits, every prompt does and nothing is tokenised; otherwise the
    chat template's own tokens are checked, then each prompt (``prompts``: PromptRows or strings)
    in order, and the first one whose ids do not fit is named.
    """
    tok = processor.tokenizer
    largest = max(tok.get_vocab().values())
    if largest < rows:
        return
    fix = (
        f"the tokenizer in {model_dir} has ids up to {largest} but its AR embedding has {rows} rows "
        "(text_config.vocab_size): use the processor/tokenizer that belongs to this model"
    )
    template = build_prompt_inputs(processor, [""], height, width)["input_ids"]
    if int(template.max()) >= rows:
        bad = int(template.max())
        raise DataError(f"model.path: the chat template's token {tok.convert_ids_to_tokens(bad)!r} (id {bad}): {fix}")
    for i, row in enumerate(prompts):
        text = row if isinstance(row, str) else row.prompt
        ids = tok(text, add_special_tokens=False)["input_ids"]
        bad = [t for t in ids if t >= rows]
        if bad:
            index = i if isinstance(row, str) else row.index
            raise DataError(
                f"{where} row {index}: prompt token {tok.convert_ids_to_tokens(bad[0])!r} (id {bad[0]}) "
                f"is outside the AR's embedding; {fix}"
            )
