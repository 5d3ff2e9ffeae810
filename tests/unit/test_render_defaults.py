"""`glm-grpo render`'s defaults are the model's own (issue #27): the size its DiT was made for (the
transformer's sample_size, else diffusers' 128, x the VAE's down-sampling), the pipeline's step count and
guidance; every option's default shows in --help."""

import json

import pytest

from glm_grpo_ds.commands import render


def _pipeline_configs(root, vae_blocks, sample_size=None):
    (root / "transformer").mkdir(parents=True)
    (root / "vae").mkdir()
    transformer = {"patch_size": 2} | ({"sample_size": sample_size} if sample_size else {})
    (root / "transformer" / "config.json").write_text(json.dumps(transformer))
    (root / "vae" / "config.json").write_text(json.dumps({"block_out_channels": [8] * vae_blocks}))
    return root


def test_glm_image_renders_1024_at_50_steps_by_default(tmp_path):
    # GLM-Image's transformer config has no sample_size (diffusers falls back to 128), its VAE 4 blocks (x8)
    d = render.model_defaults(_pipeline_configs(tmp_path, vae_blocks=4))
    assert d == {"height": 1024, "width": 1024, "num_inference_steps": 50, "guidance_scale": 1.5}


def test_a_sample_size_in_the_config_and_a_smaller_vae_scale_the_default(tmp_path):
    d = render.model_defaults(_pipeline_configs(tmp_path, vae_blocks=3, sample_size=32))
    assert (d["height"], d["width"]) == (32 * 4, 32 * 4)


def test_help_shows_every_default(capsys):
    with pytest.raises(SystemExit) as stop:
        render.main(["--help"])
    assert stop.value.code == 0
    text = " ".join(capsys.readouterr().out.split("options:", 1)[1].split())
    for flag in ("--height", "--width", "--steps", "--guidance", "--seed", "--dtype", "--device", "--out"):
        after = text.split(f"{flag} ", 1)[1]
        assert "(default:" in after.split(" --", 1)[0], flag
    assert "1024 for GLM-Image" in text and "index.jsonl" in text
