"""`glm-grpo merge`: merged AR == base + adapter, the merged pipeline loads and renders, the rest is untouched."""

import hashlib
import re
import sys

import pytest
import torch
from in_process import glm_grpo  # noqa: E402  (tests/in_process.py)
from launching import run_cmd  # noqa: E402  (tests/integration/launching.py)

from glm_grpo_ds.model.adapters import lora_target_regex
from glm_grpo_ds.model.glm_image import load_processor
from glm_grpo_ds.model.policy import load_ar
from glm_grpo_ds.model.prompt_layout import build_prompt_inputs
from glm_grpo_ds.rollout import prompt_position_ids


@pytest.fixture(scope="module")
def adapter(tiny_model_dir, tmp_path_factory):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    cfg = LoraConfig(
        r=4,
        lora_alpha=8,
        target_modules=lora_target_regex(["q_proj", "v_proj", "gate_up_proj", "down_proj"]),
        init_lora_weights=False,
    )  # random A and B: the adapter changes the logits
    model = get_peft_model(load_ar(tiny_model_dir), cfg)
    out = tmp_path_factory.mktemp("adapter") / "final_adapter"
    model.save_pretrained(out)
    return out


def _logits(model, processor):
    inputs = build_prompt_inputs(processor, ["a red cube", "a much longer prompt with 'TEXT'"], 64, 96)
    positions = prompt_position_ids(model, inputs)
    with torch.no_grad():
        return model(
            input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], position_ids=positions
        ).logits


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_merge_equals_base_plus_adapter_and_renders(tiny_model_dir, adapter, tmp_path):
    from diffusers import GlmImagePipeline
    from peft import PeftModel

    out = tmp_path / "merged"
    proc = run_cmd(
        [
            sys.executable,
            "-m",
            "glm_grpo_ds.commands.cli",
            "merge",
            "--base",
            str(tiny_model_dir),
            "--adapter",
            str(adapter),
            "--out",
            str(out),
            "--dtype",
            "fp32",  # exact comparison below; the bf16 default: tests/integration/test_adapters.py
        ],
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    processor = load_processor(tiny_model_dir)
    unmerged = _logits(PeftModel.from_pretrained(load_ar(tiny_model_dir), adapter), processor)
    merged = _logits(load_ar(out), processor)
    base = _logits(load_ar(tiny_model_dir), processor)
    assert (unmerged - base).abs().max() > 1e-3  # the adapter does change the model
    torch.testing.assert_close(merged, unmerged, rtol=0, atol=1e-5)

    for part in (
        "transformer/diffusion_pytorch_model.safetensors",
        "vae/diffusion_pytorch_model.safetensors",
        "text_encoder/model.safetensors",
        "processor/tokenizer.json",
        "model_index.json",
    ):
        assert _sha(out / part) == _sha(tiny_model_dir / part), part
    pipe = GlmImagePipeline.from_pretrained(out)
    pipe.set_progress_bar_config(disable=True)
    image = pipe(
        "a red cube",
        height=64,
        width=64,
        num_inference_steps=2,
        output_type="pt",
        generator=torch.Generator().manual_seed(0),
    ).images
    assert image.shape == (1, 3, 64, 64) and torch.isfinite(image).all()
    assert not (tmp_path / "merged.tmp").exists()


@pytest.mark.slow
def test_merge_errors(tiny_model_dir, adapter, tmp_path, capfd):
    merge = ["merge", "--base", tiny_model_dir]
    code, _, err = glm_grpo([*merge, "--adapter", adapter, "--out", tmp_path], capfd)
    assert code == 2 and "already exists" in err
    code, _, err = glm_grpo([*merge, "--adapter", tmp_path / "nope", "--out", tmp_path / "o"], capfd)
    assert code == 2 and f"--adapter {tmp_path / 'nope'} does not exist; give a run's final_adapter/" in err
    code, _, err = glm_grpo(["merge", "--base", adapter, "--adapter", adapter, "--out", tmp_path / "o2"], capfd)
    assert code == 2 and "is not a GLM-Image pipeline directory" in err
    (tmp_path / "o3.tmp").write_text("not a merge's")  # a file of the user's where the merge would write
    code, _, err = glm_grpo([*merge, "--adapter", adapter, "--out", tmp_path / "o3"], capfd)
    assert code == 2 and "o3.tmp exists and is not an earlier merge's" in err
    assert (tmp_path / "o3.tmp").read_text() == "not a merge's"


def test_a_bf16_merge_that_rounds_the_adapter_away_says_so(tiny_model_dir, adapter, tmp_path, capfd):
    """An adapter's change far below bf16's spacing of the base weights (lr 1e-5 at GLM-Image's widths: 4 % kept after
    1 step) merges to nearly the base model in bf16: the merge measures the share kept and says so in one line naming
    --dtype fp32; the random adapter above (a change as large as the weights) merges without a word."""
    from peft import PeftModel

    small = PeftModel.from_pretrained(load_ar(tiny_model_dir), adapter)
    with torch.no_grad():
        for name, param in small.named_parameters():
            if "lora_B" in name:
                param.mul_(1e-5)
    small.save_pretrained(tmp_path / "small")
    merge = ["merge", "--base", tiny_model_dir]
    code, _, err = glm_grpo([*merge, "--adapter", tmp_path / "small", "--out", tmp_path / "merged_small"], capfd)
    warned = [line for line in err.splitlines() if line.startswith("glm-grpo merge: warning:")]
    assert code == 0 and len(warned) == 1, err
    kept = int(re.search(r"the bf16 weights keep (\d+)% of the adapter's change", warned[0]).group(1))
    assert kept < 50 and "--dtype fp32 keeps all of it" in warned[0], warned
    code, _, err = glm_grpo([*merge, "--adapter", adapter, "--out", tmp_path / "merged"], capfd)
    assert code == 0 and "warning" not in err, err


def test_the_adapter_cards_loading_code_gives_the_trained_policy_in_bf16(tiny_model_dir, adapter):
    """The card's code merged the adapter into the bf16 AR (peft rounds the change into the weights' dtype: 4-28 %
    of a small one kept): on a GPU readers got mostly the base model. Run as written with bf16, its AR computes what
    the trainer's policy (base + unmerged LoRA in bf16) computes, to the bit."""
    from peft import PeftModel

    from glm_grpo_ds.sharing.card_parts import usage_lines

    lines = usage_lines("adapter", str(tiny_model_dir), str(adapter))
    start = lines.index("```python") + 1
    code = "\n".join(lines[start : lines.index("```", start)]).split("pipe.to(device)")[0]
    gpu_dtype = 'dtype = torch.bfloat16 if device == "cuda" else torch.float32'
    assert gpu_dtype in code
    scope: dict = {}
    exec(code.replace(gpu_dtype, "dtype = torch.bfloat16"), scope)  # what a GPU reader runs, here on the CPU
    trained = PeftModel.from_pretrained(load_ar(tiny_model_dir, "bf16"), adapter)
    processor = load_processor(tiny_model_dir)
    card_ar = scope["pipe"].vision_language_encoder
    assert torch.equal(_logits(card_ar.eval(), processor), _logits(trained, processor))


def test_what_merge_cannot_use_or_write_is_one_line_before_the_model_loads_and_leaves_nothing(
    tiny_model_dir, adapter, short_run, small_disk, tmp_path, capfd
):
    """Found by an audit, each a traceback (and a partial OUT.tmp on the full disk) after the base model had loaded
    (~41 GB at GLM-Image's size), or a silent pipeline that could not generate."""
    import json
    import shutil

    merge = ["merge", "--base", tiny_model_dir]
    (tmp_path / "a_file").write_text("")
    bad = {}
    code, _, bad["under a file"] = glm_grpo([*merge, "--adapter", adapter, "--out", tmp_path / "a_file" / "m"], capfd)
    assert code == 2 and bad["under a file"].startswith(f"glm-grpo merge: --out {tmp_path / 'a_file' / 'm'} cannot be")
    no_room = [*merge, "--adapter", adapter, "--out", small_disk / "m", "--dtype", "fp32"]  # ~1.2 MiB
    code, _, bad["no room"] = glm_grpo(no_room, capfd)
    assert code == 2 and " and its file system has 1.0 MiB free; free space there" in bad["no room"]
    # a full fine-tuning's AR of another vocabulary in this base's place (the pipeline's first image: IndexError)
    other = tmp_path / "run_full" / "final_model"
    shutil.copytree(tiny_model_dir / "vision_language_encoder", other)
    config = json.loads((other / "config.json").read_text())
    config["text_config"]["vocab_size"] += 18
    (other / "config.json").write_text(json.dumps(config))
    code, _, bad["another base"] = glm_grpo([*merge, "--adapter", other.parent, "--out", tmp_path / "m"], capfd)
    assert (
        code == 2
        and f"{other} does not fit --base {tiny_model_dir}: its text_config.vocab_size is" in bad["another base"]
    )
    # a checkpoint without its adapter export, its optimizer file cut short: read after the model loaded
    ckpt = tmp_path / "step_000001"
    shutil.copytree(short_run / "checkpoints" / "step_000001", ckpt)
    shutil.rmtree(ckpt / "adapter")
    optim = ckpt / "ds" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    optim.write_bytes(optim.read_bytes()[:1000])
    code, _, bad["damaged"] = glm_grpo([*merge, "--adapter", ckpt, "--out", tmp_path / "m"], capfd)
    assert (
        code == 2 and f"{ckpt} is damaged: ds/zero_pp_rank_0_mp_rank_00_optim_states.pt is cut short" in bad["damaged"]
    )
    # an --out inside the base: the base's copy had copied itself into OUT.tmp, and the base kept the merge
    base = tmp_path / "base"
    shutil.copytree(tiny_model_dir, base)
    code, _, bad["inside the base"] = glm_grpo(
        ["merge", "--base", base, "--adapter", adapter, "--out", base / "m"], capfd
    )
    assert (
        code == 2 and f"--out {base / 'm'} is inside --base {base}; choose an --out outside" in bad["inside the base"]
    )
    assert sorted(p.name for p in base.iterdir()) == sorted(p.name for p in tiny_model_dir.iterdir())
    shutil.rmtree(base)
    for what, err in bad.items():
        assert err.count("\n") == 1 and "Traceback" not in err, (what, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "run_full", "small", "step_000001"]  # no m.tmp
    assert list(small_disk.iterdir()) == []
    # the run folder of a full fine-tuning merges its final_model/ (the base's own AR here: the pipeline is the base)
    shutil.rmtree(other)
    shutil.copytree(tiny_model_dir / "vision_language_encoder", other)
    code, out, err = glm_grpo([*merge, "--adapter", other.parent, "--out", tmp_path / "m", "--dtype", "fp32"], capfd)
    assert code == 0, err
    card = (tmp_path / "m" / "README.md").read_text()
    assert card.split("\n---\n", 1)[1].lstrip().startswith("# GLM-Image fine-tuned with GRPO\n"), card
    # a run's adapter: the card's snippet renders at the run's size and decode, not GLM-Image's 1024² and 30 steps
    code, _, err = glm_grpo([*merge, "--adapter", short_run / "final_adapter", "--out", tmp_path / "m2"], capfd)
    assert code == 0, err
    card = (tmp_path / "m2" / "README.md").read_text()
    assert "height=64, width=64, num_inference_steps=2," in card, card
