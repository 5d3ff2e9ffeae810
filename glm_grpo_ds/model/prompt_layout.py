"""GLM-Image's text-to-image prompt layout: prompts -> the AR's chat-templated, left-padded input ids with the target
and preview grids the processor derives from the image size. The rollout (glm_grpo_ds/rollout/generate.py) samples
from it; the startup check of token ids (glm_grpo_ds/model/token_ids.py) tokenises the template with it."""

from __future__ import annotations


def build_prompt_inputs(processor, prompts: list[str], height: int, width: int, device=None) -> dict:
    """Chat-template, tokenise and left-pad text-to-image prompts for the AR.

    Returns ``input_ids``, ``attention_mask`` ``[P, L]``, ``image_grid_thw`` ``[2P, 3]`` (per prompt:
    target grid, preview grid) and ``images_per_sample`` ``[P]``.
    """
    if height % 32 or width % 32 or height <= 0 or width <= 0:
        raise ValueError(f"height and width must be positive multiples of 32, got {height}x{width}")
    messages = [[{"role": "user", "content": [{"type": "text", "text": p}]}] for p in prompts]
    inputs = processor.apply_chat_template(
        messages,
        tokenize=True,
        return_dict=True,
        return_tensors="pt",
        processor_kwargs={"padding": True, "target_h": height, "target_w": width},
    )
    if processor.tokenizer.padding_side != "left" and len(prompts) > 1:
        raise ValueError("the GLM-Image tokenizer must pad on the left for batched rollouts")
    keys = ("input_ids", "attention_mask", "image_grid_thw", "images_per_sample")
    return {k: inputs[k].to(device) if device is not None else inputs[k] for k in keys}
