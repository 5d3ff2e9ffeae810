"""What a reward may return, how a plugin is imported and built, what `glm-grpo score` gives it and says of a remote
server that does not score, which labels the metrics can hold, and that a logged-only (weight-0) reward never makes
a step count as measured."""

import json
import os
import re
import sys
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from PIL import Image

from glm_grpo_ds.advantages import combine_advantages
from glm_grpo_ds.commands import score
from glm_grpo_ds.config import RewardSpec
from glm_grpo_ds.rewards import RewardError, build_reward
from glm_grpo_ds.rewards.base import reward_values
from glm_grpo_ds.rewards.registry import check_reward_name
from glm_grpo_ds.rewards.remote.protocol import rewards_from_json

NAN = float("nan")


@pytest.mark.parametrize("mode", ["sum_then_normalize", "normalize_then_sum", "win_rate", "win_rate_per_reward"])
def test_a_weight_0_reward_does_not_keep_a_step_whose_trained_reward_is_undefined(mode):
    """train.py skips the update when the total is NaN for every sample; a weight-0 reward defined there made the
    total 0 instead, and the optimizer stepped on zero advantages (Adam's momentum still moved the weights)."""
    per = {"trained": torch.full((4,), NAN), "logged": torch.tensor([0.1, 0.2, 0.3, 0.4])}
    advantages, total = combine_advantages(per, {"trained": 1.0, "logged": 0.0}, 2, mode)
    assert torch.isnan(total).all() and torch.equal(advantages, torch.zeros(4))
    # a sample only the logged reward measured is undefined; the others keep the trained reward's total
    per["trained"] = torch.tensor([1.0, NAN, 2.0, 4.0])
    _, total = combine_advantages(per, {"trained": 1.0, "logged": 0.0}, 2, mode)
    assert torch.isnan(total).tolist() == [False, True, False, False]


def test_a_reward_of_another_shape_is_refused_not_flattened():
    values = torch.arange(6.0)
    for shape in ((6,), (6, 1), (1, 6)):
        assert torch.equal(reward_values("r", values.reshape(shape), 6), values)
    assert torch.equal(reward_values("r", torch.tensor(0.5), 1), torch.tensor([0.5]))  # .squeeze() of one image
    for raw, got in (
        (values.reshape(2, 3), "shape [2, 3]"),  # flattened, values went to the wrong images
        (values.reshape(3, 2, 1), "shape [3, 2, 1]"),
        (torch.tensor(0.5), "1 values"),
    ):
        n = 2 if got == "1 values" else 6
        with pytest.raises(RewardError) as err:
            reward_values("r", raw, n)
        assert str(err.value) == (
            f"reward r returned {got} for {n} images: a reward returns one per image (a [N] tensor or a list; None "
            "or NaN where it is undefined)"
        )


def test_a_python_module_that_fails_to_import_is_one_line_like_a_file(tmp_path, monkeypatch):
    """Only ImportError was caught for python:module: a syntax error or an error raised at import was a traceback."""
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "rc_syntax_mod.py").write_text("def f(images, prompts, samples):\n    return (\n")
    (tmp_path / "rc_raises_mod.py").write_text("raise RuntimeError('no GPU here')\n")
    (tmp_path / "rc_raises_file.py").write_text("raise RuntimeError('no GPU here')\n")
    with pytest.raises(RewardError) as err:
        check_reward_name("python:rc_syntax_mod:f")
    assert str(err.value).startswith(
        f"reward 'python:rc_syntax_mod:f': cannot import rc_syntax_mod, {tmp_path / 'rc_syntax_mod.py'}:2 (SyntaxError:"
    )
    with pytest.raises(RewardError, match=r"cannot import rc_raises_mod \(RuntimeError: no GPU here\)$"):
        check_reward_name("python:rc_raises_mod:f")
    with pytest.raises(RewardError, match=f"cannot import {tmp_path / 'rc_raises_file.py'} \\(RuntimeError: no GPU"):
        check_reward_name(f"{tmp_path / 'rc_raises_file.py'}:f")
    assert not [name for name in sys.modules if name.startswith("glm_grpo_reward_rc_raises_file")]


def test_a_python_module_in_the_current_directory_is_found_without_it_on_sys_path(tmp_path, monkeypatch):
    """The glm-grpo console script has its own directory on sys.path, not the current one (python -m has it)."""
    (tmp_path / "rc_here_mod.py").write_text(
        "def f(images, prompts, samples):\n    return images.mean(dim=(1, 2, 3))\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", os.fspath(tmp_path))])
    fn = build_reward("python:rc_here_mod:f", {})
    assert fn(torch.full((2, 3, 4, 4), 0.5), ["a", "b"], [{}, {}]).tolist() == [0.5, 0.5]
    with pytest.raises(RewardError) as err:
        check_reward_name("python:rc_nowhere_mod:f")
    assert str(err.value) == (
        "reward 'python:rc_nowhere_mod:f': cannot import rc_nowhere_mod (ModuleNotFoundError: No module named "
        "'rc_nowhere_mod'); install it, or put its directory on PYTHONPATH"
    )


def test_a_file_reward_may_be_a_dataclass_under_postponed_annotations(tmp_path):
    plugin = tmp_path / "rc_dataclass.py"
    plugin.write_text(
        "from __future__ import annotations\n"
        "from dataclasses import dataclass\n\n\n"
        "@dataclass\nclass Gain:\n    gain: float = 1.0\n\n"
        "    def __call__(self, images, prompts, samples):\n        return self.gain * images.mean(dim=(1, 2, 3))\n"
    )
    fn = build_reward(f"{plugin}:Gain", {"gain": 2.0})
    assert fn(torch.full((1, 3, 2, 2), 0.25), ["a"], [{}]).tolist() == [0.5]


def test_a_plugin_whose_constructor_raises_is_one_line_naming_it(tmp_path):
    """Only a TypeError was caught, and called bad args even when raised inside the constructor."""
    plugin = tmp_path / "rc_ctor.py"
    plugin.write_text(
        "class Bad:\n    def __init__(self, path='x'):\n        raise ValueError(f'{path} is no model')\n\n"
        "class Gone:\n    def __init__(self):\n        open('/nonexistent/rc_weights.bin')\n\n"
        "class Typed:\n    def __init__(self, n=1):\n        len(n)\n\n"
        "def make(value):\n    raise OSError('disk gone')\n"
    )
    lines = {}
    for attr, args in (("Bad", {"path": "m"}), ("Gone", {}), ("Typed", {}), ("make", {"value": 1})):
        with pytest.raises(RewardError) as err:
            build_reward(f"{plugin}:{attr}", args)
        lines[attr] = str(err.value)
    assert (
        lines["Bad"] == f"reward {plugin}:Bad: building it with args {{'path': 'm'}} raised ValueError: m is no model"
    )
    assert lines["Gone"] == (
        f"reward {plugin}:Gone: building it with args {{}} raised FileNotFoundError: [Errno 2] No such file or "
        "directory: '/nonexistent/rc_weights.bin'"
    )
    assert lines["Typed"] == (
        f"reward {plugin}:Typed: building it with args {{}} raised TypeError: object of type 'int' has no len()"
    )
    assert lines["make"] == f"reward {plugin}:make: building it with args {{'value': 1}} raised OSError: disk gone"
    with pytest.raises(RewardError, match="unknown args m; it takes path"):  # args that do not bind: said so
        build_reward(f"{plugin}:Bad", {"m": 1})


def test_score_gives_each_sample_the_keys_training_gives(tmp_path, capsys):
    Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
    (tmp_path / "rc_keys.py").write_text(
        "def index(images, prompts, samples):\n"
        "    return [float(s['index']) + (s['text'] is None) + (s['target_image'] is None) for s in samples]\n"
    )
    argv = ["--reward", f"{tmp_path / 'rc_keys.py'}:index", "--prompt", "a cat", "--image", str(tmp_path / "a.png")]
    assert score.main(argv) == 0
    assert capsys.readouterr().out == "2\n"


class _Server(BaseHTTPRequestHandler):
    """A reward server that answers /health like glm-grpo reward-server and /score with ``answer``."""

    answer: tuple[int, bytes] = (200, b"{}")

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        health = {"protocol": 1, "reward": "fake", "version": "0", "needs": None, "token_required": False}
        self._send(200, json.dumps(health).encode())

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self._send(*type(self).answer)

    def log_message(self, *args):  # no request lines in the test's output
        pass


@contextmanager
def _server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_score_says_in_one_line_that_a_remote_server_did_not_score(tmp_path, capsys):
    """Every server failure was a RemoteRewardError traceback (score caught ValueError only), and a rewards string
    scored one image per character."""
    images = []
    for i in range(4):
        Image.new("RGB", (8, 8), (i, 0, 0)).save(tmp_path / f"{i}.png")
        images.append(str(tmp_path / f"{i}.png"))
    answers = {
        (200, b'{"rewards": [0.5]}'): "sent 1 rewards for 4 images",
        (200, b"<html>busy</html>"): "sent no list of rewards (JSONDecodeError)",
        (500, b'{"detail": "reward fake raised KeyError"}'): "answered HTTP 500: reward fake raised KeyError",
        (200, b'{"rewards": "0000"}'): "sent no list of rewards (TypeError)",
    }
    with _server() as url:
        for answer, said in answers.items():
            _Server.answer = answer
            argv = ["--reward", "remote", "--reward-arg", f"url={url}", "--reward-arg", "retries=0"]
            assert score.main([*argv, "--prompt", "a cat", "--image", *images]) == 2, answer
            out = capsys.readouterr()
            assert out.out == "" and out.err == f"glm-grpo score: {url}/score {said}\n"
        _Server.answer = (200, b'{"rewards": [0.5, null, 1, -2]}')
        assert score.main([*argv, "--prompt", "a cat", "--image", *images]) == 0
        assert capsys.readouterr().out == "0.5\nnan\n1\n-2\n"


@pytest.mark.parametrize("bad", ["0000", [True, 0.5], [[0.5]], {"0": 0.5}, ["0.5"]])
def test_rewards_from_json_takes_only_a_list_of_numbers_or_nulls(bad):
    with pytest.raises(TypeError, match="rewards must be a JSON list of numbers or nulls"):
        rewards_from_json(bad)


def test_a_label_ending_like_a_rewards_statistic_is_refused():
    """Labels q and q_std wrote each other's reward/q_std; reward_means read reward/q_std as q's statistic."""
    assert RewardSpec(name="pixel_mse", label="q").problems("rewards[0].") == []
    assert RewardSpec(name="pixel_mse", label="q_standard").problems("rewards[0].") == []
    for label, suffix in (("q_std", "_std"), ("a_undefined", "_undefined"), ("ocr_failed", "_failed")):
        assert RewardSpec(name="pixel_mse", label=label).problems("rewards[1].") == [
            f"rewards[1].label {label!r} ends in {suffix}, which the metrics append to every reward's label "
            "(reward/<label>_std, _undefined, _failed): give it a label that does not"
        ]
    assert (
        RewardSpec(name="my.py:sharp_std")
        .problems("rewards[2].")[0]
        .startswith("rewards[2].name 'my.py:sharp_std' ends in _std,")
    )


def test_a_plugin_that_cannot_be_called_as_a_reward_is_refused_before_the_job(tmp_path):
    """A function given without args is called as fn(images, prompts, samples): one whose signature cannot take them
    (a factory given no args, a function of the images alone) passed the check, then raised at every call: each step
    undefined until max_consecutive_skips ended the run."""
    from glm_grpo_ds.rewards.registry import check_reward_args

    (tmp_path / "plugs.py").write_text(
        "def make_default(scale=1.0):\n    return lambda images, prompts, samples: [scale] * len(images)\n\n"
        "def one_arg(images):\n    return [0.0] * len(images)\n\n"
        "def fine(images, prompts, samples, **kw):\n    return [0.0] * len(images)\n"
    )
    for fn in ("make_default", "one_arg"):
        name = f"{tmp_path / 'plugs.py'}:{fn}"
        with pytest.raises(RewardError, match=rf"^reward {re.escape(name)}: {fn}\(.*\) cannot be called as a reward"):
            build_reward(name, {})
        with pytest.raises(RewardError, match="cannot be called as a reward"):  # what train --check runs
            check_reward_args(name, {})
    assert build_reward(f"{tmp_path / 'plugs.py'}:fine", {}) is not None
    check_reward_args(f"{tmp_path / 'plugs.py'}:fine", {})
