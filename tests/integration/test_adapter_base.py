"""An adapter checked against the model it is loaded onto, by every command that loads one
(glm_grpo_ds/model/adapters.py ``check_adapters``): a weight whose shape does not fit is one line and exit 2 (naming
the tensor and both shapes, before peft's traceback); a base other than the one the adapter records is a one-line
warning, and evaluate marks its row. On the tiny GLM-Image: "another base" is a copy of it at another path (same
shapes), "does not fit" an adapter with one LoRA A of another width."""

import json
import logging
import shutil

import pytest
import torch
from adapter_files import write_adapter  # noqa: E402  (tests/integration/adapter_files.py)
from in_process import glm_grpo  # noqa: E402  (tests/in_process.py)
from launching import CONFIG, common  # noqa: E402  (tests/integration/launching.py)
from safetensors.torch import load_file, save_file

from glm_grpo_ds.config import LoraConfig
from glm_grpo_ds.model.adapters import ADAPTER_WEIGHTS, other_base
from glm_grpo_ds.model.source import resolve_model

FAST = ["rollout.height=64", "rollout.width=64", "eval.num_inference_steps=1", "eval.guidance_scale=1.0"]
WIDE = "base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.weight"


@pytest.fixture(scope="module")
def adapters(tiny_model_dir, tmp_path_factory):
    """``(adapter, another base, an adapter that does not fit)``."""
    tmp = tmp_path_factory.mktemp("adapter_base")
    adapter = write_adapter(tiny_model_dir, tmp / "final_adapter", r=4, alpha=8)
    other = shutil.copytree(tiny_model_dir, tmp / "other_model")
    wide = shutil.copytree(adapter, tmp / "wide_adapter")
    weights = load_file(wide / ADAPTER_WEIGHTS)
    r, width = weights[WIDE].shape
    weights[WIDE] = torch.zeros(r, width + 8)
    save_file(weights, wide / ADAPTER_WEIGHTS)
    return adapter, other, wide, width


def one_line(code, err, *fragments):
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and all(f in lines[0] for f in fragments), err


def test_evaluate_warns_of_another_base_marks_the_row_and_refuses_a_misfit(adapters, data64, tmp_path, capfd):
    adapter, other, wide, width = adapters
    argv = ["evaluate", "--model", str(other), "--prompts", str(data64), "--rewards", "pixel_mse"]
    argv += ["--num-prompts", "2", "--samples-per-prompt", "2", "--adapter", str(adapter), "--out", str(tmp_path / "e")]
    argv += FAST
    code, out, err = glm_grpo(argv, capfd)
    assert code == 0, err
    warning = f"glm-grpo: warning: adapter {adapter} was trained on {adapter.parent.parent}"
    assert warning.split(" was trained")[0] in err and "not on the model given" in err
    assert str(other / "vision_language_encoder") in err
    assert "adapter_0: " in out and "(trained on another base model: see its warning)" in out
    result = json.loads((tmp_path / "e" / "evaluate.json").read_text())
    assert "not on the model given" in result["summary"]["adapter_0"]["base_warning"]
    assert "not on the model given" in (tmp_path / "e" / "report.html").read_text()

    argv[argv.index(str(adapter))] = str(wide)
    argv[argv.index(str(tmp_path / "e"))] = str(tmp_path / "e2")
    code, _, err = glm_grpo(argv, capfd)
    one_line(code, err, f"--adapter {wide} does not fit the model: {WIDE} has shape [4, {width + 8}]", f"[r, {width}]")


def test_the_right_base_gives_no_warning(adapters, tiny_model_dir):
    adapter, other, _, _ = adapters
    assert other_base(adapter, resolve_model(str(tiny_model_dir)).adapter_base()) is None
    assert other_base(adapter, resolve_model(str(other)).adapter_base()) is not None
    # a Hub id compares with its commit when both record one
    (adapter.parent / "hub").mkdir(exist_ok=True)
    hub = shutil.copytree(adapter, adapter.parent / "hub" / "a", dirs_exist_ok=True)
    config = json.loads((hub / "adapter_config.json").read_text())
    config.update(base_model_name_or_path="zai-org/GLM-Image", revision="abc")
    (hub / "adapter_config.json").write_text(json.dumps(config))
    assert other_base(hub, ("zai-org/GLM-Image", "abc")) is None
    assert "zai-org/GLM-Image @ abc, not on the model given (zai-org/GLM-Image @ def)" in other_base(
        hub, ("zai-org/GLM-Image", "def")
    )


def test_render_and_merge_warn_of_another_base_and_refuse_a_misfit(adapters, tmp_path, capfd):
    adapter, other, wide, width = adapters
    render = ["render", "--model", str(other), "--prompt", "a red cube", "--height", "64", "--width", "64"]
    render += ["--steps", "1", "--guidance", "1.0"]
    code, _, err = glm_grpo([*render, "--adapter", str(adapter), "--out", str(tmp_path / "r")], capfd)
    assert code == 0 and "not on the model given" in err, err
    code, _, err = glm_grpo([*render, "--adapter", str(wide), "--out", str(tmp_path / "r2")], capfd)
    one_line(code, err, f"--adapter {wide} does not fit the model: {WIDE} has shape [4, {width + 8}]")

    merge = ["merge", "--base", str(other)]
    code, _, err = glm_grpo([*merge, "--adapter", str(adapter), "--out", str(tmp_path / "m")], capfd)
    assert code == 0 and "not on the model given" in err, err
    code, _, err = glm_grpo([*merge, "--adapter", str(wide), "--out", str(tmp_path / "m2")], capfd)
    one_line(code, err, f"the adapter {wide} does not fit the model: {WIDE} has shape [4, {width + 8}]")
    assert not (tmp_path / "m2").exists()


def test_decode_agreement_refuses_a_misfit(adapters, tiny_model_dir, data64, tmp_path, capfd):
    _, _, wide, width = adapters
    argv = ["decode-agreement", "--config", str(CONFIG), *common(tiny_model_dir, data64, tmp_path / "o")]
    argv += ["rollout.height=64", "rollout.width=64", "grpo.group_size=2", "batch.micro_batch_size=2"]
    code, _, err = glm_grpo([*argv, "--num-prompts", "1", "--adapter", str(wide)], capfd)
    one_line(code, err, f"--adapter {wide} does not fit the model: {WIDE} has shape [4, {width + 8}]")


def test_lora_init_from_warns_of_another_base(adapters, caplog):
    from glm_grpo_ds.model.policy import load_policy

    adapter, other, _, _ = adapters
    source = resolve_model(str(other))
    with caplog.at_level(logging.WARNING, logger="glm_grpo"):
        load_policy(source.path, torch.float32, "sdpa", LoraConfig(r=4, alpha=8, init_from=str(adapter)), False,
                    adapter_base=source.adapter_base())  # fmt: skip
    assert any(
        r.getMessage().startswith(f"glm-grpo: warning: lora.init_from {adapter} was trained on") for r in caplog.records
    )
