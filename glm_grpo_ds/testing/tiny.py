"""Build a complete, offline, random-weight tiny GLM-Image pipeline directory.

The directory loads with ``diffusers.GlmImagePipeline.from_pretrained(DIR)`` under
``HF_HUB_OFFLINE=1`` and renders 64x64 / 64x96 images on a CPU in seconds. It is the
embedded default model of the demo and of every test: nothing is downloaded.

Command line::

    glm-grpo tiny-model OUT_DIR [--seed N]

Library::

    from glm_grpo_ds.testing.tiny import build_tiny_pipeline
    build_tiny_pipeline("/tmp/tiny", seed=0)

Layout of the tiny vocabularies (mirrors the real model at a smaller scale):

* codebook ids ``0 .. CODEBOOK_SIZE-1`` are visual tokens (real model: 16 384; here 16, so a
  policy can find good tokens within a CPU-minutes training run);
* ``CODEBOOK_SIZE`` / ``CODEBOOK_SIZE+1`` are image start / end (real: 16 384 / 16 385);
* ``lm_head`` covers ``VISION_VOCAB_SIZE`` ids (real: 16 512), so a few non-codebook ids
  exist that the sampler must mask, exactly as with the real model;
* text-only tokens (chat markers, characters, eos/pad) live above the vision vocabulary, so
  the AR's ``eos_token_id`` can never be produced by ``lm_head``: random weights cannot end
  generation early.

Learnability. A random tiny DiT barely reacts to its prior tokens: the prior embedding is one small
term added to the patch embeddings, and layer norms wash it out. We scale the DiT's prior-token
embedding by ``PRIOR_EMBED_GAIN`` so the tokens steer the denoising, which makes pixel rewards such
as likeness to a target image depend on the sampled grid - the real path (AR sampling -> DiT
decode -> reward on pixels) stays untouched.

The tokenizer is character level (a ``tokenizers`` WordLevel model over single characters),
so distinct prompts give distinct token sequences - a word-level vocabulary built offline
would map most words to ``[UNK]`` and make every prompt look the same to the policy. A closed
world whose prompts use a known set of words (``glm_grpo_ds/testing/world.py``) passes ``words``:
those become single tokens, and any other run of letters is ``[UNK]``.
"""

from __future__ import annotations

import os
import string
from pathlib import Path

import torch

from ..model.glm_image import AR_DIR

CODEBOOK_SIZE = 16
PRIOR_EMBED_GAIN = 30.0
IMAGE_START_ID = CODEBOOK_SIZE
IMAGE_END_ID = CODEBOOK_SIZE + 1
VISION_VOCAB_SIZE = CODEBOOK_SIZE + 8
# The AR's rotary embedding as GLM-Image's config has it (GLM-4 style: rotary on half of each 128-wide
# head, its 32 frequencies split 8/12/12 over time/height/width). transformers' bare default has no
# partial_rotary_factor (= 1.0), which fails at head_dim 128: the M-RoPE sections sum to 32, not 64.
REAL_ROPE = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [8, 12, 12], "partial_rotary_factor": 0.5}

# Text special tokens, in id order after the vision vocabulary.
_TEXT_SPECIALS = ["<|endoftext|>", "[UNK]", "[gMASK]", "<|user|>", "<|assistant|>", "<|image|>", "<sop>", "<eop>"]
_CHARS = [c for c in string.printable if c not in "\t\r\x0b\x0c"]

_CHAT_TEMPLATE = (
    "[gMASK]{%- for message in messages %}{%- if message['role'] == 'user' %}<|user|>\n"
    "{%- if message['content'] is string %}{{ message['content'] }}{%- else %}"
    "{%- for item in message['content'] %}"
    "{%- if item['type'] == 'image' %}" + f"<|dit_token_{IMAGE_START_ID}|><|image|><|dit_token_{IMAGE_END_ID}|>"
    "{%- elif item['type'] == 'text' %}{{ item['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}{%- endif %}{%- endfor %}<|assistant|>\n"
)


def tiny_vocab(words: tuple[str, ...] = ()) -> dict[str, int]:
    tokens = [f"<|dit_token_{i}|>" for i in range(VISION_VOCAB_SIZE)] + _TEXT_SPECIALS + _CHARS
    # a word that is already a token (the one-letter word "a" is also a character) keeps that token's id:
    # listing it twice would give the later words ids one past the embedding sized len(vocab)
    tokens += [w for w in dict.fromkeys(words) if w not in set(tokens)]
    return {tok: i for i, tok in enumerate(tokens)}


def build_tokenizer(words: tuple[str, ...] = ()):
    """Fast tokenizer with GLM-Image's image / grid special tokens: one token per character, or, with
    ``words``, one per run of letters (a listed word, else ``[UNK]``) and one per other character."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = tiny_vocab(words)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    # Special tokens are matched before this split.
    pattern = r"[A-Za-z]+|[\s\S]" if words else r"[\s\S]"
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    tok.decoder = decoders.Fuse()
    specials = [t for t in vocab if t.startswith("<|dit_token_")] + _TEXT_SPECIALS
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        # The processor appends bos_token after the grid markers: for GLM-Image that is the
        # image-start token, after which the AR writes the preview grid.
        bos_token=f"<|dit_token_{IMAGE_START_ID}|>",
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        unk_token="[UNK]",
        additional_special_tokens=specials,
        extra_special_tokens={"image_token": "<|image|>", "grid_bos_token": "<sop>", "grid_eos_token": "<eop>"},
        padding_side="left",
        model_max_length=4096,
    )
    fast.chat_template = _CHAT_TEMPLATE
    return fast


def build_processor(words: tuple[str, ...] = ()):
    from transformers import GlmImageImageProcessor, GlmImageProcessor

    tokenizer = build_tokenizer(words)
    image_processor = GlmImageImageProcessor(
        patch_size=8,
        temporal_patch_size=1,
        merge_size=1,
        size={"shortest_edge": 32 * 32, "longest_edge": 256 * 256},
    )
    return GlmImageProcessor(image_processor=image_processor, tokenizer=tokenizer, chat_template=_CHAT_TEMPLATE)


def build_ar_config(text_vocab_size: int, pad_id: int, eos_id: int, full_size: bool = False):
    from transformers import GlmImageConfig

    if full_size:
        # GLM-Image's real AR (transformers' defaults: 40 layers x 4096, 168 064 text ids, lm_head over
        # 16 512 vision ids, 40-layer vision tower) around the tiny vocabulary layout: the real compute
        # and memory per token with random weights, for GPU benchmarks. Only the VQ codebook stays
        # tiny, so the sampler's codebook mask matches the tiny DiT.
        return GlmImageConfig(
            text_config={"pad_token_id": pad_id, "eos_token_id": eos_id, "rope_parameters": dict(REAL_ROPE)},
            vq_config={"num_embeddings": CODEBOOK_SIZE},
            image_token_id=tiny_vocab()["<|image|>"],
            image_start_token_id=IMAGE_START_ID,
            image_end_token_id=IMAGE_END_ID,
        )
    return GlmImageConfig(
        text_config={
            "vocab_size": text_vocab_size,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 2048,
            "vision_vocab_size": VISION_VOCAB_SIZE,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 2, 2]},
            "pad_token_id": pad_id,
            "eos_token_id": eos_id,
        },
        vision_config={
            "depth": 1,
            "hidden_size": 32,
            "num_heads": 2,
            "image_size": 64,
            "patch_size": 8,
            "intermediate_size": 64,
        },
        vq_config={"embed_dim": 16, "num_embeddings": CODEBOOK_SIZE, "latent_channels": 32},
        image_token_id=tiny_vocab()["<|image|>"],
        image_start_token_id=IMAGE_START_ID,
        image_end_token_id=IMAGE_END_ID,
    )


def build_vae(block_out_channels=(8, 8, 16, 16)):
    """The tiny 4-stage VAE (x8 down/up-sampling, 4 latent channels, GroupNorm in groups of 4)."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        block_out_channels=block_out_channels,
        in_channels=3,
        out_channels=3,
        down_block_types=["DownEncoderBlock2D"] * 4,
        up_block_types=["UpDecoderBlock2D"] * 4,
        latent_channels=4,
        norm_num_groups=4,
        sample_size=64,
        latents_mean=[0.0] * 4,
        latents_std=[1.0] * 4,
    )


def build_tiny_ar(ar_config, eos_id: int, full_size: bool = False):
    """The AR of ``ar_config`` with random weights from torch's current seed (``full_size``: 10 B parameters in bf16,
    20 GB, initialised on the GPU when there is one). Plain ``GlmImagePipeline.__call__`` samples with HF generate:
    its generation config forbids the non-codebook ids there too, so the tiny pipeline never hands the DiT an id
    outside its codebook."""
    from transformers import GenerationConfig, GlmImageForConditionalGeneration

    if full_size:
        with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
            ar = GlmImageForConditionalGeneration._from_config(ar_config, dtype=torch.bfloat16).cpu()
    else:
        ar = GlmImageForConditionalGeneration(ar_config)
    ar.generation_config = GenerationConfig(
        do_sample=True,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        suppress_tokens=list(range(CODEBOOK_SIZE, ar_config.text_config.vision_vocab_size)),
    )
    return ar


def build_glyph_encoder(vocab_size: int):
    """The glyph encoder (a one-layer T5 encoder of width 32) with random weights from torch's current seed."""
    from transformers import T5Config, T5EncoderModel

    return T5EncoderModel(
        T5Config(
            vocab_size=vocab_size,
            d_model=32,
            d_kv=8,
            d_ff=64,
            num_layers=1,
            num_heads=4,
            relative_attention_num_buckets=8,
            decoder_start_token_id=0,
        )
    )


def build_dit():
    """The two-layer DiT with random weights from torch's current seed, its prior-token embedding scaled by
    :data:`PRIOR_EMBED_GAIN`. patch_size x vae_scale_factor must be 16: the AR grid is H/32, upsampled x2 to H/16."""
    from diffusers import GlmImageTransformer2DModel

    transformer = GlmImageTransformer2DModel(
        patch_size=2,
        in_channels=4,
        out_channels=4,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=4,
        text_embed_dim=32,
        time_embed_dim=32,
        condition_dim=8,
        prior_vq_quantizer_codebook_size=CODEBOOK_SIZE,
    )
    with torch.no_grad():
        transformer.prior_token_embedding.weight.mul_(PRIOR_EMBED_GAIN)
    return transformer


def build_tiny_components(seed: int = 0, full_size_ar: bool = False, words: tuple[str, ...] = ()) -> dict:
    """All seven GlmImagePipeline components with deterministic random weights (``full_size_ar``:
    the AR at GLM-Image's real size in bf16, built on the GPU when there is one; ``words``: whole-word
    tokens, see :func:`build_tokenizer`); each model drawn from its own seed."""
    from diffusers import FlowMatchEulerDiscreteScheduler
    from transformers import ByT5Tokenizer

    processor = build_processor(words)
    vocab = tiny_vocab(words)
    eos_id = vocab["<|endoftext|>"]

    torch.manual_seed(seed)
    ar = build_tiny_ar(build_ar_config(len(vocab), eos_id, eos_id, full_size=full_size_ar), eos_id, full_size_ar)
    glyph_tokenizer = ByT5Tokenizer()
    torch.manual_seed(seed + 1)
    text_encoder = build_glyph_encoder(len(glyph_tokenizer))
    torch.manual_seed(seed + 2)
    transformer = build_dit()
    torch.manual_seed(seed + 3)
    vae = build_vae()
    scheduler = FlowMatchEulerDiscreteScheduler(
        use_dynamic_shifting=True, base_shift=0.25, max_shift=0.75, base_image_seq_len=256, time_shift_type="linear"
    )
    return {
        "tokenizer": glyph_tokenizer,
        "processor": processor,
        "text_encoder": text_encoder,
        AR_DIR: ar,
        "vae": vae,
        "transformer": transformer,
        "scheduler": scheduler,
    }


def build_tiny_pipeline(out_dir: str | os.PathLike, seed: int = 0, full_size_ar: bool = False) -> Path:
    """Write the tiny pipeline to ``out_dir`` (created if needed) and return its path."""
    from diffusers import GlmImagePipeline

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pipe = GlmImagePipeline(**build_tiny_components(seed, full_size_ar))
    pipe.save_pretrained(out, safe_serialization=True)
    return out


def lora_policy(model_dir, dtype: torch.dtype = torch.float32, b_std: float = 0.05):
    """The tiny AR of ``model_dir`` with r=4 adapters whose lora_B are drawn from N(0, b_std), each with a seed of
    its own (its name's length), so the adapters change the logits (peft starts B at zero; ``b_std`` 0 keeps
    that): the policy of the rollout, adapter-dtype and evaluate tests and of benchmarks/sampler_gap.py."""
    from ..config import LoraConfig
    from ..model.policy import load_policy

    model = load_policy(model_dir, dtype, "sdpa", LoraConfig(r=4, alpha=8), False)
    if b_std:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, b_std, generator=torch.Generator().manual_seed(len(name)))
    return model
