"""Trained adapters in and out (glm_grpo_ds/model/adapters.py): training from `lora.init_from`, the base model an
adapter records, `glm-grpo render --adapter` against the merged pipeline, merge's bf16 default, and the
README's diffusers snippet - on the tiny GLM-Image, real peft / diffusers / DeepSpeed."""

import json
import os
import re
import sys
from pathlib import Path

import forkserver  # tests/forkserver.py
import numpy as np
import pytest
import torch
from adapter_files import write_adapter  # noqa: E402  (tests/integration/adapter_files.py)
from safetensors.torch import load_file

from glm_grpo_ds.config import ConfigError, LoraConfig
from glm_grpo_ds.model.adapters import check_init_adapter, find_adapter

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "launch" / "configs" / "tiny_cpu.yaml"


@pytest.fixture(scope="module")
def adapter(tiny_model_dir, tmp_path_factory):
    return write_adapter(tiny_model_dir, tmp_path_factory.mktemp("adapter") / "final_adapter", r=4, alpha=8)


def test_init_from_must_match_the_lora_section(adapter, tmp_path):
    assert check_init_adapter(LoraConfig(r=4, alpha=8, init_from=str(adapter))) == adapter
    assert check_init_adapter(LoraConfig(r=4, alpha=8, init_from=str(adapter.parent))) == adapter  # holds it
    assert check_init_adapter(LoraConfig(init_from=None)) is None
    cases = [
        (dict(r=8, alpha=8), r"has r=4 but lora.r=8: set lora.r=4$"),
        (dict(r=4, alpha=16), r"has lora_alpha=8 but lora.alpha=16: set lora.alpha=8$"),
        (
            dict(r=4, alpha=8, target_modules=["q_proj", "v_proj"]),
            r"adapts the modules \[down_proj, gate_up_proj, k_proj, o_proj, q_proj, v_proj\] but "
            r"lora.target_modules is \[q_proj, v_proj\]: set lora.target_modules to the adapter's$",
        ),
    ]
    for lora, message in cases:
        with pytest.raises(ConfigError, match=rf"^lora.init_from {re.escape(str(adapter))} {message}"):
            check_init_adapter(LoraConfig(init_from=str(adapter), **lora))
    dora = tmp_path / "dora"
    dora.mkdir()
    saved = json.loads((adapter / "adapter_config.json").read_text())
    (dora / "adapter_config.json").write_text(json.dumps({**saved, "use_dora": True}))
    (dora / "adapter_model.safetensors").write_bytes((adapter / "adapter_model.safetensors").read_bytes())
    with pytest.raises(ConfigError, match=r"has use_dora=True; this trainer continues plain LoRA adapters only"):
        check_init_adapter(LoraConfig(r=4, alpha=8, init_from=str(dora)))
    for text, message in ((b"[]", "holds no JSON object"), (b'{"r": "\xff"}', "is not valid JSON")):
        (dora / "adapter_config.json").write_bytes(text)  # an AttributeError / UnicodeDecodeError traceback before
        with pytest.raises(ConfigError, match=rf"^lora.init_from .*dora: adapter_config.json {message}"):
            check_init_adapter(LoraConfig(r=4, alpha=8, init_from=str(dora)))
    # weights cut short (a copy that stopped): safetensors' traceback in merge, render and evaluate before
    (dora / "adapter_config.json").write_text(json.dumps(saved))
    whole = (adapter / "adapter_model.safetensors").read_bytes()
    (dora / "adapter_model.safetensors").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ConfigError, match=r"^--adapter .*dora: adapter_model.safetensors cannot be read \(.*\): it is"):
        find_adapter(dora)
    with pytest.raises(FileNotFoundError, match=r"^lora.init_from .*nope does not exist; give a run's final_adapter/"):
        check_init_adapter(LoraConfig(init_from=str(tmp_path / "nope")))
    with pytest.raises(FileNotFoundError, match=r"^lora.init_from .* holds no peft adapter \(adapter_config.json\)"):
        check_init_adapter(LoraConfig(init_from=str(tmp_path)))  # there, but no adapter in it


def test_load_policy_starts_from_the_adapter_and_records_an_absolute_base(
    tiny_model_dir, adapter, tmp_path, monkeypatch
):
    """The policy's LoRA weights are the file's, bitwise; an adapter saved from it names the absolute AR
    directory as its base although model.path was relative, so AutoPeftModel loads it from elsewhere."""
    from peft import AutoPeftModel, get_peft_model_state_dict

    from glm_grpo_ds.model.policy import load_policy
    from glm_grpo_ds.model.source import resolve_model

    monkeypatch.chdir(tiny_model_dir.parent)
    source = resolve_model(tiny_model_dir.name)
    lora = LoraConfig(r=4, alpha=8, init_from=str(adapter))
    model = load_policy(source.path, torch.float32, "sdpa", lora, False, seed=123, adapter_base=source.adapter_base())
    loaded, expected = get_peft_model_state_dict(model), load_file(adapter / "adapter_model.safetensors")
    assert loaded.keys() == expected.keys() and all(torch.equal(loaded[k], expected[k]) for k in expected)
    model.save_pretrained(tmp_path / "saved")
    saved = json.loads((tmp_path / "saved" / "adapter_config.json").read_text())
    assert saved["base_model_name_or_path"] == str(tiny_model_dir.resolve() / "vision_language_encoder")
    monkeypatch.chdir(tmp_path)  # away from where model.path was relative to
    auto = AutoPeftModel.from_pretrained(tmp_path / "saved")
    reloaded = get_peft_model_state_dict(auto)
    assert all(torch.equal(reloaded[k], expected[k]) for k in expected)


@pytest.mark.slow
def test_training_with_init_from_starts_from_those_weights(tiny_model_dir, adapter, tmp_path):
    """`glm-grpo train lora.init_from=ADAPTER` (ZeRO-3, one process): with every reward equal the update is
    exactly zero (zero advantages, no weight decay), so the final adapter is the step-0 adapter - and it
    equals the given one bitwise; the first ratio is 1. model.path is relative: the adapter records it
    absolute."""
    (tmp_path / "p.txt").write_text("a red cube\na blue ball\n")
    (tmp_path / "constant.py").write_text(
        "import torch\n\ndef reward(images, prompts, samples):\n    return torch.full((len(images),), 0.5)\n"
    )
    os.symlink(tiny_model_dir, tmp_path / "tiny")
    out = tmp_path / "run"
    proc = forkserver.run(
        [sys.executable, "-m", "glm_grpo_ds", "train", "--config", str(CONFIG)]
        + ["--deepspeed", str(ROOT / "ds_configs" / "zero3.json"), "model.path=tiny", "data.train_file=p.txt"]
        + [f"output_dir={out}", f"lora.init_from={adapter}", "lora.r=4", "lora.alpha=8", "max_steps=1"]
        + ["rollout.height=64", "rollout.width=64", "grpo.group_size=4", "optimizer.name=adamw"]
        + ["optimizer.weight_decay=0", "logging.progress_bar=false", "logging.plot=false"]
        + ["rewards=[{name: 'constant.py:reward'}]"],
        forkserver.BASE_ENV,  # the suite's environment (PYTHONPATH, offline, CPU accelerator)
        tmp_path,
        600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert record["reward_std"] == 0 and record["ratio_min"] == record["ratio_max"] == 1.0
    final = load_file(out / "final_adapter" / "adapter_model.safetensors")
    given = load_file(find_adapter(adapter) / "adapter_model.safetensors")
    assert final.keys() == given.keys() and all(torch.equal(final[k], given[k]) for k in given)
    saved = json.loads((out / "final_adapter" / "adapter_config.json").read_text())
    assert saved["base_model_name_or_path"] == str((tmp_path / "tiny").resolve() / "vision_language_encoder")
    assert saved["revision"] is None


@pytest.mark.slow
def test_render_with_adapter_equals_the_merged_pipeline_and_merge_defaults_to_bf16(tmp_path):
    """On the tiny world's pipeline, whose decoder paints each visual token as an exact colour block (the
    random tiny DiT barely reacts to its tokens), so equal images mean equal tokens."""
    from PIL import Image

    from glm_grpo_ds.commands import render
    from glm_grpo_ds.commands.merge import merge_adapter
    from glm_grpo_ds.testing.world import build_world_pipeline

    world = build_world_pipeline(tmp_path / "world")
    adapter = write_adapter(world, tmp_path / "adapter", r=4, alpha=8)
    merged32 = merge_adapter(world, adapter, tmp_path / "merged32", "fp32")
    merged16 = merge_adapter(world, adapter, tmp_path / "merged16")  # the default dtype
    w32 = load_file(merged32 / "vision_language_encoder" / "model.safetensors")
    w16 = load_file(merged16 / "vision_language_encoder" / "model.safetensors")
    assert {t.dtype for t in w16.values()} == {torch.bfloat16}
    assert all(torch.equal(w16[k], w32[k].to(torch.bfloat16)) for k in w32)

    prompts = ["--prompt", "red image", "--prompt", "green on the left, blue on the right"]
    common = prompts + ["--steps", "2", "--height", "64", "--width", "64"]
    images = {}
    for name, args in (
        ("base", ["--model", str(world)]),
        ("adapter", ["--model", str(world), "--adapter", str(adapter)]),
        ("merged", ["--model", str(merged32)]),
    ):
        assert render.main(args + common + ["--out", str(tmp_path / name)]) == 0
        images[name] = [torch.from_numpy(np.asarray(Image.open(tmp_path / name / f"{i:03d}.png"))) for i in (0, 1)]
    assert all(not torch.equal(a, b) for a, b in zip(images["adapter"], images["base"]))
    assert all(torch.equal(a, m) for a, m in zip(images["adapter"], images["merged"]))


@pytest.mark.slow
def test_readme_diffusers_snippet_runs(tiny_model_dir, adapter, tmp_path, monkeypatch):
    """The README's snippet for diffusers users, on the tiny model: only the model id, the adapter path,
    the device and the image size are replaced."""
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"<!-- snippet: diffusers-adapter -->\n```python\n(.*?)```", readme, re.S).group(1)
    for old, new in (
        ('"zai-org/GLM-Image"', repr(str(tiny_model_dir))),
        ('"outputs/glm_image_lora/final_adapter"', repr(str(adapter))),
        ('"cuda"', '"cpu"'),
        ("1024", "64"),
    ):
        assert old in code, old
        code = code.replace(old, new)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102
    pipe = namespace["pipe"]
    assert pipe.vision_language_encoder.active_adapters() == ["default"]
    png = list(tmp_path.glob("*.png"))
    assert len(png) == 1
    from PIL import Image

    assert Image.open(png[0]).size == (64, 64)
