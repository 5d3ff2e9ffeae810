"""Tiny random CLIP checkpoints (transformers format) and aesthetic heads, written offline.

For tests and benchmarks of the CLIP-family rewards; real runs point the rewards at real
checkpoints (see glm_grpo_ds/rewards/clip.py).

    from glm_grpo_ds.testing.tiny_clip import write_tiny_clip, write_aesthetic_head
    write_tiny_clip("/tmp/clip")                 # or size="base" for a random ViT-B/32-sized model
"""

from __future__ import annotations

import string
from pathlib import Path

import torch


def _tokenizer():
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tokens = ["<pad>", "<unk>", "<bos>", "<eos>"] + list(string.ascii_lowercase + string.digits + " '.,!?")
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A <eos>", special_tokens=[("<bos>", 2), ("<eos>", 3)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", bos_token="<bos>", eos_token="<eos>"
    ), len(vocab)


def write_tiny_clip(out_dir, seed: int = 0, size: str = "tiny") -> Path:
    """A random CLIPModel + tokenizer + CLIPImageProcessor in ``out_dir``. ``size``: ``tiny``
    (32 px, 2 layers) or ``base`` (ViT-B/32 dimensions, for speed measurements)."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    tokenizer, vocab = _tokenizer()
    if size == "tiny":
        text = dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=64
        )
        vision = dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=32,
            patch_size=8,
        )
        proj, px = 16, 32
    else:
        text = dict(max_position_embeddings=77)
        vision = dict(image_size=224, patch_size=32)
        proj, px = 512, 224
    text.update(vocab_size=vocab, bos_token_id=2, eos_token_id=3, pad_token_id=0)
    torch.manual_seed(seed)
    model = CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=proj))
    out = Path(out_dir)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    CLIPImageProcessor(size={"shortest_edge": px}, crop_size={"height": px, "width": px}).save_pretrained(out)
    return out


def write_aesthetic_head(path, dim: int, seed: int = 0) -> Path:
    """A random LAION-style aesthetic MLP head (``.pth`` or ``.safetensors``)."""
    from ..rewards.clip import AestheticHead

    torch.manual_seed(seed)
    state = AestheticHead(dim).state_dict()
    p = Path(path)
    if p.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(state, p)
    else:
        torch.save(state, p)
    return p
