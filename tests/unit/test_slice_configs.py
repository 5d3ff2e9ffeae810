"""`glm-grpo tiny-model --real-width --configs-from DIR` (issue #26): the slice takes a pipeline's own
component configs and changes only the layer counts; a pipeline whose ids the slice's synthetic tokenizer
cannot lay out is a one-line error. Built on the meta device: no weights, seconds."""

import json

import pytest
import torch

from glm_grpo_ds.commands.tiny import tiny_model
from glm_grpo_ds.memory.sizes import BUILTIN_DIT, BUILTIN_GLYPH, BUILTIN_VAE
from glm_grpo_ds.testing import slice as real


def _configs_only_pipeline(root):
    """What `hf download zai-org/GLM-Image --include "*.json"` leaves: configs, no weights; with values
    the built-in configs do not have, so the test sees where each came from."""
    from diffusers import FlowMatchEulerDiscreteScheduler
    from transformers import T5Config

    root.mkdir()
    (root / "model_index.json").write_text("{}")
    (root / "processor").mkdir()
    ar = real.slice_ar_config(40)
    ar.text_config.rope_parameters = {**ar.text_config.rope_parameters, "rope_theta": 12345.0}
    ar.save_pretrained(root / "vision_language_encoder")
    (root / "transformer").mkdir()
    dit = {**BUILTIN_DIT, "num_layers": 30, "time_embed_dim": 256, "_class_name": "GlmImageTransformer2DModel"}
    (root / "transformer" / "config.json").write_text(json.dumps(dit))
    (root / "vae").mkdir()
    vae = {**BUILTIN_VAE, "in_channels": 3, "out_channels": 3, "scaling_factor": 0.5, "_class_name": "AutoencoderKL"}
    (root / "vae" / "config.json").write_text(json.dumps(vae))
    T5Config(**{**BUILTIN_GLYPH, "dropout_rate": 0.25}).save_pretrained(root / "text_encoder")
    FlowMatchEulerDiscreteScheduler(shift=2.5).save_config(root / "scheduler")
    return root


def test_the_slice_keeps_the_sources_configs_but_the_layer_counts(tmp_path):
    configs = real.source_configs(str(_configs_only_pipeline(tmp_path / "glm")))
    with torch.device("meta"):
        parts = real.build_slice_components(ar_layers=2, dit_layers=3, configs=configs)
    text = parts["vision_language_encoder"].config.text_config
    assert text.num_hidden_layers == 2 and text.rope_parameters["rope_theta"] == 12345.0
    assert parts["vision_language_encoder"].config.vision_config.depth == 1
    assert configs["ar"].text_config.num_hidden_layers == 40  # the source's config is not changed
    dit = parts["transformer"].config
    assert (dit.num_layers, dit.time_embed_dim, dit.attention_head_dim) == (3, 256, BUILTIN_DIT["attention_head_dim"])
    assert parts["vae"].config.scaling_factor == 0.5
    assert parts["text_encoder"].config.dropout_rate == 0.25
    assert parts["scheduler"].config.shift == 2.5
    assert len(parts["transformer"].transformer_blocks) == 3


def test_the_built_in_configs_stay_the_default():
    with torch.device("meta"):
        parts = real.build_slice_components(ar_layers=1, dit_layers=1)
    import inspect

    from diffusers import GlmImageTransformer2DModel

    class_default = inspect.signature(GlmImageTransformer2DModel.__init__).parameters["time_embed_dim"].default
    assert parts["transformer"].config.time_embed_dim == BUILTIN_DIT.get("time_embed_dim", class_default) != 256
    assert parts["scheduler"].config.shift == 1.0


def test_a_pipeline_with_other_token_ids_or_none_at_all_is_one_line(tiny_model_dir, tmp_path, capsys):
    with pytest.raises(ValueError, match=r"text_config.vocab_size=\d+, but the slice's synthetic tokenizer"):
        real.source_configs(str(tiny_model_dir))
    out = str(tmp_path / "slice")
    assert tiny_model([out, "--real-width", "--configs-from", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("glm-grpo tiny-model: --configs-from") and "\n" not in err
    with pytest.raises(SystemExit):
        tiny_model([out, "--configs-from", str(tiny_model_dir)])  # needs --real-width


def test_the_weights_are_made_on_the_device_asked_for(tmp_path, capsys):
    """--device cuda builds GLM-Image at full size on the GPU (launch/gpu_timing.sh): the components are created
    under that device. `meta` stands in here; a device this machine lacks or cannot save from is one line, exit 2,
    nothing written."""
    parts = real.build_slice_components(ar_layers=1, dit_layers=1, device="meta")
    for name in ("vision_language_encoder", "transformer", "vae", "text_encoder"):
        assert {p.device.type for p in parts[name].parameters()} == {"meta"}, name
    out = tmp_path / "full"
    cases = [("cuda", "no CUDA device on this machine")] if not torch.cuda.is_available() else []
    cases += [("meta", "meta weights cannot be saved"), ("banana", "not a device name")]
    for device, message in cases:
        assert tiny_model([str(out), "--real-width", "--device", device]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"glm-grpo tiny-model: --device {device}: {message}") and "\n" not in err, err
        assert not out.exists()
    with pytest.raises(SystemExit):
        tiny_model([str(out), "--device", "cpu"])  # needs --real-width
