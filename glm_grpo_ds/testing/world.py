"""A learnable tiny GLM-Image world: a decoder that paints each visual token as a colour block,
prompts that ask for colour layouts, and a reward that checks the image against its prompt.

The random tiny DiT barely reacts to its prior tokens, so no policy can visibly learn on it. Here the
tiny pipeline's DiT and VAE get hand-set weights (same diffusers classes, same ``GlmImagePipeline``
code path, saved with ``save_pretrained``) so that

* codebook id ``k`` paints its 32x32 image cell in colour ``PALETTE[k % 8]`` (the corners of the RGB
  cube: black, red, green, yellow, blue, magenta, cyan, white), exactly: every pixel is 0 or 1;
* the image does not depend on the decoder noise, the number of denoising steps or the guidance
  scale (> 0): the DiT predicts a velocity from the prior tokens alone, the flow-matching Euler steps
  move the noise latent by ``g*8`` per channel (noise stays ~N(0,1), far from the sign flip), and
  the VAE decoder saturates each channel to 0 or 1 by its sign.

How the weights do it (tiny sizes; ``build_world_components`` checks the shapes):

* DiT: the latent projection and every block's AdaLN modulation are zero, so the blocks add nothing
  (gates 0) and the hidden state is the prior-token path only. ``prior_token_embedding[k]`` holds
  ``(+3s, -3s)`` pairs for the colour's RGB signs ``s``; the SiLU MLP of ``prior_projector`` turns
  each pair into ``silu(3s) - silu(-3s) = 3s`` and mirrors it (zero mean, so the output LayerNorm
  keeps signs); ``proj_out`` writes ``-8*s`` to every latent pixel of the patch. A dropped prior
  (classifier-free guidance's unconditional pass) gives velocity 0.
* VAE decoder: ``post_quant_conv`` identity, ``conv_in`` writes ``(L, -L)`` channel pairs, every
  ResNet and attention residual branch is zero, upsampling convs are identity, the final GroupNorm
  normalises each (L, -L) pair (mean 0, sign kept), and ``conv_out`` reads ``silu(n) - silu(-n) = n``
  times 20, which the pipeline's [-1, 1] -> [0, 1] post-processing clamps to 0 or 1.

The AR is the tiny pipeline's random AR with three changes: a word-level tokenizer (the world's words
are single tokens), a layer-0 attention that looks at the colour words of the prompt (see
:func:`_set_prompt_focus`: the stand-in for a pretrained model that reads its prompt), and an
``lm_head`` scaled by ``LM_HEAD_GAIN`` (see :func:`build_world_components`). What to paint for which
colour word is left to learn.

Prompts name colours and layouts ("red image", "red on the left, blue on the right", ...); the
``colour_layout`` reward (glm_grpo_ds/rewards/colour_layout.py) scores ``1 - mean |image - target|``:
1 is the asked layout, a uniformly random token grid scores 0.5, and different prompts need
different grids (:func:`world_prompts`). ``best.json`` holds the best reward per prompt, computed from
the palette the decoder really renders (1.0 for every prompt here), so progress is
``(reward - start) / (best - start)``.

Limits: the 8 one-colour prompts (``train.jsonl``) are learned in ~60 GRPO steps and the policy then
follows their held-out rephrasings (``heldout.jsonl``); two-colour layouts (``layouts.jsonl``) need
the policy to bind each colour word to a half of the image, which the 2-layer tiny AR, whose focus
sees the colour words as a bag, learns only slowly.

The seeds' layout (:func:`write_seed_layout`, ``--seed-layout``): the train prompts as ``prompts.txt`` with a
``target_images/`` folder (each image the colour layout its line asks for) and a tiny CLIP with an aesthetic
head, so the seeds' reward mix (lpips, ssim, ocr, aesthetic: launch/configs/seed_recipe.yaml) runs offline here.

Command line (writes the pipeline, train/held-out prompt files and prints the best reward)::

    glm-grpo tiny-world outputs/world [--seed 0] [--seed-layout]
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import torch

from ..model.glm_image import AR_DIR
from ..rewards.colour_layout import CELL, COLOURS, best_reward
from .tiny import CODEBOOK_SIZE, build_tiny_components, build_vae

PALETTE = list(COLOURS)  # codebook id k paints PALETTE[k % 8]
LATENT_STEP = 8.0  # |velocity| per latent channel: the final latent is noise + guidance * 8 * sign
PIXEL_GAIN = 20.0  # VAE output before the pipeline's clamp; any |value| > 1 saturates
LM_HEAD_GAIN = 5.0  # see build_world_components
WORLD_SIZE = 64  # default image side: a 2x2 grid of cells
WORLD_COLOURS = ("red", "green", "blue", "yellow")  # the colours of the default prompt set
# The world's tokenizer has these as whole-word tokens (tiny.build_tokenizer(words=...)).
WORLD_WORDS = tuple(COLOURS) + (
    "image",
    "on",
    "the",
    "left",
    "right",
    "top",
    "at",
    "bottom",
    "a",
    "square",
    "background",
)


def token_colour(token_id: int) -> str:
    return PALETTE[token_id % len(PALETTE)]


def cell_colours(images: torch.Tensor) -> torch.Tensor:
    """``[N, 3, H, W]`` -> ``[N, H/32, W/32, 3]`` mean colour of each cell."""
    n, _, h, w = images.shape
    return images.reshape(n, 3, h // CELL, CELL, w // CELL, CELL).mean(dim=(3, 5)).permute(0, 2, 3, 1)


def world_prompts(colours=tuple(COLOURS)) -> dict[str, list[str]]:
    """The world's prompt sets:

    * ``train``: ``"<colour> image"`` for every colour - no single token grid scores above 0.5 (the
      random start) on all 8, so the reward rises only if the policy follows the prompt;
    * ``heldout``: the same asks in words never trained on (``"red on the left, red on the right"``,
      ``"blue on top, blue at the bottom"``), alternating the two phrasings;
    * ``layouts``: two different colours left/right or top/bottom over ``WORLD_COLOURS`` - this needs
      the policy to bind each colour to its half, which the 2-layer tiny AR learns only slowly.
    """
    train = [f"{c} image" for c in colours]
    heldout = [
        (f"{c} on the left, {c} on the right", f"{c} on top, {c} at the bottom")[i % 2] for i, c in enumerate(colours)
    ]
    layouts = []
    for a, b in itertools.permutations(WORLD_COLOURS, 2):
        layouts += [f"{a} on the left, {b} on the right", f"{a} on top, {b} at the bottom"]
    return {"train": train, "heldout": heldout, "layouts": layouts}


# ----------------------------------------------------------------------------- decoder weights
def _set_dit(transformer) -> None:
    cfg = transformer.config
    inner = cfg.num_attention_heads * cfg.attention_head_dim
    p, out_ch = cfg.patch_size, cfg.out_channels
    if inner < 8 or out_ch < 3 or cfg.prior_vq_quantizer_codebook_size != CODEBOOK_SIZE:
        raise ValueError("tiny-world DiT needs inner_dim >= 8, out_channels >= 3 and the tiny codebook")
    with torch.no_grad():
        for param in transformer.parameters():
            param.zero_()
        emb = transformer.prior_token_embedding.weight  # [K, inner]
        for k in range(CODEBOOK_SIZE):
            signs = torch.tensor(COLOURS[token_colour(k)], dtype=torch.float32) * 2 - 1
            for c in range(3):
                emb[k, 2 * c], emb[k, 2 * c + 1] = 3 * signs[c], -3 * signs[c]
        lin1, lin2 = transformer.prior_projector.net[0].proj, transformer.prior_projector.net[2]
        lin1.weight.copy_(torch.eye(inner))
        for c in range(3):  # h[c] = silu(e[2c]) - silu(e[2c+1]) = 3s ; h[3+c] = -h[c] (zero mean)
            lin2.weight[c, 2 * c], lin2.weight[c, 2 * c + 1] = 1.0, -1.0
            lin2.weight[3 + c, 2 * c], lin2.weight[3 + c, 2 * c + 1] = -1.0, 1.0
        # After the output LayerNorm h[c] = 3s / std(h); std(h) = sqrt(6 * 9 / inner).
        normed = 3.0 / (6 * 9 / inner) ** 0.5
        for c in range(3):
            for j in range(p * p):  # proj_out rows are (channel, py, px)
                transformer.proj_out.weight[c * p * p + j, c] = -LATENT_STEP / normed


def _identity_tap(conv, in_idx=None, gains=None) -> None:
    """A 3x3 (or 1x1) conv that reads only its centre pixel: ``out[o] = sum gains * in[in_idx]``."""
    w = conv.weight
    w.zero_()
    if conv.bias is not None:
        conv.bias.zero_()
    cy, cx = w.shape[2] // 2, w.shape[3] // 2
    if in_idx is None:
        for o in range(min(w.shape[0], w.shape[1])):
            w[o, o, cy, cx] = 1.0
    else:
        for o, (i, g) in enumerate(zip(in_idx, gains)):
            if i is not None:
                w[o, i, cy, cx] = g


def _set_vae(vae) -> None:
    from diffusers.models.attention_processor import Attention
    from diffusers.models.resnet import ResnetBlock2D
    from diffusers.models.upsampling import Upsample2D

    dec = vae.decoder
    ch = dec.conv_in.out_channels
    groups = dec.conv_norm_out.num_groups
    if ch // groups != 2 or ch < 6 or any(b != ch for b in vae.config.block_out_channels):
        raise ValueError("tiny-world VAE needs equal block channels (>= 6) in groups of 2")
    with torch.no_grad():
        _identity_tap(vae.post_quant_conv)
        # (L0, -L0, L1, -L1, L2, -L2, 0, ...): each GroupNorm group is one (x, -x) pair.
        _identity_tap(dec.conv_in, [0, 0, 1, 1, 2, 2] + [None] * (ch - 6), [1, -1, 1, -1, 1, -1] + [0] * (ch - 6))
        for module in dec.modules():
            if isinstance(module, ResnetBlock2D):
                module.conv2.weight.zero_()
                module.conv2.bias.zero_()
            elif isinstance(module, Attention):
                module.to_out[0].weight.zero_()
                module.to_out[0].bias.zero_()
            elif isinstance(module, Upsample2D):
                _identity_tap(module.conv)
        dec.conv_norm_out.weight.fill_(1.0)
        dec.conv_norm_out.bias.zero_()
        w = dec.conv_out.weight
        w.zero_()
        dec.conv_out.bias.zero_()
        cy, cx = w.shape[2] // 2, w.shape[3] // 2
        for c in range(3):  # silu(n) - silu(-n) = n
            w[c, 2 * c, cy, cx], w[c, 2 * c + 1, cy, cx] = PIXEL_GAIN, -PIXEL_GAIN


# ----------------------------------------------------------------------------- AR prompt focus
FOCUS_DIM = 7  # a query/key dim in every head whose rotary pair (7, 15) turns slowest: ~position-free
FLAG = 0.05  # the flag's size in the embedding's last dim (init entries have std 0.02)
FOCUS_KEY, FOCUS_QUERY = 12.0, 4.0  # attention logit on a flagged token: 12 * 4 / sqrt(16) = 12


def _set_prompt_focus(ar, flagged_ids: list[int]) -> None:
    """Make every layer-0 head attend (almost only) to the ``flagged_ids`` tokens of the prompt.

    A random 2-layer AR spreads attention evenly over ~10 prompt tokens and ~256 preview tokens, so
    the grid positions barely see the prompt (measured: 2 % of the first layer's output at a grid
    position depends on the prompt) and GRPO could not learn to follow it. A pretrained model reads
    its prompt; here the embedding's last dim carries a flag (+FLAG on the colour words, -FLAG on
    every other token), every key's FOCUS_DIM reads it (FOCUS_KEY on flagged tokens, ~0 elsewhere),
    and every query has a constant FOCUS_QUERY there. FOCUS_DIM's rotary frequency is the lowest, so
    the logit hardly depends on distance. The values and everything else stay random.
    """
    lm = ar.model.language_model
    attn, emb = lm.layers[0].self_attn, lm.embed_tokens.weight
    head_dim, flag_dim = attn.head_dim, emb.shape[1] - 1
    with torch.no_grad():
        emb[:, flag_dim] = -FLAG
        emb[flagged_ids, flag_dim] = FLAG
        # the input RMSNorm divides by each row's rms: the flag reads as about +-u afterwards
        u = (FLAG / emb.pow(2).mean(dim=1).sqrt()).mean().item() * lm.layers[0].input_layernorm.weight[flag_dim].item()
        for kv_head in range(attn.k_proj.out_features // head_dim):
            row = kv_head * head_dim + FOCUS_DIM
            attn.k_proj.weight[row].zero_()
            attn.k_proj.weight[row, flag_dim] = FOCUS_KEY / (2 * u)
            attn.k_proj.bias[row] = FOCUS_KEY / 2
        for head in range(attn.q_proj.out_features // head_dim):
            row = head * head_dim + FOCUS_DIM
            attn.q_proj.weight[row].zero_()
            attn.q_proj.bias[row] = FOCUS_QUERY


def build_world_components(seed: int = 0) -> dict:
    """The tiny pipeline's components (same AR, tokenizers, scheduler) with the world's decoder."""
    parts = build_tiny_components(seed, words=WORLD_WORDS)
    vocab = parts["processor"].tokenizer.get_vocab()
    _set_prompt_focus(parts[AR_DIR], [vocab[c] for c in COLOURS])
    with torch.no_grad():
        # transformers' init (std 0.02) caps the tiny AR's logits at about +-1.3 after the final norm, and
        # LoRA does not train lm_head: no adapter could make the policy confident. A trained model's head
        # is larger; LM_HEAD_GAIN gives logits of std ~0.8 at init (entropy stays near uniform).
        parts[AR_DIR].lm_head.weight.mul_(LM_HEAD_GAIN)
    _set_dit(parts["transformer"])
    vae = build_vae(block_out_channels=(8, 8, 8, 8))  # equal stages: the residual paths carry the signal
    _set_vae(vae)
    parts["vae"] = vae
    return parts


def build_world_pipeline(out_dir, seed: int = 0) -> Path:
    from diffusers import GlmImagePipeline

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    GlmImagePipeline(**build_world_components(seed)).save_pretrained(out, safe_serialization=True)
    return out


def measure_palette(decoder, height: int = CELL * 2, width: int = CELL * 2) -> torch.Tensor:
    """``[K, 3]``: the mean colour the decoder really renders for a uniform grid of each codebook id."""
    from ..rollout import upsample_grid

    h, w = height // CELL, width // CELL
    grids = torch.arange(CODEBOOK_SIZE).view(-1, 1).expand(-1, h * w)
    images = decoder.decode(upsample_grid(grids, h, w), ["palette"] * CODEBOOK_SIZE, height, width, [0] * CODEBOOK_SIZE)
    return images.mean(dim=(2, 3)).cpu()


def write_world(out_dir, seed: int = 0, height: int = WORLD_SIZE, width: int = WORLD_SIZE) -> dict:
    """Pipeline in ``out_dir/model``, prompts in ``out_dir/{train,heldout,layouts}.jsonl`` (see
    :func:`world_prompts`), and ``out_dir/best.json`` (best reward per prompt, from the rendered palette)."""
    from ..config import DecoderConfig
    from ..decoder import ImageDecoder

    out = Path(out_dir)
    model = build_world_pipeline(out / "model", seed)
    prompt_sets = world_prompts()
    decoder = ImageDecoder(model, DecoderConfig(num_inference_steps=1, guidance_scale=1.0), "cpu")
    palette = measure_palette(decoder)
    best = {p: best_reward(p, palette, height, width) for prompts in prompt_sets.values() for p in prompts}
    for name, prompts in prompt_sets.items():
        (out / f"{name}.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts), encoding="utf-8")
    summary = {"height": height, "width": width, "best": best, "palette": palette.tolist()}
    (out / "best.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    return summary


SEED_LAYOUT = "seed_layout"  # the folder of write_seed_layout, under the world's


def write_seed_layout(out_dir, height: int = WORLD_SIZE, width: int = WORLD_SIZE, seed: int = 0) -> Path:
    """The seeds' data layout of the world's train prompts in ``out_dir``: ``prompts.txt`` (line n: the n-th
    train prompt with its colour word quoted after it, ``red image "RED"``, so the ``ocr`` reward has a text to
    compare - the world's decoder paints no letters, so OCR scores it 0 and only the likeness rewards teach here),
    ``target_images/<n>.png`` numbered from 1 (the colour layout line n asks for, what ``colour_layout`` scores
    1), and for the ``aesthetic`` reward a random tiny CLIP (``clip/``) with a random head
    (``aesthetic_head.safetensors``; glm_grpo_ds/testing/tiny_clip.py). Returns the ``prompts.txt`` path."""
    from PIL import Image

    from ..rewards.colour_layout import prompt_target
    from .tiny_clip import write_aesthetic_head, write_tiny_clip

    out = Path(out_dir)
    folder = out / "target_images"
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for number, prompt in enumerate(world_prompts()["train"], start=1):
        target = (prompt_target(prompt, height, width) * 255).to(torch.uint8).permute(1, 2, 0).contiguous()
        Image.fromarray(target.numpy(), "RGB").save(folder / f"{number}.png")
        lines.append(f'{prompt} "{prompt.split()[0].upper()}"')
    (out / "prompts.txt").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    clip = write_tiny_clip(out / "clip", seed=seed)
    write_aesthetic_head(out / "aesthetic_head.safetensors", dim=clip_projection_dim(clip), seed=seed)
    return out / "prompts.txt"


def clip_projection_dim(clip_dir) -> int:
    """The image-embedding width of a saved CLIP (what an aesthetic head reads)."""
    return json.loads((Path(clip_dir) / "config.json").read_text(encoding="utf-8"))["projection_dim"]
