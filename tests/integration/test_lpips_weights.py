"""The lpips reward's backbone without network: a failed download or a missing `backbone_weights`
file is one line naming the file, where it is looked for and how to provide it (training startup and
`glm-grpo score` alike); a local torchvision state dict (given, or placed in torch.hub's cache) is
what the reward then computes with, exactly as lpips' own loading would use it.

Offline is made deterministic without depending on the machine's network: TORCH_HOME is an empty
directory and the download goes through an HTTPS proxy on a local port nothing listens on."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torchvision.models as tv
from PIL import Image

from glm_grpo_ds.rewards import RewardError, build_reward

ROOT = Path(__file__).resolve().parents[2]
ALEX_FILE = "alexnet-owt-7be5be79.pth"
SQUEEZE_FILE = "squeezenet1_1-b8a52dc0.pth"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again on exit: connecting to it is refused at once


def _offline_env(torch_home: Path) -> dict:
    proxy = f"http://127.0.0.1:{_closed_port()}"
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", TORCH_HOME=str(torch_home))
    env.update(https_proxy=proxy, HTTPS_PROXY=proxy, http_proxy=proxy, HTTP_PROXY=proxy, no_proxy="", NO_PROXY="")
    return env


def _images(tmp_path: Path) -> tuple[torch.Tensor, dict]:
    torch.manual_seed(0)
    target = (torch.rand(1, 3, 64, 64) * 255).round() / 255  # exactly what the PNG holds
    Image.fromarray((target[0].permute(1, 2, 0) * 255).round().byte().numpy()).save(tmp_path / "t.png")
    return target, {"target_image": str(tmp_path / "t.png")}


def _random_state(builder, seed: int) -> dict:
    torch.manual_seed(seed)
    return builder(weights=None).state_dict()


def test_score_offline_is_one_line_naming_the_cache_file_and_the_fixes(tmp_path):
    torch_home = tmp_path / "torch_home"
    _images(tmp_path)
    cmd = [sys.executable, "-m", "glm_grpo_ds", "score", "--reward", "lpips", "--prompt", "x"]
    cmd += ["--image", str(tmp_path / "t.png"), "--target", str(tmp_path / "t.png")]
    proc = subprocess.run(cmd, cwd=ROOT, env=_offline_env(torch_home), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and proc.stdout == "", proc.stderr
    cache = torch_home / "hub" / "checkpoints"
    assert lines[0].startswith("glm-grpo score: reward lpips: torchvision's alex backbone weights")
    assert f"{ALEX_FILE} are not in {cache} and downloading https://download.pytorch.org/models/{ALEX_FILE}" in lines[0]
    assert f"put {ALEX_FILE} in {cache}" in lines[0] and f"{{backbone_weights: /path/to/{ALEX_FILE}}}" in lines[0]
    assert not list(cache.glob("*.pth"))  # nothing half-downloaded left as if it were the weights


def test_missing_or_wrong_backbone_weights_are_one_line(tmp_path):
    with pytest.raises(RewardError) as missing:
        build_reward("lpips", {"backbone_weights": str(tmp_path / "nope.pth")})
    msg = str(missing.value)
    assert "\n" not in msg and f"backbone_weights {tmp_path / 'nope.pth'} does not exist" in msg and ALEX_FILE in msg

    torch.save(_random_state(tv.squeezenet1_1, 0), tmp_path / "squeeze.pth")
    with pytest.raises(RewardError, match="squeeze.pth is not a torchvision alexnet state dict"):
        build_reward("lpips", {"backbone_weights": str(tmp_path / "squeeze.pth")})
    (tmp_path / "garbage.pth").write_bytes(b"not a checkpoint")
    with pytest.raises(RewardError, match="garbage.pth cannot be read as a state dict"):
        build_reward("lpips", {"backbone_weights": str(tmp_path / "garbage.pth")})
    with pytest.raises(RewardError, match="contradict"):
        build_reward("lpips", {"backbone_weights": str(tmp_path / "squeeze.pth"), "pretrained_backbone": False})


def test_local_backbone_weights_file_is_used(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "empty_torch_home"))  # the cache is not consulted
    state = _random_state(tv.alexnet, 1)
    torch.save(state, tmp_path / "my_alexnet.pth")
    reward = build_reward("lpips", {"backbone_weights": str(tmp_path / "my_alexnet.pth")})
    assert reward.backbone_file == tmp_path / "my_alexnet.pth"
    backbone = reward.model.module.net.state_dict()
    assert backbone and all(
        torch.equal(value, state[f"features.{key.split('.', 1)[1]}"]) for key, value in backbone.items()
    )

    target, sample = _images(tmp_path)
    images = torch.cat([target, (target + 0.3 * torch.randn_like(target)).clamp(0, 1)])
    values = reward(images, ["p"] * 2, [sample] * 2)
    assert values[0].abs() < 1e-6 and values[1] < -1e-3  # -distance: the target itself is 0
    other = build_reward("lpips", {"pretrained_backbone": False})(images, ["p"] * 2, [sample] * 2)
    assert not torch.allclose(values[1], other[1])  # the weights make the difference


def test_weights_in_the_torch_hub_cache_match_lpips_own_loading(tmp_path, monkeypatch):
    """The file placed in $TORCH_HOME/hub/checkpoints under torchvision's name: no download, and the
    same network lpips builds when it loads the backbone itself (pnet_rand=False reads the same cache)."""
    import lpips

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    cache = tmp_path / "torch_home" / "hub" / "checkpoints"
    cache.mkdir(parents=True)
    torch.save(_random_state(tv.squeezenet1_1, 2), cache / SQUEEZE_FILE)
    reward = build_reward("lpips", {"net": "squeeze"})
    assert reward.backbone_file == cache / SQUEEZE_FILE
    theirs = lpips.LPIPS(net="squeeze", pretrained=True, pnet_rand=False, verbose=False).eval()
    a, b = torch.rand(2, 3, 64, 64), torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        expected = theirs(a * 2 - 1, b * 2 - 1).reshape(-1)
    torch.testing.assert_close(reward.distance(a, b), expected, rtol=0, atol=0)
