"""A checkpoint whose files lack a weight is refused with one line naming the directory and a weight, by every loader
of model weights (runtime/loading_info.py): the AR (model/policy.load_ar: training, evaluate, merge), the decoder's
components (decoder/image_decoder.load_component) and the CLIP-family rewards (rewards/clip.py). transformers and
diffusers would fill the weight with random values, saying so only in their own log."""

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from glm_grpo_ds.config import ConfigError
from glm_grpo_ds.decoder.image_decoder import load_component
from glm_grpo_ds.model.policy import load_ar
from glm_grpo_ds.rewards import RewardError
from glm_grpo_ds.rewards.clip import CLIPScorer
from glm_grpo_ds.testing.tiny_clip import write_tiny_clip


def _drop(folder: Path, part: str) -> str:
    """Remove the first tensor whose name holds ``part`` from ``folder``'s safetensors file; its name."""
    (path,) = folder.glob("*.safetensors")
    tensors = load_file(path)
    name = next(k for k in tensors if part in k)
    del tensors[name]
    save_file(tensors, path, metadata={"format": "pt"})
    return name


@pytest.fixture
def copy_of(tiny_model_dir, tmp_path):
    shutil.copytree(tiny_model_dir, tmp_path / "model")
    return tmp_path / "model"


def test_the_whole_checkpoint_loads(tiny_model_dir):
    assert load_ar(tiny_model_dir) is not None
    assert load_component(Path(tiny_model_dir), "transformer", torch.float32, torch.device("cpu")) is not None


def test_an_ar_without_a_weight_is_refused_naming_it(copy_of):
    name = _drop(copy_of / "vision_language_encoder", "q_proj")
    with pytest.raises(ConfigError, match=rf"vision_language_encoder: 1 weight is not in its files \({name}\)"):
        load_ar(copy_of)


@pytest.mark.parametrize("component, part", [("transformer", "image_projector"), ("text_encoder", "")])
def test_a_decoder_component_without_a_weight_is_refused(copy_of, component, part):
    _drop(copy_of / component, part)
    with pytest.raises(ConfigError, match=rf"{component}: .*not in its files.*random values"):
        load_component(copy_of, component, torch.float32, torch.device("cpu"))


def test_a_clip_reward_model_without_a_weight_is_refused(tmp_path):
    clip_dir = write_tiny_clip(tmp_path / "clip")
    assert CLIPScorer(str(clip_dir)) is not None
    name = _drop(Path(clip_dir), "visual_projection")
    with pytest.raises(RewardError, match=rf"CLIP model .*: 1 weight is not in its files \({name}\)"):
        CLIPScorer(str(clip_dir))


@pytest.mark.parametrize("component, part", [("vision_language_encoder", "q_proj"), ("transformer", "image_projector")])
def test_render_refuses_a_pipeline_without_a_weight_in_one_line(copy_of, tmp_path, capsys, component, part):
    """``glm-grpo render`` calls diffusers' pipeline, whose own ``from_pretrained`` filled an AR weight at random
    (a DiT's left on the meta device ended in a traceback)."""
    from glm_grpo_ds.commands import render

    _drop(copy_of / component, part)
    args = ["--model", str(copy_of), "--prompt", "a cat", "--height", "32", "--width", "32", "--steps", "1"]
    args += ["--guidance", "1.5"]
    assert render.main(args + ["--out", str(tmp_path / "out")]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "glm-grpo" in line]  # in-process: loading bars too
    assert len(err) == 1 and f"{component}: " in err[0] and "not in its files" in err[0], err
    assert not (tmp_path / "out").exists()
