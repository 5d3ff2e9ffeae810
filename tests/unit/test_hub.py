"""Model cards and Hub uploads on synthetic run directories (adapter files in peft's format), real huggingface_hub
(ModelCard, HfApi and its HTTP client) against a local stand-in of the Hub (glm_grpo_ds/testing/fake_hub.py).
The cards of a real training run and `glm-grpo merge`: tests/integration/test_sharing.py."""

import json
import logging

import pytest
import torch
from huggingface_hub import ModelCard

from glm_grpo_ds.config import ConfigError, RewardSpec, TrainConfig, load_config, to_dict
from glm_grpo_ds.sharing.card_parts import base_model_id
from glm_grpo_ds.sharing.hub import EXIT_PUSH_FAILED, HubError, Publisher, prepare_repo
from glm_grpo_ds.sharing.model_card import write_run_card
from glm_grpo_ds.sharing.run_sections import run_results
from glm_grpo_ds.testing.fake_hub import FakeHub

ROOT_FILES = {"README.md", "adapter_config.json", "adapter_model.safetensors", "reward_curve.png"}


def save_adapter(directory, seed=0):
    """An adapter directory in peft's format (the files a real peft adapter of the trainer has are in
    tests/integration/test_sharing.py; peft's import alone would triple this file's time)."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True)
    gen = torch.Generator().manual_seed(seed)
    save_file(
        {"base_model.model.q_proj.lora_A.weight": torch.randn(2, 8, generator=gen)},
        directory / "adapter_model.safetensors",
    )
    (directory / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2, "lora_alpha": 4}))
    return directory


def make_run(root, steps=25, evals=(0, 25), **hub):
    """output_dir of a finished LoRA run: config.json, metrics.jsonl (reward_mean = step / 100), eval.jsonl,
    final_adapter/, checkpoints/step_000010/adapter/."""
    cfg = TrainConfig()
    cfg.model.path, cfg.data.train_file, cfg.max_steps, cfg.save_steps = str(root / "base"), "p.txt", steps, 10
    cfg.rewards = [RewardSpec(name="pixel_mse", weight=1.0), RewardSpec(name="pixel_mse", weight=0.5)]
    cfg.eval.file = "p.txt" if evals else ""  # it evaluated: eval.jsonl is what its monitor checked
    for key, value in hub.items():
        setattr(cfg.hub, key, value)
    cfg.validate()
    out = root / "run"
    out.mkdir(parents=True)
    ds = {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}
    ds["zero_optimization"] = {"stage": 3}
    (out / "config.json").write_text(json.dumps({"train": to_dict(cfg), "deepspeed": ds}))
    rows = [
        {"step": s, "reward_mean": s / 100, "reward/pixel_mse": s / 50, "reward/pixel_mse#2": -s / 100}
        for s in range(1, steps + 1)
    ]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "eval.jsonl").write_text(
        "".join(json.dumps({"step": s, "eval/reward_mean": 0.5 + s / 1000}) + "\n" for s in evals)
    )
    save_adapter(out / "final_adapter")
    ckpt = out / "checkpoints" / "step_000010"
    save_adapter(ckpt / "adapter", seed=1)
    (ckpt / "trainer_state.json").write_text(json.dumps({"step": 10}))
    return out, cfg


def test_run_card_numbers_metadata_and_curve(tmp_path):
    out, _ = make_run(tmp_path)
    res = run_results(out)
    assert res["steps_done"] == 25 and res["final_train_reward"] == 0.25
    assert res["last_window_reward"] == pytest.approx(sum(range(16, 26)) / 1000)
    assert res["first_eval"] == (0, 0.5) and res["final_eval"] == (25, 0.525)
    card_path = write_run_card(out, out / "final_adapter")
    card = ModelCard.load(card_path)
    assert card.data.library_name == "peft" and card.data.pipeline_tag == "text-to-image"
    assert card.data.base_model is None  # a local directory is no Hub id: the Hub would refuse it
    assert {"glm-image", "grpo", "text-to-image", "lora", "glm-grpo-ds"} <= set(card.data.tags)
    text = card.text
    assert f"`{tmp_path / 'base'}` (a local directory)" in text
    assert "| steps done | 25 of 25 |" in text
    assert "| final training reward (last step, mean over its samples) | 0.25 |" in text
    assert f"| training reward, mean of the first -> last 10 steps | {0.055:.4g} -> {0.205:.4g} |" in text
    assert (
        "| final training reward: pixel_mse | 0.5 |" in text
        and "| final training reward: pixel_mse#2 | -0.25 |" in text
    )
    assert "| eval reward (fixed seeds), step 0 -> step 25 | 0.5 -> 0.525 |" in text
    assert "| pixel_mse#2 | 0.5 | - |" in text and "| group size G | 8 |" in text and "| beta (KL) | 0.04 |" in text
    assert "| DeepSpeed ZeRO stage | 3 |" in text and "| world size (ranks) | 4 |" in text
    assert "| prompts per step | 4 |" in text and "LoRA r=16, alpha=32" in text
    # the curve is drawn beside the weights (output_dir has none) and referenced relatively
    assert (
        "![reward curve](reward_curve.png)" in text
        and (out / "final_adapter" / "reward_curve.png").stat().st_size > 1000
    )
    assert f'PeftModel.from_pretrained(\n    pipe.vision_language_encoder, "{out / "final_adapter"}"' in text
    assert "glm-grpo merge --base" in text and "glm-grpo render --model" in text

    lowered, _ = make_run(tmp_path / "lowered", steps=25)  # resumed at 25 with max_steps lowered to 20
    saved = json.loads((lowered / "config.json").read_text())
    saved["train"]["max_steps"] = 20
    (lowered / "config.json").write_text(json.dumps(saved))
    lowered_card = ModelCard.load(write_run_card(lowered, lowered / "final_adapter")).text
    assert "| steps done | 25 (max_steps lowered to 20) |" in lowered_card

    ckpt_card = ModelCard.load(write_run_card(out, out / "checkpoints" / "step_000010" / "adapter", step=10))
    assert (
        "| steps done | 10 of 25 |" in ckpt_card.text
        and "| final training reward (last step, mean over its samples) | 0.1 |" in ckpt_card.text
    )
    # the step-25 eval came later
    assert "eval reward (fixed seeds) at step 0 (before training: the base model's) | 0.5 |" in ckpt_card.text


def test_the_cards_list_the_alarms_that_fired_with_step_value_and_bound(tmp_path):
    """The run's image statistics (eval.jsonl) against its rules (config.json's monitor.alarms, the defaults): the
    final adapter's card lists the alarm that fired, a checkpoint's card the alarms up to its step (none), a merged
    pipeline's card carries the adapter's; a run without image statistics gets no Alarms section."""
    from glm_grpo_ds.sharing.merged_card import merged_card

    out, _ = make_run(tmp_path)
    assert "## Alarms" not in ModelCard.load(write_run_card(out, out / "final_adapter")).text
    evals = [{"step": s, "eval/images/dark_fraction": d, "eval/images/bright_fraction": 0.2} for s, d in
             [(0, 0.1), (5, 0.2), (20, 0.5), (25, 0.6)]]  # fmt: skip
    (out / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))
    text = ModelCard.load(write_run_card(out, out / "final_adapter")).text
    line = (
        "- 'dark_fraction > start + 0.25' fired at step 20: dark_fraction 0.5 vs bound 0.35 (start 0.1 at step 0); "
        "held at steps 20, 25, still holding at the end"
    )
    assert "## Alarms" in text and line in text and "bright_fraction > start + 0.25' fired" not in text
    ckpt = ModelCard.load(write_run_card(out, out / "checkpoints" / "step_000010" / "adapter", step=10)).text
    rules = "`dark_fraction > start + 0.25`; `bright_fraction > start + 0.25`"
    assert f"No image-statistics alarm fired during training (rules: {rules})." in ckpt and line not in ckpt
    merged = merged_card(tmp_path / "base", out / "final_adapter", out / "final_adapter" / "README.md", "fp32", out)
    assert "## Alarms (of the adapter)" in merged.text and line in merged.text


def test_the_cards_list_the_rewards_that_failed_up_to_their_step(tmp_path):
    """A reward that raised on some samples (reward/<label>_failed in metrics.jsonl): the final adapter's card has a
    line for it, a checkpoint's card counts only up to its step, a merged pipeline's card carries the adapter's; a
    run whose rewards never failed gets no section."""
    from glm_grpo_ds.sharing.merged_card import merged_card

    out, _ = make_run(tmp_path)
    assert "## Reward failures" not in ModelCard.load(write_run_card(out, out / "final_adapter")).text
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        r["reward/pixel_mse#2_failed"] = 4 if r["step"] in (3, 4, 12) else 0
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = ModelCard.load(write_run_card(out, out / "final_adapter")).text
    assert "## Reward failures" in text
    assert "- pixel_mse#2: 12 samples undefined by failures in 3 of 25 steps (steps 3-12;" in text
    ckpt = ModelCard.load(write_run_card(out, out / "checkpoints" / "step_000010" / "adapter", step=10)).text
    assert "- pixel_mse#2: 8 samples undefined by failures in 2 of 10 steps (steps 3-4;" in ckpt
    merged = merged_card(tmp_path / "base", out / "final_adapter", out / "final_adapter" / "README.md", "fp32", out)
    assert "## Reward failures (of the adapter)" in merged.text and "in 3 of 25 steps" in merged.text


def test_base_model_ids(tmp_path):
    snapshot = tmp_path / "hub" / "models--zai-org--GLM-Image" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    assert base_model_id(str(snapshot)) == ("zai-org/GLM-Image", "a" * 40)  # huggingface_hub's cache layout
    assert base_model_id(str(snapshot), revision="main") == ("zai-org/GLM-Image", "main")
    assert base_model_id("zai-org/GLM-Image", "b" * 40) == ("zai-org/GLM-Image", "b" * 40)  # a Hub id
    assert base_model_id(str(tmp_path)) == (None, None)  # a local directory
    assert base_model_id(str(tmp_path), override="me/base") == ("me/base", None)

    # the card names the Hub id and revision, and keeps the base card's license
    (snapshot / "README.md").write_text("---\nlicense: mit\n---\n# GLM-Image\n")
    out, _ = make_run(tmp_path)
    saved = json.loads((out / "config.json").read_text())
    saved["train"]["model"]["path"] = str(snapshot)
    (out / "config.json").write_text(json.dumps(saved))
    card = ModelCard.load(write_run_card(out, out / "final_adapter"))
    assert card.data.base_model == "zai-org/GLM-Image" and card.data.license == "mit"
    assert (
        f"revision `{'a' * 40}`" in card.text
        and "[zai-org/GLM-Image](https://huggingface.co/zai-org/GLM-Image)" in card.text
    )

    # what the trainer recorded of its model source wins over the path as given at launch
    saved["train"]["model"]["path"] = "zai-org/GLM-Image"  # as typed: the run resolved it through the cache
    saved["model_source"] = {
        "path": str(snapshot),
        "repo_id": "zai-org/GLM-Image",
        "revision": None,
        "commit": "c" * 40,
    }
    (out / "config.json").write_text(json.dumps(saved))
    card = ModelCard.load(write_run_card(out, out / "final_adapter"))
    assert card.data.base_model == "zai-org/GLM-Image" and f"revision `{'c' * 40}`" in card.text
    saved["train"]["model"]["path"] = "relative/model"  # a local directory given relative to the launch dir
    saved["model_source"] = {"path": str(tmp_path), "repo_id": None, "revision": None, "commit": None}
    (out / "config.json").write_text(json.dumps(saved))
    card = ModelCard.load(write_run_card(out, out / "final_adapter"))
    assert card.data.base_model is None and f"`{tmp_path}` (a local directory)" in card.text


@pytest.mark.parametrize(
    "overrides, error",
    [
        (["hub.repo_id=run"], "hub.repo_id='run' is not a Hub repo id: write namespace/name"),
        (["hub.repo_id=me/a/b"], "hub.repo_id='me/a/b' is not a Hub repo id"),
        (["hub.repo_id=me/bad name"], "hub.repo_id='me/bad name' is not a Hub repo id"),
        (["hub.push_checkpoints=true", "save_steps=5"], "hub.push_checkpoints is set but hub.repo_id is null"),
        (["hub.repo_id=me/run", "hub.push_checkpoints=true", "save_steps=5", "lora=null"], "needs LoRA"),
        (["hub.repo_id=me/run", "hub.push_checkpoints=true"], "save_steps=0 saves no checkpoint"),
        (["hub.base_model=/models/GLM-Image"], "hub.base_model='/models/GLM-Image' is not a Hub model id"),
    ],
)
def test_hub_config_errors(tmp_path, overrides, error):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model: {path: m}\ndata: {train_file: p.txt}\nrewards: [{name: pixel_mse}]\n")
    with pytest.raises(ConfigError) as err:
        load_config(cfg, overrides)
    assert len(str(err.value).splitlines()) == 1 and error in str(err.value)
    assert load_config(cfg, ["hub.repo_id=me/run.v2-x_y"]).hub.private is True  # default: private


@pytest.fixture
def hub_env(monkeypatch, tmp_path):
    """HF_TOKEN set, no stored token, requests to the stand-in; HF_HUB_OFFLINE=1 stays set (tests run offline)."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_TOKEN", "hf_from_env")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf_home" / "token"))
    assert constants.HF_HUB_OFFLINE

    def serve(**kwargs):
        hub = FakeHub(**kwargs).__enter__()
        monkeypatch.setattr(constants, "ENDPOINT", hub.url)
        served.append(hub)
        return hub

    served = []
    yield serve
    for hub in served:
        hub.__exit__(None, None, None)


def test_publisher_uploads_final_and_checkpoints(tmp_path, hub_env):
    hub = hub_env()
    out, cfg = make_run(tmp_path, repo_id="me/run", push_checkpoints=True)
    publisher = Publisher(cfg, out, rank=0)  # startup: creates the repo, private by default
    assert hub.repos["me/run"]["private"] is True and hub.files("me/run") == {}
    publisher.checkpoint(out / "checkpoints" / "step_000010", 10)
    publisher.final(out / "final_adapter")  # the card; the upload waits for finish()
    assert not any("/" not in p for p in hub.files("me/run"))
    assert publisher.finish() == 0
    files = hub.files("me/run")
    root = {p for p in files if "/" not in p}
    assert root == ROOT_FILES
    for name in root:
        assert files[name] == (out / "final_adapter" / name).read_bytes(), name
    ckpt = {p: b for p, b in files.items() if p.startswith("checkpoints/")}
    assert set(ckpt) == {
        f"checkpoints/step_000010/{n}" for n in ("README.md", "adapter_config.json", "adapter_model.safetensors")
    }
    assert (
        ckpt["checkpoints/step_000010/adapter_model.safetensors"]
        == (out / "checkpoints/step_000010/adapter/adapter_model.safetensors").read_bytes()
    )
    assert hub.tokens == {"hf_from_env"}  # from HF_TOKEN, never from the config
    card = ModelCard.load(out / "final_adapter" / "README.md")
    assert "| steps done | 25 of 25 |" in card.text and "# me/run" in card.text
    assert '"me/run"' in card.text  # the snippet loads from the repo the card is uploaded to
    ckpt_card = (out / "checkpoints/step_000010/adapter/README.md").read_text()
    assert 'subfolder="checkpoints/step_000010"' in ckpt_card


def test_failed_upload_keeps_local_files_and_exits_4(tmp_path, hub_env, caplog, capsys):
    hub = hub_env(fail_commits=True)
    out, cfg = make_run(tmp_path, repo_id="me/run")
    before = (out / "final_adapter" / "adapter_model.safetensors").read_bytes()
    publisher = Publisher(cfg, out, rank=0)
    publisher.final(out / "final_adapter")
    with caplog.at_level(logging.WARNING):
        status = publisher.finish()
    assert status == EXIT_PUSH_FAILED == 4
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == "glm_grpo"]
    assert len(lines) == 1 and len(lines[0].splitlines()) == 1
    assert "Hub repo me/run" in lines[0] and f"glm-grpo push {out}" in lines[0] and "403 Forbidden" in lines[0]
    assert (out / "final_adapter" / "adapter_model.safetensors").read_bytes() == before
    assert ModelCard.load(out / "final_adapter" / "README.md").data.library_name == "peft"
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"glm-grpo train: training finished and everything is saved in {out}, but 1 upload(s) to the Hub repo "
        f"me/run failed (final_adapter); retry with `glm-grpo push {out}`"
    )

    # the retry the message names uploads what the run meant to
    from glm_grpo_ds.commands.push import main as push_main

    hub.fail_commits = False
    assert push_main([str(out)]) == 0
    assert set(hub.files("me/run")) == ROOT_FILES


def test_push_elsewhere_than_the_run_said_uploads_cards_that_point_there(tmp_path, hub_env, capsys):
    """A run trained without hub.repo_id has cards that load from its local folder: `glm-grpo push --repo-id
    --revision --checkpoints` rewrites them for where the weights go (the repo, the branch, each checkpoint's
    subfolder), not a reader's copy of /scratch paths; an upload that fails is one line."""
    from glm_grpo_ds.commands.push import main as push_main

    hub = hub_env()
    out, _ = make_run(tmp_path)
    write_run_card(out, out / "final_adapter")
    assert str((out / "final_adapter").resolve()) in (out / "final_adapter" / "README.md").read_text()
    assert push_main([str(out), "--repo-id", "me/other", "--revision", "v1", "--checkpoints"]) == 0
    files = hub.files("me/other", revision="v1")
    card, ckpt_card = files["README.md"].decode(), files["checkpoints/step_000010/README.md"].decode()
    assert '"me/other"' in card and 'revision="v1"' in card and "# me/other" in card and str(out) not in card
    assert 'subfolder="checkpoints/step_000010"' in ckpt_card and str(out) not in ckpt_card
    capsys.readouterr()
    hub.fail_commits = True
    assert push_main([str(out), "--repo-id", "me/other"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"glm-grpo push: uploading {out / 'final_adapter'} to me/other failed")


def test_push_without_a_token_says_what_push_can_do(tmp_path, hub_env, capsys, monkeypatch):
    """It said "or set hub.repo_id=null to train without uploading", the training's way out, to a push."""
    from glm_grpo_ds.commands.push import main as push_main

    hub_env()
    monkeypatch.delenv("HF_TOKEN")
    out, _ = make_run(tmp_path)
    assert push_main([str(out), "--repo-id", "me/other"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith("(the token is never read from the config), then push again"), err


def test_push_checkpoints_with_none_to_upload_says_so(tmp_path, hub_env, capsys):
    """A full fine-tuning's checkpoints hold DeepSpeed's shards only: `push --checkpoints` uploaded the final weights
    alone, exit 0, and said nothing of the checkpoints asked for."""
    import shutil

    from glm_grpo_ds.commands.push import main as push_main

    hub = hub_env()
    out, _ = make_run(tmp_path)
    shutil.rmtree(out / "checkpoints" / "step_000010" / "adapter")  # as a full fine-tuning's checkpoint
    capsys.readouterr()
    assert push_main([str(out), "--repo-id", "me/other", "--checkpoints"]) == 0
    err = capsys.readouterr().err
    assert err == (
        f"glm-grpo push: --checkpoints: no checkpoint in {out / 'checkpoints'} holds an adapter (a full fine-tuning's "
        "hold DeepSpeed's shards only): uploading the final weights alone\n"
    )
    assert not any(name.startswith("checkpoints/") for name in hub.files("me/other"))


def test_push_keeps_a_card_the_user_wrote_and_replaces_peft_s_template(tmp_path, hub_env, capsys):
    """final_adapter/README.md written by hand was replaced by push without a copy; peft's filled-in template (what
    save_pretrained leaves) is still replaced by a glm-grpo card."""
    from huggingface_hub import ModelCard, ModelCardData

    from glm_grpo_ds.commands.push import main as push_main

    hub = hub_env()
    out, _ = make_run(tmp_path, repo_id="me/own")
    card = out / "final_adapter" / "README.md"
    card.write_text("# My adapter\n\nTrained on our house style; ask Ana before using it.\n")
    assert push_main([str(out)]) == 0
    assert hub.files("me/own")["README.md"].decode().startswith("# My adapter") and "ask Ana" in card.read_text()
    assert f"kept the model card {card}" in capsys.readouterr().out
    ModelCard.from_template(ModelCardData(library_name="peft")).save(card)  # what peft's save_pretrained writes
    assert push_main([str(out)]) == 0
    assert '"me/own"' in hub.files("me/own")["README.md"].decode()  # ours: the code loads the repo's adapter


def test_a_push_to_the_runs_own_repo_after_one_elsewhere_uploads_a_card_naming_its_own(tmp_path, hub_env):
    """The card the push to me/other wrote stayed: the run's own repo got a card whose title and code named
    me/other."""
    from glm_grpo_ds.commands.push import main as push_main

    hub = hub_env()
    out, _ = make_run(tmp_path, repo_id="me/own")
    assert push_main([str(out), "--repo-id", "me/other"]) == 0
    assert push_main([str(out)]) == 0
    card = hub.files("me/own")["README.md"].decode()
    assert "# me/own" in card and '"me/own"' in card and "me/other" not in card


def test_push_of_a_folder_with_a_models_config_json_is_one_line(tmp_path, capsys):
    """A model directory has a config.json too: push stopped with KeyError: 'train'."""
    from glm_grpo_ds.commands.push import main as push_main

    (tmp_path / "config.json").write_text('{"architectures": ["GlmImageForConditionalGeneration"]}')
    assert push_main([str(tmp_path), "--repo-id", "me/x"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"glm-grpo push: {tmp_path}/config.json is not a glm-grpo run's (no train section): {tmp_path} is not a "
        "glm-grpo run directory; give the training run's output_dir"
    )


def test_repo_checks(tmp_path, hub_env, monkeypatch):
    from huggingface_hub import HfApi

    hub = hub_env(existing={"me/public": False})
    with pytest.raises(HubError, match="exists and is public but hub.private is true"):
        prepare_repo(HfApi(), "me/public", True, None)
    assert prepare_repo(HfApi(), "me/public", False, None).endswith("/me/public")  # public on purpose: allowed
    prepare_repo(HfApi(), "me/new", True, "exp")
    assert hub.repos["me/new"]["private"] and "exp" in hub.repos["me/new"]["branches"]
    monkeypatch.delenv("HF_TOKEN")
    with pytest.raises(
        HubError, match="needs a Hugging Face token with write access: set HF_TOKEN or run `hf auth login`"
    ):
        prepare_repo(HfApi(), "me/new", True, None)
    monkeypatch.setenv("HF_TOKEN", "hf_x")
    hub.__exit__(None, None, None)  # nothing listens any more
    with pytest.raises(HubError) as err:
        prepare_repo(HfApi(), "me/new", True, None)
    assert "cannot create or reach the repo" in str(err.value) and len(str(err.value).splitlines()) == 1


def test_full_model_and_merged_cards(tmp_path):
    from safetensors.torch import save_file

    from glm_grpo_ds.sharing.merged_card import write_merged_card

    out, _ = make_run(tmp_path)
    saved = json.loads((out / "config.json").read_text())
    saved["train"]["lora"] = None  # full fine-tuning
    (out / "config.json").write_text(json.dumps(saved))
    final = out / "final_model"
    final.mkdir()
    save_file({"w": torch.zeros(2)}, final / "model.safetensors")
    card = ModelCard.load(write_run_card(out, final))
    assert card.data.library_name == "transformers" and "lora" not in card.data.tags
    assert (
        "| fine-tuning | full |" in card.text
        and f'GlmImageForConditionalGeneration.from_pretrained("{final}"' in card.text
    )

    # a merged pipeline from a full fine-tuning checkpoint (no adapter, no card) and from a carded adapter
    base = tmp_path / "base"
    base.mkdir()
    (base / "README.md").write_text("---\nlicense: mit\n---\n")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "trainer_state.json").write_text(json.dumps({"step": 3, "lora": False}))
    (tmp_path / "m1").mkdir()
    merged = ModelCard.load(write_merged_card(tmp_path / "m1", base, ckpt, "bf16"))
    assert merged.data.library_name == "diffusers" and merged.data.license == "mit" and "lora" not in merged.data.tags
    assert "- weights dtype: bf16" in merged.text and "came without a card" in merged.text
    assert merged.text.lstrip().startswith("# GLM-Image fine-tuned with GRPO\n")  # not "GRPO adapter (merged)"
    write_run_card(out, out / "final_adapter")
    (tmp_path / "m2").mkdir()
    merged = ModelCard.load(write_merged_card(tmp_path / "m2", base, out / "final_adapter", "fp32", tmp_path / "M"))
    assert "lora" in merged.data.tags and "## Results (of the adapter)" in merged.text
    assert "| steps done | 25 of 25 |" in merged.text and (tmp_path / "m2" / "reward_curve.png").is_file()
    assert f'GlmImagePipeline.from_pretrained("{tmp_path / "M"}"' in merged.text


def test_the_cards_code_loads_the_base_commit_the_run_trained_on(tmp_path):
    """The card named the base's commit in its text only: its code and the render / merge commands loaded the Hub
    id's main, another model once the base repo moves (or for a run on another revision)."""
    out, _ = make_run(tmp_path)
    saved = json.loads((out / "config.json").read_text())
    saved["model_source"] = {"path": str(tmp_path / "base"), "repo_id": "zai-org/GLM-Image", "commit": "abc123"}
    (out / "config.json").write_text(json.dumps(saved))
    text = ModelCard.load(write_run_card(out, out / "final_adapter")).text
    assert 'GlmImagePipeline.from_pretrained("zai-org/GLM-Image", revision="abc123", dtype=dtype)' in text
    assert "glm-grpo render --model zai-org/GLM-Image --revision abc123 --adapter" in text
    assert "glm-grpo merge --base zai-org/GLM-Image --revision abc123 --adapter" in text


def test_a_card_or_curve_rank_0_cannot_write_is_a_warning_not_rank_0_ending_alone(tmp_path, caplog):
    """A records file edited by hand made the card (and the curve) raise on rank 0 alone, after the checkpoint's last
    barrier: the other ranks waited in the next collective until it timed out."""
    from glm_grpo_ds.observability.plot import PLOT_NAME, plot_training_or_warn

    out, _ = make_run(tmp_path)
    (out / "metrics.jsonl").write_text('{"step": 1, "reward_mean": 0.1}\nnot json\n')
    with pytest.raises(ValueError):
        write_run_card(out, out / "final_adapter")  # what rank 0 met
    publisher = Publisher(TrainConfig(), out, 0)
    with caplog.at_level(logging.WARNING):
        publisher.final(out / "final_adapter")
        publisher.checkpoint(out / "checkpoints" / "step_000010", 10)
        plot_training_or_warn(out)
    assert publisher.final_weights == out / "final_adapter" and not (out / PLOT_NAME).exists()
    said = [r.getMessage() for r in caplog.records if "could not be" in r.getMessage()]
    assert len(said) == 3 and "`glm-grpo push" in said[0], said


def test_a_checkpoints_card_written_again_has_its_own_settings_not_a_later_launchs(tmp_path):
    """glm-grpo push --checkpoints rewrote step 10's card from the last launch's config.json: its training table had
    the later lr and max_steps, and it listed a resume's change from step 21 that came after it."""
    out, cfg = make_run(tmp_path)
    saved = json.loads((out / "config.json").read_text())
    at_10 = json.loads(json.dumps(saved["train"]))
    saved["train"]["max_steps"], saved["train"]["optimizer"]["lr"] = 40, 2e-5
    saved["segments"] = [{"from_step": 0}, {"from_step": 20, "changed": {"optimizer.lr": [1e-5, 2e-5]}}]
    (out / "config.json").write_text(json.dumps(saved))
    state = out / "checkpoints" / "step_000010" / "trainer_state.json"
    state.write_text(json.dumps({"step": 10, "config": at_10}))
    text = ModelCard.load(write_run_card(out, state.parent / "adapter", step=10)).text
    assert "| steps done | 10 of 25 |" in text and "from step 21" not in text
    final = ModelCard.load(write_run_card(out, out / "final_adapter")).text
    assert "| steps done | 25 of 40 |" in final and "from step 21: `optimizer.lr` 1e-05 -> 2e-05" in final


def test_a_checkpoint_upload_skipped_behind_a_slow_one_ends_the_run_with_4_and_the_retry(tmp_path, hub_env, caplog):
    """The skip was a warning only and the run exited 0: a job script that asked for the checkpoints on the Hub saw
    success with one missing."""
    hub = hub_env(slow_commits=lambda paths: 3.0 if "step_000010" in paths[0] else 0.0)
    out, cfg = make_run(tmp_path, repo_id="me/run", push_checkpoints=True)
    second = out / "checkpoints" / "step_000020"
    save_adapter(second / "adapter", seed=2)
    (second / "trainer_state.json").write_text(json.dumps({"step": 20}))
    publisher = Publisher(cfg, out, rank=0)
    publisher.upload_wait_s = 0.2
    publisher.checkpoint(out / "checkpoints" / "step_000010", 10)
    publisher.checkpoint(second, 20)  # the first still uploading: skipped
    publisher.final(out / "final_adapter")
    with caplog.at_level(logging.WARNING):
        assert publisher.finish() == EXIT_PUSH_FAILED
    said = [r.getMessage() for r in caplog.records]
    assert any("step_000020 is not uploaded now" in line for line in said), said
    assert "failed (step_000020 (skipped)); retry with `glm-grpo push" in said[-1], said[-1]
    assert "checkpoints/step_000010/adapter_model.safetensors" in hub.files("me/run")


@pytest.mark.parametrize(
    "objective, row",
    [
        ([], "| clip epsilon low / high | 0.2 / 0.28 |"),
        (["grpo.objective=cispo", "grpo.cispo_max=4"], "| CISPO weight cap | 4.0 |"),
        (["grpo.objective=sapo"], "| SAPO temperatures positive / negative | 1.0 / 1.05 |"),
        (["grpo.objective=vespo"], "| VESPO k, lambda positive / negative | 2.0, 3.0 / 3.0, 2.0 |"),
    ],
)
def test_the_cards_training_table_names_the_objective_and_its_numbers(objective, row):
    """The card's method and the policy term's numbers are the run's objective's; a config.json from before
    grpo.objective (no key) reads as clip."""
    from glm_grpo_ds.sharing.run_sections import training_section

    base = ["model.path=/m", "data.train_file=/d.jsonl", "rewards=[{name: pixel_mse}]", "grpo.epsilon_high=0.28"]
    cfg = to_dict(load_config(None, base + objective))
    card = "\n".join(training_section(cfg, {}, ["r"]))
    assert row in card
    words = {"cispo": "CISPO's capped, detached importance weights", "sapo": "SAPO's soft gate"}
    words["vespo"] = "VESPO's gamma-weighted sequences"
    assert words.get(cfg["grpo"]["objective"], "clipped surrogate") in card
    if not objective:
        del cfg["grpo"]["objective"]
        assert "\n".join(training_section(cfg, {}, ["r"])) == card


def test_the_cards_updates_per_rollout_count_the_mini_batches():
    from glm_grpo_ds.sharing.run_sections import training_section

    base = ["model.path=/m", "data.train_file=/d.jsonl", "rewards=[{name: pixel_mse}]", "batch.prompts_per_rank=2"]
    cfg = to_dict(load_config(None, [*base, "grpo.num_iterations=2", "batch.mini_batches=2"]))
    assert "| updates per rollout | 4 (2 x 2 mini-batches) |" in "\n".join(training_section(cfg, {}, ["r"]))
    del cfg["batch"]["mini_batches"]  # a config.json from before batch.mini_batches
    assert "| updates per rollout | 2 |" in "\n".join(training_section(cfg, {}, ["r"]))


def test_the_adapters_moving_average_has_its_card_and_goes_to_ema(tmp_path, hub_env):
    """lora.ema_decay: final_adapter_ema/ gets a card saying the evaluations sampled it and is uploaded to ema/ (by the
    run, and by `glm-grpo push`); the adapter's card says whose the eval rewards are."""
    from glm_grpo_ds.commands.push import main as push_main

    hub = hub_env()
    out, cfg = make_run(tmp_path, repo_id="me/run")
    cfg.lora.ema_decay = 0.9
    record = json.loads((out / "config.json").read_text())
    record["train"]["lora"]["ema_decay"] = 0.9
    (out / "config.json").write_text(json.dumps(record))
    ema = save_adapter(out / "final_adapter_ema", seed=2)
    publisher = Publisher(cfg, out, rank=0)
    publisher.final(out / "final_adapter", ema)
    assert publisher.finish() == 0
    files = hub.files("me/run")
    assert {p for p in files if "/" not in p} == ROOT_FILES
    assert {p for p in files if p.startswith("ema/")} == {f"ema/{name}" for name in ROOT_FILES}
    assert files["ema/adapter_model.safetensors"] == (ema / "adapter_model.safetensors").read_bytes()
    ema_card, card = ModelCard.load(ema / "README.md").text, ModelCard.load(out / "final_adapter" / "README.md").text
    assert "moving average (decay 0.9) of a LoRA adapter" in ema_card and 'subfolder="ema"' in ema_card
    assert "the eval rewards above are this average's" in ema_card
    assert "moving average (lora.ema_decay 0.9: `final_adapter_ema/`, uploaded to `ema/`)" in card
    assert 'subfolder="ema"' not in card
    checkpoint_card = write_run_card(out, out / "checkpoints" / "step_000010" / "adapter", 10).read_text()
    assert "the checkpoint's `adapter_ema/`, not uploaded" in checkpoint_card  # its evaluations' average
    assert "final_adapter_ema" not in checkpoint_card
    hub.repos["me/run"]["branches"]["main"].clear()  # the retry uploads both again
    assert push_main([str(out)]) == 0 and set(hub.files("me/run")) == set(files)
