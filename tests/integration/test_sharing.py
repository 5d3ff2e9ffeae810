"""Model cards and Hub uploads of a real training run: one process (ZeRO-2, LoRA, the tiny pipeline)
with `hub.repo_id`, uploading to a local stand-in of the Hub (glm_grpo_ds/testing/fake_hub.py) through
huggingface_hub's real HfApi, under HF_HUB_OFFLINE=1 as the tests run. Then `glm-grpo push` (the retry the
run names) and `glm-grpo merge` (the merged pipeline's card). ~1.5 min on 2 idle cores."""

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys

import pytest
from huggingface_hub import ModelCard
from in_process import glm_grpo  # noqa: E402  (tests/in_process.py)
from launching import ROOT, common, launch_cmd, train_args, train_cmd  # noqa: E402  (tests/integration/launching.py)
from run_files import jsonl  # noqa: E402  (tests/run_files.py)

from glm_grpo_ds.sharing.model_card import write_run_card
from glm_grpo_ds.testing.fake_hub import FakeHub

pytestmark = pytest.mark.slow  # a training run, a merge
REPO = "me/grpo-run"


def hub_env(tmp_path, url, token="hf_test"):
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", HF_ENDPOINT=url)
    env["HF_HOME"] = str(tmp_path / "hf_home")  # no stored token: only HF_TOKEN
    env.pop("HF_TOKEN", None)
    if token:
        env["HF_TOKEN"] = token
    return env


def train(tiny_model_dir, data, out, env, *extra, timeout=400) -> subprocess.CompletedProcess:
    cmd = train_cmd()
    cmd += common(tiny_model_dir, data, out, "rollout.height=64", "rollout.width=64", f"hub.repo_id={REPO}", *extra)
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_run_card_checkpoint_uploads_failed_final_upload_push_and_merge(tiny_model_dir, data64, tmp_path, capfd):
    out = tmp_path / "run"
    # checkpoint uploads go through, the final one fails: the run still saves everything and exits 4
    with FakeHub(fail_commits=lambda paths: not paths[0].startswith("checkpoints/")) as hub:
        env = hub_env(tmp_path, hub.url)
        proc = train(
            tiny_model_dir,
            data64,
            out,
            env,
            "max_steps=2",
            "save_steps=1",
            "hub.push_checkpoints=true",
            f"eval.file={data64}",
            "eval.num_prompts=2",
            "eval.group_size=2",
        )
        assert proc.returncode == 4, proc.stderr[-3000:]
        warnings = [line for line in proc.stderr.splitlines() if "warning: uploading" in line]
        assert len(warnings) == 1 and f"{out / 'final_adapter'} to the Hub repo {REPO} failed" in warnings[0]
        assert f"retry with `glm-grpo push {out}`" in warnings[0]
        assert (
            proc.stderr.strip()
            .splitlines()[-1]
            .startswith(
                f"glm-grpo train: training finished and everything is saved in {out}, but 1 upload(s) to the Hub repo "
                f"{REPO} failed (final_adapter)"
            )
        )
        assert "Traceback" not in proc.stderr

        adapter = out / "final_adapter"
        assert {p.name for p in adapter.iterdir()} == {
            "README.md",
            "adapter_config.json",
            "adapter_model.safetensors",
            "reward_curve.png",
            "training_state.json",  # the step these weights are from (glm_grpo_ds/lifecycle/resume.py)
        }
        from safetensors.torch import load_file

        assert all(t.numel() > 0 for t in load_file(adapter / "adapter_model.safetensors").values())
        # readable by teammates as the umask allows (safetensors alone writes 0600; issue #27)
        from glm_grpo_ds.runtime.file_modes import umask

        assert (adapter / "adapter_model.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask()

        # the card: metadata, and the numbers of metrics.jsonl / eval.jsonl / config.json
        card = ModelCard.load(adapter / "README.md")
        assert card.data.library_name == "peft" and card.data.pipeline_tag == "text-to-image"
        assert card.data.base_model is None  # the tiny model is a local directory (no Hub id)
        assert {"glm-image", "grpo", "text-to-image", "lora"} <= set(card.data.tags)
        rows, evals = jsonl(out / "metrics.jsonl"), jsonl(out / "eval.jsonl")
        assert [r["step"] for r in rows] == [1, 2] and [e["step"] for e in evals] == [0, 2]
        text = card.text
        assert f"`{tiny_model_dir}` (a local directory)" in text
        assert "| steps done | 2 of 2 |" in text
        assert f"| final training reward (last step, mean over its samples) | {rows[-1]['reward_mean']:.4g} |" in text
        e0, e1 = evals[0]["eval/reward_mean"], evals[-1]["eval/reward_mean"]
        assert f"| eval reward (fixed seeds), step 0 -> step 2 | {e0:.4g} -> {e1:.4g} |" in text
        for row in ("| group size G | 8 |", "| beta (KL) | 0 |", "| optimizer, learning rate | adamw_8bit, 0.01 ("):
            assert row in text
        assert "| DeepSpeed ZeRO stage | 2 |" in text and "| world size (ranks) | 1 |" in text
        assert "LoRA r=16, alpha=32" in text and "| pixel_mse | 1.0 | - |" in text
        assert "![reward curve](reward_curve.png)" in text
        assert (adapter / "reward_curve.png").read_bytes() == (out / "reward_curve.png").read_bytes()
        # the data and the framework versions it was trained with, as TRL's cards name them
        assert f"- training data: `{data64}`, 8 prompts" in text
        assert "## Framework versions" in text and f"- peft: {importlib.metadata.version('peft')}" in text
        # uploaded: the card's code loads the adapter from the Hub repo; its commands need a local copy
        code = text.split("```python\n", 1)[1].split("```", 1)[0]
        assert f'pipe.vision_language_encoder, "{REPO}"' in code and "torch_dtype" not in code
        assert "--adapter ADAPTER_DIR" in text

        # peft's blank template is replaced in every checkpoint's adapter too
        ckpt_card = ModelCard.load(out / "checkpoints" / "step_000001" / "adapter" / "README.md")
        assert "| steps done | 1 of 2 |" in ckpt_card.text and "More Information Needed" not in ckpt_card.text

        # what reached the Hub during training: the private repo, both checkpoints' adapters, bytes as saved
        assert hub.repos[REPO]["private"] is True and hub.tokens == {"hf_test"}
        files = hub.files(REPO)
        for step in (1, 2):
            local = out / "checkpoints" / f"step_{step:06d}" / "adapter"
            for name in ("adapter_config.json", "adapter_model.safetensors", "README.md"):
                assert files[f"checkpoints/step_{step:06d}/{name}"] == (local / name).read_bytes()
        assert not any("/" not in p for p in files)  # the final upload failed

        # the retry the run named: uploads the final adapter to the root of the repo
        hub.fail_commits = False
        push = subprocess.run(
            [sys.executable, "-m", "glm_grpo_ds", "push", str(out)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert push.returncode == 0, push.stderr
        files = hub.files(REPO)
        for path in adapter.iterdir():
            assert files[path.name] == path.read_bytes(), path.name

    # the merged pipeline's card carries the adapter's results
    merged = tmp_path / "merged"
    merge = ["merge", "--base", tiny_model_dir, "--adapter", adapter, "--out", merged, "--dtype", "fp32"]
    code, _, err = glm_grpo(merge, capfd)  # in this process (tests/in_process.py)
    assert code == 0, err
    card = ModelCard.load(merged / "README.md")
    assert card.data.library_name == "diffusers" and "merged" in card.data.tags
    assert f"- adapter: `{adapter}`" in card.text and "- merged weights dtype: fp32" in card.text
    assert "## Results (of the adapter)" in card.text and "| steps done | 2 of 2 |" in card.text
    assert (merged / "reward_curve.png").is_file()

    # the same run without hub.repo_id: the card's own code, run from another directory against this
    # adapter (issue #27), loads it (absolute paths, `dtype=`) and renders at the run's size and steps
    local = tmp_path / "local_run"
    shutil.copytree(adapter, local / "final_adapter")
    saved = json.loads((out / "config.json").read_text())
    saved["train"]["hub"]["repo_id"] = None
    (local / "config.json").write_text(json.dumps(saved))
    shutil.copy(out / "metrics.jsonl", local / "metrics.jsonl")
    text = ModelCard.load(write_run_card(local, local / "final_adapter")).text
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    assert "torch_dtype" not in code and "height=64, width=64, num_inference_steps=2" in code
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    snippet = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert snippet.returncode == 0, snippet.stderr[-3000:]
    from PIL import Image

    assert Image.open(elsewhere / "grpo.png").size == (64, 64)
    render_line = next(line for line in text.splitlines() if line.startswith("glm-grpo render"))
    assert f"--adapter {(local / 'final_adapter').resolve()} " in render_line
    assert "--height 64 --width 64 --steps 2 --guidance" in render_line


def test_no_token_fails_at_startup(tiny_model_dir, data64, tmp_path):
    with FakeHub() as hub:
        proc = train(tiny_model_dir, data64, tmp_path / "run", hub_env(tmp_path, hub.url, token=None), timeout=200)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"glm-grpo train: hub.repo_id={REPO} needs a Hugging Face token with write access: set HF_TOKEN or run "
        "`hf auth login` (the token is never read from the config), or set hub.repo_id=null to train without uploading"
    )
    assert not hub.repos and not (tmp_path / "run" / "final_adapter").exists()


@pytest.mark.distributed
def test_a_checkpoint_upload_longer_than_the_timeout_keeps_no_rank_waiting(tiny_model_dir, data64, tmp_path):
    """2 ranks with an 18 s process-group timeout (dist_timeout_minutes=0.3) and a checkpoint upload that
    takes 30 s: rank 0 uploads on its worker thread while both ranks go on (before, rank 1 timed out in
    the collective after the save while rank 0 uploaded); the end waits for the upload, then the final one."""
    out = tmp_path / "run"
    with FakeHub(slow_commits=lambda paths: 30.0 if paths[0].startswith("checkpoints/") else 0.0) as hub:
        args = train_args()
        args += common(tiny_model_dir, data64, out, "rollout.height=64", "rollout.width=64", "grpo.group_size=4")
        args += ["max_steps=2", "save_steps=2", f"hub.repo_id={REPO}", "hub.push_checkpoints=true"]
        cmd, _, _ = launch_cmd(2, [*args, "dist_timeout_minutes=0.3", "logging.plot=false"])
        env = dict(hub_env(tmp_path, hub.url), DS_ACCELERATOR="cpu")
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=500)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        # the checkpoint's upload, then the final adapter's
        assert [c["paths"][0].startswith("checkpoints/step_000002/") for c in hub.commits] == [True, False]
        assert "checkpoints/step_000002/adapter_model.safetensors" in hub.files(REPO)
        assert "adapter_model.safetensors" in hub.files(REPO)
