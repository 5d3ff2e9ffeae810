"""A reward's model files, libraries and argument names are checked before any model loads, each in one line that
names the argument and how to get what is missing (glm_grpo_ds/rewards/model_files.py, the ``check_args`` of the
built-in rewards, ``check_reward_specs``)."""

import os
import subprocess
import sys

import pytest

from glm_grpo_ds.config import RewardSpec
from glm_grpo_ds.rewards import RewardError, build_reward, check_reward_specs
from glm_grpo_ds.rewards.model_files import check_installed


def _clip_dir(tmp_path):
    d = tmp_path / "clip"
    d.mkdir()
    (d / "config.json").write_text("{}")
    return d


def _error(name: str, args: dict) -> str:
    with pytest.raises(RewardError) as err:
        check_reward_specs([RewardSpec(name=name, args=args)])
    message = str(err.value)
    assert "\n" not in message
    return message


def test_aesthetic_without_args_names_them_and_where_to_set_them():
    message = _error("aesthetic", {})
    assert message.startswith("rewards[0]: reward aesthetic needs args clip_model: ")
    assert "openai/clip-vit-large-patch14" in message and "--reward-arg clip_model=" in message
    # `glm-grpo score` builds through the same check: the message names the arguments there too
    with pytest.raises(RewardError, match="reward aesthetic needs args clip_model"):
        build_reward("aesthetic", {})


def test_a_missing_clip_directory_says_how_to_download_it(tmp_path):
    missing = tmp_path / "models" / "clip-vit-large-patch14"
    message = _error("aesthetic", {"clip_model": str(missing), "head": "h.pth"})
    assert f"clip_model {missing} does not exist" in message
    assert f"hf download openai/clip-vit-large-patch14 --local-dir {missing}" in message
    assert "; head h.pth does not exist; get it with `wget -O h.pth " in message  # both files in one line


def test_a_directory_without_config_json_is_refused(tmp_path):
    message = _error("clip", {"model": str(tmp_path)})
    assert "is not a transformers checkpoint directory (no config.json in it)" in message


def test_the_head_file_is_checked_with_its_download_address(tmp_path):
    clip = _clip_dir(tmp_path)
    message = _error("aesthetic", {"clip_model": str(clip), "head": str(tmp_path / "head.pth")})
    assert "head" in message and "does not exist; get it with `wget -O" in message
    assert "improved-aesthetic-predictor/raw/main/sac+logos+ava1-l14-linearMSE.pth" in message
    head = tmp_path / "head.pth"
    head.write_bytes(b"")
    check_reward_specs([RewardSpec(name="aesthetic", args={"clip_model": str(clip), "head": str(head)})])


def _check_in_new_process(cache, repo: str, offline: str = "1") -> subprocess.CompletedProcess:
    """The clip reward's check in a new process whose Hugging Face cache is ``cache`` and whose HF_HUB_OFFLINE is
    ``offline`` (huggingface_hub reads both at import, and the tests run offline)."""
    code = "from glm_grpo_ds.rewards.model_files import check_transformers_model as c; "
    code += f"c('model', {repo!r}, 'clip', 'x')"
    env = dict(os.environ, HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE=offline)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_a_hub_id_is_taken_online_and_must_be_cached_offline(tmp_path):
    # online: from_pretrained downloads it into the cache
    done = _check_in_new_process(tmp_path / "empty", "openai/clip-vit-large-patch14", offline="0")
    assert done.returncode == 0, done.stderr[-2000:]
    message = _error("clip", {"model": "glm-grpo-tests/never-cached-clip"})  # the tests run offline
    assert "glm-grpo-tests/never-cached-clip is not in the Hugging Face cache and HF_HUB_OFFLINE=1" in message
    assert "hf download glm-grpo-tests/never-cached-clip" in message
    # once cached (the layout huggingface_hub writes), offline is fine
    cache = tmp_path / "hub"
    snapshot = cache / "models--openai--clip-vit-large-patch14" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("abc")
    done = _check_in_new_process(cache, "openai/clip-vit-large-patch14")
    assert done.returncode == 0, done.stderr[-2000:]
    done = _check_in_new_process(tmp_path / "empty", "openai/clip-vit-large-patch14")
    assert done.returncode == 1 and "is not in the Hugging Face cache and HF_HUB_OFFLINE=1" in done.stderr


def test_unknown_args_and_lpips_weights_are_named():
    assert "reward lpips: unknown args backbone; it takes net, pretrained_backbone, backbone_weights, offload" in (
        _error("lpips", {"backbone": "x"})
    )
    assert "reward lpips: backbone_weights /nowhere/alexnet.pth does not exist; put " in (
        _error("lpips", {"backbone_weights": "/nowhere/alexnet.pth"})
    )


def test_a_missing_library_names_the_extra_to_install():
    with pytest.raises(RewardError, match=r"reward ocr needs no_such_module_x, which is not installed: pip install "):
        check_installed("ocr", "rapidfuzz", "no_such_module_x", extra="ocr")
    check_installed("ocr", "rapidocr_onnxruntime", "rapidfuzz", extra="ocr")  # installed here: quiet
