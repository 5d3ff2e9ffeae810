"""Build a real-width GLM-Image slice: every component at GLM-Image's real widths, dtypes, vocabularies
and token ids, with only the layer counts reduced (issue #26). Random weights, bf16, deterministic.

Command line::

    glm-grpo tiny-model OUT_DIR --real-width --ar-layers N --dit-layers M [--seed S] [--configs-from DIR|ID]

``--configs-from``: take the component configs (AR, DiT, VAE, glyph encoder, scheduler) of a GLM-Image
pipeline directory or of a Hub id the Hugging Face cache holds (never downloaded; the configs alone are
enough: ``hf download zai-org/GLM-Image --include "*.json"``) instead of the built-in ones below; only the
layer counts are replaced. The tokenizer stays the synthetic one, so the AR config must keep GLM-Image's
id layout (vocabularies and image token ids): anything else is a one-line error.

What is real and what is cut (docs/real-width.md has the table):

* AR (``GlmImageForConditionalGeneration``): transformers' ``GlmImageConfig`` defaults - hidden 4096,
  32 heads / 2 KV heads, MLP 13 696, text vocab 168 064, lm_head over 16 512 vision ids, VQ codebook
  16 384 - with ``num_hidden_layers = N`` and the vision tower (unused for text-to-image) at depth 1.
* DiT (``GlmImageTransformer2DModel``): the published GLM-Image transformer (30 layers, 32 heads x 128,
  text_embed_dim 1472; the planner's ``BUILTIN_DIT``) with ``num_layers = M``.
* VAE and ByT5 glyph encoder: the planner's ``BUILTIN_VAE`` / ``BUILTIN_GLYPH`` at full size.
* Tokenizer: the tiny one's characters (at ids 16 512 and up), padded with reserved tokens to the real
  168 064 ids, with GLM-Image's special tokens at their real ids. transformers fixes ``<|endoftext|>`` =
  pad 167 841 and ``<|image|>`` = 167 855; the ones between follow GLM-4's order shifted by the 16 512
  vision ids (GLM-4: ``<|endoftext|>`` 151 329 ... ``<|image|>`` 151 343), so ``<sop>`` / ``<eop>``
  (the grid markers) are 167 845 / 167 846. Image start / end are the real 16 384 / 16 385.

Every module is created directly in bf16 (``_from_config(dtype=...)`` / a bf16 default dtype), never
as a whole fp32 copy: the N=1, M=1 slice holds ~2 G parameters (~4 GB).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import torch

from ..memory.sizes import BUILTIN_DIT, BUILTIN_GLYPH, BUILTIN_VAE
from ..model.glm_image import AR_DIR
from .tiny import _CHARS, REAL_ROPE

VISION_VOCAB_SIZE = 16512  # lm_head rows; ids 0..16 383 are the codebook
CODEBOOK_SIZE = 16384
IMAGE_START_ID, IMAGE_END_ID = 16384, 16385
TEXT_VOCAB_SIZE = 168064
# GLM-Image's special text tokens in id order from <|endoftext|> (= transformers' pad_token_id).
SPECIALS_START = 167841
SPECIALS = [
    "<|endoftext|>",
    "[MASK]",
    "[gMASK]",
    "[sMASK]",
    "<sop>",
    "<eop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    "<|begin_of_image|>",
    "<|end_of_image|>",
    "<|begin_of_video|>",
    "<|end_of_video|>",
    "<|image|>",
]
IMAGE_TOKEN_ID = SPECIALS_START + SPECIALS.index("<|image|>")  # 167 855, transformers' default
UNK = "[UNK]"

_CHAT_TEMPLATE = (
    "[gMASK]<sop>{%- for message in messages %}{%- if message['role'] == 'user' %}<|user|>\n"
    "{%- if message['content'] is string %}{{ message['content'] }}{%- else %}"
    "{%- for item in message['content'] %}"
    "{%- if item['type'] == 'image' %}<|begin_of_image|><|image|><|end_of_image|>"
    "{%- elif item['type'] == 'text' %}{{ item['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}{%- endif %}{%- endfor %}<|assistant|>\n"
)


def slice_vocab() -> dict[str, int]:
    """Token -> id over all 168 064 text ids: vision tokens, characters, reserved fillers, specials."""
    tokens = [f"<|dit_token_{i}|>" for i in range(VISION_VOCAB_SIZE)] + [UNK] + _CHARS
    tokens += [f"<|reserved_{i}|>" for i in range(SPECIALS_START - len(tokens))] + SPECIALS
    tokens += [f"<|reserved_{i}|>" for i in range(SPECIALS_START, TEXT_VOCAB_SIZE - len(SPECIALS))]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    assert len(vocab) == TEXT_VOCAB_SIZE and vocab["<|image|>"] == IMAGE_TOKEN_ID
    return vocab


def build_slice_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = slice_vocab()
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=f"<|dit_token_{IMAGE_START_ID}|>",  # the processor's image start after the grid markers
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        unk_token=UNK,
        additional_special_tokens=[f"<|dit_token_{i}|>" for i in range(VISION_VOCAB_SIZE)] + SPECIALS[1:],
        extra_special_tokens={"image_token": "<|image|>", "grid_bos_token": "<sop>", "grid_eos_token": "<eop>"},
        padding_side="left",
        model_max_length=131072,
    )
    fast.chat_template = _CHAT_TEMPLATE
    return fast


def build_slice_processor():
    from transformers import GlmImageImageProcessor, GlmImageProcessor

    return GlmImageProcessor(
        image_processor=GlmImageImageProcessor(), tokenizer=build_slice_tokenizer(), chat_template=_CHAT_TEMPLATE
    )


def source_configs(source: str, revision: str | None = None) -> dict:
    """The component configs of the pipeline at ``source`` (a directory or a cached Hub id):
    ``{"ar": GlmImageConfig, "dit": dict, "vae": dict, "glyph": T5Config, "scheduler": dict | None}``."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, GlmImageTransformer2DModel
    from transformers import GlmImageConfig, T5Config

    from ..model.source import cached_model_dir

    root = cached_model_dir(source, revision)
    if root is None:
        raise FileNotFoundError(
            f"--configs-from {source}: not a GLM-Image pipeline directory, nor a Hub id in the Hugging Face cache "
            "(nothing is downloaded here): give a directory, or fetch the configs with "
            f'hf download {source} --include "*.json"'
        )
    ar = GlmImageConfig.from_pretrained(root / AR_DIR)
    ids = {
        "text_config.vocab_size": (ar.text_config.vocab_size, TEXT_VOCAB_SIZE),
        "text_config.vision_vocab_size": (ar.text_config.vision_vocab_size, VISION_VOCAB_SIZE),
        "image_token_id": (ar.image_token_id, IMAGE_TOKEN_ID),
        "image_start_token_id": (ar.image_start_token_id, IMAGE_START_ID),
        "image_end_token_id": (ar.image_end_token_id, IMAGE_END_ID),
    }
    for key, (theirs, ours) in ids.items():
        if theirs != ours:
            raise ValueError(
                f"--configs-from {root}: vision_language_encoder/config.json has {key}={theirs}, but the slice's "
                f"synthetic tokenizer lays out GLM-Image's ids ({key}={ours}): use a GLM-Image pipeline's configs"
            )
    scheduler = root / "scheduler"
    return {
        "ar": ar,
        "dit": dict(GlmImageTransformer2DModel.load_config(root / "transformer")),
        "vae": dict(AutoencoderKL.load_config(root / "vae")),
        "glyph": T5Config.from_pretrained(root / "text_encoder"),
        "scheduler": dict(FlowMatchEulerDiscreteScheduler.load_config(scheduler)) if scheduler.is_dir() else None,
        "root": root,
    }


def slice_ar_config(ar_layers: int, base=None, vision_layers: int = 1):
    """GLM-Image's AR config with ``ar_layers`` text layers and a ``vision_layers``-layer vision tower (the real one
    has 40, run for image-to-image only): transformers' defaults (with the GLM-4 rotary) or ``base`` (a pipeline's own
    config, see :func:`source_configs`)."""
    from transformers import GlmImageConfig

    if base is not None:
        config = base.__class__.from_dict(base.to_dict())  # a copy: the caller's stays as read
        config.text_config.num_hidden_layers = ar_layers
        config.vision_config.depth = vision_layers
        return config
    pad = SPECIALS_START
    return GlmImageConfig(
        # eos: <|endoftext|>, which lm_head (16 512 vision ids) cannot produce - as in the tiny model, so
        # random weights never end HF generate early; the rollout samples a fixed token count anyway.
        text_config={
            "num_hidden_layers": ar_layers,
            "pad_token_id": pad,
            "eos_token_id": pad,
            "rope_parameters": dict(REAL_ROPE),
        },
        vision_config={"depth": vision_layers},
        image_token_id=IMAGE_TOKEN_ID,
        image_start_token_id=IMAGE_START_ID,
        image_end_token_id=IMAGE_END_ID,
    )


@contextlib.contextmanager
def _default_dtype(dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def build_slice_components(
    ar_layers: int = 1,
    dit_layers: int = 1,
    seed: int = 0,
    configs: dict | None = None,
    device: str | None = None,
    vision_layers: int = 1,
) -> dict:
    """All seven GlmImagePipeline components of the real-width slice, in bf16 (its vision tower of ``vision_layers``
    layers); ``configs``: a pipeline's
    own (:func:`source_configs`) instead of the built-in ones. ``device``: where the weights are created and
    initialised (``cuda``: GLM-Image at its full size, 40 + 30 layers, in ~1 s instead of minutes on a CPU; the
    random weights then come from the device's generator, so they differ from a CPU build of the same seed;
    None: the default device, which a caller's ``with torch.device("meta")`` sets for a build without weights)."""
    with contextlib.nullcontext() if device is None else torch.device(device):
        return _slice_components(ar_layers, dit_layers, seed, configs, vision_layers)


def _slice_components(ar_layers: int, dit_layers: int, seed: int, configs: dict | None, vision_layers: int) -> dict:
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, GlmImageTransformer2DModel
    from transformers import ByT5Tokenizer, GenerationConfig, GlmImageForConditionalGeneration, T5Config, T5EncoderModel

    bf16 = torch.bfloat16
    torch.manual_seed(seed)
    ar_config = slice_ar_config(ar_layers, configs["ar"] if configs else None, vision_layers)
    ar = GlmImageForConditionalGeneration._from_config(ar_config, dtype=bf16)
    ar.generation_config = GenerationConfig(
        do_sample=True,
        eos_token_id=SPECIALS_START,
        pad_token_id=SPECIALS_START,
        suppress_tokens=list(range(CODEBOOK_SIZE, VISION_VOCAB_SIZE)),
    )
    torch.manual_seed(seed + 1)
    glyph = configs["glyph"] if configs else T5Config(**BUILTIN_GLYPH, decoder_start_token_id=0)
    text_encoder = T5EncoderModel._from_config(glyph, dtype=bf16)
    torch.manual_seed(seed + 2)
    with _default_dtype(bf16):
        if configs:
            transformer = GlmImageTransformer2DModel.from_config({**configs["dit"], "num_layers": dit_layers})
            torch.manual_seed(seed + 3)
            vae = AutoencoderKL.from_config(configs["vae"])
        else:
            transformer = GlmImageTransformer2DModel(**{**BUILTIN_DIT, "num_layers": dit_layers})
            torch.manual_seed(seed + 3)
            vae = AutoencoderKL(
                **BUILTIN_VAE, in_channels=3, out_channels=3, latents_mean=[0.0] * 16, latents_std=[1.0] * 16
            )
    if configs and configs["scheduler"]:
        scheduler = FlowMatchEulerDiscreteScheduler.from_config(configs["scheduler"])
    else:
        scheduler = FlowMatchEulerDiscreteScheduler(
            use_dynamic_shifting=True, base_shift=0.25, max_shift=0.75, base_image_seq_len=256, time_shift_type="linear"
        )
    return {
        "tokenizer": ByT5Tokenizer(),
        "processor": build_slice_processor(),
        "text_encoder": text_encoder,
        AR_DIR: ar,
        "vae": vae,
        "transformer": transformer,
        "scheduler": scheduler,
    }


def write_slice_configs(out_dir: str | os.PathLike, ar_layers: int = 1, dit_layers: int = 1) -> Path:
    """The slice's component configs alone (no weights, built on the ``meta`` device) in a directory the memory
    planner reads like a pipeline (glm_grpo_ds/memory/sizes.py): its plan at any layer count in seconds."""
    from diffusers import AutoencoderKL, GlmImageTransformer2DModel
    from transformers import T5Config

    out = Path(out_dir)
    slice_ar_config(ar_layers).save_pretrained(out / AR_DIR)
    with torch.device("meta"):
        GlmImageTransformer2DModel(**{**BUILTIN_DIT, "num_layers": dit_layers}).save_config(out / "transformer")
        vae = AutoencoderKL(
            **BUILTIN_VAE, in_channels=3, out_channels=3, latents_mean=[0.0] * 16, latents_std=[1.0] * 16
        )
        vae.save_config(out / "vae")
    T5Config(**BUILTIN_GLYPH, decoder_start_token_id=0).save_pretrained(out / "text_encoder")
    (out / "processor").mkdir(exist_ok=True)
    (out / "model_index.json").write_text("{}\n", encoding="utf-8")  # configs only: not loadable as a pipeline
    return out


def build_slice_pipeline(
    out_dir: str | os.PathLike,
    ar_layers: int = 1,
    dit_layers: int = 1,
    seed: int = 0,
    configs: dict | None = None,
    device: str | None = None,
) -> Path:
    """Write the slice to ``out_dir`` (created if needed) and return its path."""
    from diffusers import GlmImagePipeline

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pipe = GlmImagePipeline(**build_slice_components(ar_layers, dit_layers, seed, configs, device))
    pipe.save_pretrained(out, safe_serialization=True)
    return out


if __name__ == "__main__":  # quick timing: python -m glm_grpo_ds.testing.slice OUT [N M]
    import resource
    import sys

    t0 = time.time()
    args = [int(a) for a in sys.argv[2:4]] or [1, 1]
    path = build_slice_pipeline(sys.argv[1], *args)
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"{path}: {size / 2**30:.2f} GiB in {time.time() - t0:.0f} s, peak RSS {rss:.2f} GiB")
