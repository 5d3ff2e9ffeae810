"""A tiny Qwen2-VL with random weights, written offline for the ``vqa`` reward's tests (rewards/vqa.py): transformers'
own Qwen2-VL classes at a few thousand parameters, a character-level tokenizer (one token per character, one per
listed word, Qwen's chat and vision special tokens) and a chat template of Qwen's layout.

    build_tiny_vlm(out_dir)   # config.json, model.safetensors, the processor's files
"""

from __future__ import annotations

import os
from pathlib import Path

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>"]
SPECIALS += ["<|video_pad|>"]
WORDS = ["Yes", "No", "yes", "no", "Does", "this", "figure", "show", "Please", "answer", "user", "assistant"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for c in m['content'] %}{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_processor():
    """Qwen2-VL's processor with a character-level tokenizer; images of 4 to 16 merged 28-pixel patches."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import (
        PreTrainedTokenizerFast,
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
    )

    chars = [chr(i) for i in range(32, 127)] + ["\n"]
    vocab = {t: i for i, t in enumerate(["[UNK]"] + SPECIALS + chars + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[A-Za-z]+|[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="[UNK]",
        additional_special_tokens=SPECIALS,
        model_max_length=4096,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    images = Qwen2VLImageProcessor(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16)
    return Qwen2VLProcessor(
        image_processor=images,
        tokenizer=tokenizer,
        video_processor=Qwen2VLVideoProcessor(),
        chat_template=CHAT_TEMPLATE,
    )


def build_tiny_vlm(out_dir: str | os.PathLike, seed: int = 0) -> Path:
    """A Qwen2-VL of 2 text and 2 vision layers (width 32) with random weights (``seed``) and its processor, saved in
    ``out_dir`` as ``save_pretrained`` writes them."""
    import torch
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    processor = build_processor()
    vocab = processor.tokenizer.get_vocab()
    text = dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2)
    text |= dict(num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    text |= dict(rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]}, bos_token_id=None, eos_token_id=None)
    vision = dict(depth=2, embed_dim=32, hidden_size=32, num_heads=4, mlp_ratio=2)
    config = Qwen2VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=vocab["<|image_pad|>"],
        video_token_id=vocab["<|video_pad|>"],
        vision_start_token_id=vocab["<|vision_start|>"],
        vision_end_token_id=vocab["<|vision_end|>"],
    )
    torch.manual_seed(seed)
    model = Qwen2VLForConditionalGeneration(config).eval()
    out = Path(out_dir)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out
