"""Tiny vision-language models with random weights, written offline for the ``vqa`` reward's tests (rewards/vqa.py):
transformers' own Qwen2-VL and Gemma 3 classes at a few thousand parameters, each with a character-level tokenizer
(one token per character, one per listed word, the family's chat and image special tokens) and a chat template of
the family's layout. Gemma 3's processor wants one list of images per prompt and its template writes the BOS token
itself; Qwen2-VL's takes a flat list and adds no BOS: the two ways a processor differs that the reward must meet.

    build_tiny_vlm(out_dir, family="qwen2_vl")   # or "gemma3": config.json, model.safetensors, the processor's files
"""

from __future__ import annotations

import os
from pathlib import Path

WORDS = ["Yes", "No", "yes", "no", "Does", "this", "figure", "show", "Please", "answer", "user", "assistant", "model"]
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>"]
QWEN_SPECIALS += ["<|image_pad|>", "<|video_pad|>"]
QWEN_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for c in m['content'] %}{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
GEMMA_SPECIALS = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>"]
GEMMA_SPECIALS += ["<image_soft_token>"]
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{% for c in m['content'] %}{% if c['type'] == 'image' %}<start_of_image>{% elif c['type'] == 'text' %}"
    "{{ c['text'] }}{% endif %}{% endfor %}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def build_tokenizer(specials: list[str], template: str, bos: str | None = None, **named):
    """A fast tokenizer over ``specials``, the printable characters and :data:`WORDS`; with ``bos`` it adds that
    token in front of every text it encodes with special tokens (as Gemma's does)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    chars = [chr(i) for i in range(32, 127)] + ["\n"]
    vocab = {t: i for i, t in enumerate(["[UNK]"] + specials + chars + [w for w in WORDS if w not in chars])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[A-Za-z]+|[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(specials)  # matched whole before the split
    if bos:
        tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, vocab[bos])])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", bos_token=bos, model_max_length=4096, **named
    )
    fast.chat_template = template
    return fast


def qwen_processor(processor_class, max_tokens: int):
    """A Qwen2-VL-family processor (``processor_class``: Qwen2VLProcessor, Qwen2_5_VLProcessor) over the
    character-level tokenizer, its images at most ``max_tokens`` merged 28-px tokens (at least 4)."""
    from transformers import Qwen2VLImageProcessor, Qwen2VLVideoProcessor

    tokenizer = build_tokenizer(QWEN_SPECIALS, QWEN_TEMPLATE, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    images = Qwen2VLImageProcessor(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * max_tokens)
    return processor_class(
        image_processor=images,
        tokenizer=tokenizer,
        video_processor=Qwen2VLVideoProcessor(),
        chat_template=QWEN_TEMPLATE,
    )


def _qwen2_vl():
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLProcessor

    processor = qwen_processor(Qwen2VLProcessor, 16)
    vocab = processor.tokenizer.get_vocab()
    text = dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2)
    text |= dict(num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    text |= dict(rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]}, bos_token_id=None, eos_token_id=None)
    config = Qwen2VLConfig(
        text_config=text,
        vision_config=dict(depth=2, embed_dim=32, hidden_size=32, num_heads=4, mlp_ratio=2),
        image_token_id=vocab["<|image_pad|>"],
        video_token_id=vocab["<|video_pad|>"],
        vision_start_token_id=vocab["<|vision_start|>"],
        vision_end_token_id=vocab["<|vision_end|>"],
    )
    return Qwen2VLForConditionalGeneration, config, processor


def _gemma3():
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3ImageProcessor, Gemma3Processor

    named = dict(eos_token="<eos>", pad_token="<pad>")
    named["extra_special_tokens"] = dict(
        image_token="<image_soft_token>", boi_token="<start_of_image>", eoi_token="<end_of_image>"
    )
    tokenizer = build_tokenizer(GEMMA_SPECIALS, GEMMA_TEMPLATE, bos="<bos>", **named)
    images = Gemma3ImageProcessor(size={"height": 28, "width": 28}, do_pan_and_scan=False)
    processor = Gemma3Processor(
        image_processor=images, tokenizer=tokenizer, chat_template=GEMMA_TEMPLATE, image_seq_length=4
    )
    vocab = tokenizer.get_vocab()
    text = dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2, head_dim=8)
    text |= dict(num_attention_heads=4, num_key_value_heads=2, sliding_window=64)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=28)
    config = Gemma3Config(
        text_config=text,
        vision_config=dict(vision, patch_size=7),
        mm_tokens_per_image=4,
        boi_token_index=vocab["<start_of_image>"],
        eoi_token_index=vocab["<end_of_image>"],
        image_token_index=vocab["<image_soft_token>"],
    )
    return Gemma3ForConditionalGeneration, config, processor


FAMILIES = {"qwen2_vl": _qwen2_vl, "gemma3": _gemma3}


def build_tiny_vlm(out_dir: str | os.PathLike, family: str = "qwen2_vl", seed: int = 0) -> Path:
    """A ``family`` model (:data:`FAMILIES`) of 2 text and 2 vision layers (width 32) with random weights (``seed``)
    and its processor, saved in ``out_dir`` as ``save_pretrained`` writes them."""
    import torch

    model_class, config, processor = FAMILIES[family]()
    torch.manual_seed(seed)
    model = model_class(config).eval()
    out = Path(out_dir)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out
