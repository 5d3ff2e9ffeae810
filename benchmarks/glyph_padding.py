"""Is one batched forward of the DiT's conditional and unconditional passes lossless? The two passes' glyph
embeddings differ in length, so a batch pads the shorter with zeros (left, as GlmImagePipeline pads prompts); this
prints how far the image tokens' output moves, without a mask and with the transformer's own ``attention_mask``,
on the tiny GLM-Image's random DiT (docs/memory-and-speed.md "The DiT decode").

    python benchmarks/glyph_padding.py [--glyph 5] [--pad 7] [--seed 0]
"""

from __future__ import annotations

import argparse
import os


def padding_gaps(glyph_tokens: int = 5, pad: int = 7, seed: int = 0) -> dict[str, float]:
    """``{"scale", "unmasked", "masked"}``: the mean |output| of the DiT on ``glyph_tokens`` glyph tokens alone, and
    the largest change of its output when ``pad`` zero tokens are padded in front, without and with a mask."""
    import torch

    from glm_grpo_ds.testing.tiny import build_tiny_components

    dit = build_tiny_components(seed=seed)["transformer"].float().eval()
    cfg = dit.config
    g = torch.Generator().manual_seed(seed)
    side = 8  # latent side of a 64x64 image
    latents = torch.randn(1, cfg.in_channels, side, side, generator=g)
    glyph = torch.randn(1, glyph_tokens, cfg.text_embed_dim, generator=g)
    padded = torch.cat([torch.zeros(1, pad, cfg.text_embed_dim), glyph], 1)
    mask = torch.cat([torch.zeros(1, pad), torch.ones(1, glyph_tokens)], 1)
    prior = torch.randint(0, 16, (1, (side // cfg.patch_size) ** 2), generator=g)
    common = dict(
        prior_token_id=prior,
        prior_token_drop=torch.zeros_like(prior, dtype=torch.bool),
        timestep=torch.tensor([500.0]),
        target_size=torch.tensor([[64.0, 64.0]]),
        crop_coords=torch.zeros(1, 2),
        return_dict=False,
    )
    with torch.no_grad():
        alone = dit(hidden_states=latents, encoder_hidden_states=glyph, **common)[0]
        unmasked = dit(hidden_states=latents, encoder_hidden_states=padded, **common)[0]
        masked = dit(hidden_states=latents, encoder_hidden_states=padded, attention_mask=mask, **common)[0]
    return {
        "scale": float(alone.abs().mean()),
        "unmasked": float((unmasked - alone).abs().max()),
        "masked": float((masked - alone).abs().max()),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/glyph_padding.py", description=__doc__.splitlines()[0])
    p.add_argument("--glyph", type=int, default=5, help="glyph tokens of the conditional pass")
    p.add_argument("--pad", type=int, default=7, help="zero tokens padded in front of them")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    gaps = padding_gaps(a.glyph, a.pad, a.seed)
    print(f"DiT output, {a.glyph} glyph tokens alone: mean |x| {gaps['scale']:.4f}")
    print(f"  {a.pad} zero tokens padded in front, no mask:      max |diff| {gaps['unmasked']:.2e}")
    print(f"  the same with the transformer's attention_mask: max |diff| {gaps['masked']:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
