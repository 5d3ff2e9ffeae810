"""`glm-grpo evaluate`'s pieces that need no model: the settings it takes from the adapter's own run when no
--config is given (glm_grpo_ds/commands/evaluate_settings.py ``run_overrides``), the one-line refusal without
rewards, the progress count that is never silent for long (runtime/progress_count.py), and the gallery's captions
(each tile's own reward: evaluation/report.py ``shown_sample_rewards``)."""

import io
import json
import re
import time
from pathlib import Path

import pytest
import torch

from glm_grpo_ds.commands import evaluate
from glm_grpo_ds.config import load_config
from glm_grpo_ds.config.loading import to_dict


def make_run(root: Path, *overrides: str, checkpoint: bool = False) -> Path:
    """A run directory as the trainer leaves it: config.json ({"train": the whole config, ...}) and an adapter
    directory (final_adapter/, or checkpoints/step_000002/adapter/) with its adapter_config.json; the adapter path."""
    cfg = load_config(None, ["data.train_file=train.jsonl", *overrides])
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"train": to_dict(cfg), "segments": []}))
    adapter = root / ("checkpoints/step_000002/adapter" if checkpoint else "final_adapter")
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text("{}")
    return adapter


RUN = (
    "model.path=/models/tiny",
    "rollout.height=64",
    "rollout.width=96",
    "grpo.sampling.temperature=0.8",
    "eval.num_inference_steps=3",
    "eval.guidance_scale=1.0",
    "eval.seed=7",
    "eval.group_size=3",
    "decoder.dtype=bf16",
    "decoder.fp8=true",
    "rewards=[{name: ssim, weight: 2.0}, {name: pixel_mse}]",
)


def settings(argv, adapters):
    a = evaluate.parse_args(["--prompts", "p.jsonl", *argv])
    cfg, _, lines = evaluate.load_settings(a, [str(p) for p in adapters])
    return a, cfg, lines


def test_without_config_the_adapters_run_gives_size_decode_sampling_and_rewards_saying_so(tmp_path):
    adapter = make_run(tmp_path / "run", *RUN)
    a, cfg, err = settings(["--adapter", str(adapter)], [adapter])
    assert (cfg.model.path, cfg.rollout.height, cfg.rollout.width) == ("/models/tiny", 64, 96)
    assert (cfg.eval.num_inference_steps, cfg.eval.guidance_scale, cfg.grpo.sampling.temperature) == (3, 1.0, 0.8)
    assert [(r.name, r.weight) for r in cfg.rewards] == [("ssim", 2.0), ("pixel_mse", 1.0)]
    assert (a.samples_per_prompt, cfg.eval.seed) == (3, 7)  # the run's own evaluation's K and seeds
    assert (cfg.decoder.dtype, cfg.decoder.fp8) == ("bf16", True)  # the DiT its evaluation decoded with
    assert len(err) == 1, err
    assert err[0].startswith(
        f"glm-grpo evaluate: settings of adapter_0's run, from {tmp_path / 'run' / 'config.json'}: "
    )
    for shown in ("rollout.height=64", "rollout.width=96", "eval.num_inference_steps=3", "eval.guidance_scale=1.0"):
        assert shown in err[0]
    assert "rewards=[ssim, pixel_mse]" in err[0] and err[0].endswith("(a flag, --config or key=value given here wins)")
    # a checkpoint's adapter finds its run above checkpoints/step_N/
    checkpoint = make_run(tmp_path / "run2", *RUN, checkpoint=True)
    _, cfg, err = settings(["--adapter", str(checkpoint)], [checkpoint])
    assert cfg.rollout.width == 96 and str(tmp_path / "run2" / "config.json") in err[0]


def test_a_runs_relative_model_path_holds_from_any_directory(tmp_path, monkeypatch):
    """A run launched with model.path=outputs/world/model (relative) and evaluated from another directory: "model.path
    outputs/world/model ... does not exist". It is taken relative to the run's launch_dir; a run older than
    launch_dir gives the directory it resolved (model_source); a Hub id stays an id."""
    launched = tmp_path / "project"
    (launched / "outputs/world/model").mkdir(parents=True)
    adapter = make_run(tmp_path / "run", *RUN[1:], "model.path=outputs/world/model")
    record = json.loads((tmp_path / "run/config.json").read_text())
    record.update(launch_dir=str(launched), model_source={"path": "/elsewhere/model", "repo_id": None})
    (tmp_path / "run/config.json").write_text(json.dumps(record))
    monkeypatch.chdir(tmp_path)  # not where the run was launched, and with a model of its own at that path
    (tmp_path / "outputs/world/model").mkdir(parents=True)
    _, cfg, err = settings(["--adapter", str(adapter)], [adapter])
    assert cfg.model.path == str(launched / "outputs/world/model") and cfg.model.path in err[0]
    del record["launch_dir"]  # a run written before launch_dir: model_source's directory
    (tmp_path / "outputs/world/model").rmdir()
    record["model_source"]["path"] = str(launched / "outputs/world/model")
    (tmp_path / "run/config.json").write_text(json.dumps(record))
    assert settings(["--adapter", str(adapter)], [adapter])[1].model.path == str(launched / "outputs/world/model")
    record["train"]["model"]["path"] = "zai-org/GLM-Image"
    record["model_source"] = {"path": str(launched / "outputs/world/model"), "repo_id": "zai-org/GLM-Image"}
    (tmp_path / "run/config.json").write_text(json.dumps(record))
    assert settings(["--adapter", str(adapter)], [adapter])[1].model.path == "zai-org/GLM-Image"


def test_without_config_or_prompts_the_line_asks_for_prompts(tmp_path, capfd):
    """It said "data.train_file is required", a key evaluate never asks for (a run without an eval.file)."""
    adapter = make_run(tmp_path / "run", *RUN)
    assert evaluate.main(["--adapter", str(adapter), "--out", str(tmp_path / "o")]) == 2
    assert capfd.readouterr().err == (
        "glm-grpo evaluate: no prompts to evaluate on: give --prompts FILE (the adapter's run had no eval.file, or "
        "give --config RUN_CONFIG)\n"
    )


def test_without_prompts_the_runs_held_out_prompts_are_taken_from_any_directory(tmp_path, monkeypatch):
    """`glm-grpo evaluate --adapter RUN/final_adapter` alone evaluates on the run's own eval.file (relative to where
    the run was launched), its split and its first eval.num_prompts, saying so; --prompts takes none of them."""
    launched = tmp_path / "project"
    (launched / "data").mkdir(parents=True)
    (launched / "data/heldout.jsonl").write_text('{"prompt": "a red cube"}\n')
    adapter = make_run(tmp_path / "run", *RUN, "eval.file=data/heldout.jsonl", "eval.num_prompts=5", "eval.split=dev")
    record = json.loads((tmp_path / "run/config.json").read_text())
    (tmp_path / "run/config.json").write_text(json.dumps({**record, "launch_dir": str(launched)}))
    monkeypatch.chdir(tmp_path)
    a = evaluate.parse_args(["--adapter", str(adapter)])
    cfg, prompts, lines = evaluate.load_settings(a, [str(adapter)])
    assert prompts == str(launched / "data/heldout.jsonl") and (a.num_prompts, cfg.eval.split) == (5, "dev")
    assert f'eval.file="{launched / "data/heldout.jsonl"}"' in lines[0] and "eval.num_prompts=5" in lines[0]
    a, cfg, lines = settings(["--adapter", str(adapter)], [adapter])  # --prompts p.jsonl
    assert (a.num_prompts, cfg.eval.split) == (0, "test")
    assert not any(f"{key}=" in lines[0] for key in ("eval.file", "eval.split", "eval.num_prompts")), lines[0]
    a = evaluate.parse_args(["--adapter", str(adapter), "eval.file=other.jsonl"])  # another file: none of the run's
    cfg, prompts, _ = evaluate.load_settings(a, [str(adapter)])
    assert prompts.endswith("other.jsonl") and (a.num_prompts, cfg.eval.split) == (0, "test")
    # a run of a Hub model: its eval.file still relative to where it was launched
    record = json.loads((tmp_path / "run/config.json").read_text())
    record["train"]["model"]["path"] = "zai-org/GLM-Image"
    record["model_source"] = {"path": "/cache/glm", "repo_id": "zai-org/GLM-Image"}
    (tmp_path / "run/config.json").write_text(json.dumps(record))
    a = evaluate.parse_args(["--adapter", str(adapter)])
    cfg, prompts, _ = evaluate.load_settings(a, [str(adapter)])
    assert (cfg.model.path, prompts) == ("zai-org/GLM-Image", str(launched / "data/heldout.jsonl"))


def test_flags_and_overrides_given_here_win_over_the_run(tmp_path):
    adapter = make_run(tmp_path / "run", *RUN)
    argv = ["rollout.height=128", "grpo.sampling={temperature: 1.0}", "--adapter", str(adapter), "--model", "/models/o"]
    a, cfg, err = settings([*argv, "--samples-per-prompt", "2", "--rewards", "pixel_mse"], [adapter])
    assert (cfg.model.path, cfg.rollout.height, cfg.rollout.width) == ("/models/o", 128, 96)
    assert [r.name for r in cfg.rewards] == ["pixel_mse"] and cfg.grpo.sampling.temperature == 1.0
    assert a.samples_per_prompt == 2
    for taken_here in ("model.path", "rollout.height", "rewards=", "grpo.sampling"):
        assert taken_here not in err[0], err
    assert "rollout.width=96" in err[0]
    # --config: the run is not read
    config = tmp_path / "c.yaml"
    config.write_text("model: {path: /models/c}\ndata: {train_file: t.jsonl}\nrewards: [{name: pixel_mse}]\n")
    _, cfg, err = settings(["--config", str(config), "--adapter", str(adapter)], [adapter])
    assert cfg.rollout.height == 1024 and err == []


def test_adapters_of_runs_that_differ_are_named_in_a_warning(tmp_path):
    first = make_run(tmp_path / "a", *RUN)
    second = make_run(tmp_path / "b", *RUN[:-1], "rollout.width=128", "rewards=[{name: pixel_mse}]")
    _, cfg, err = settings(["--adapter", str(first), "--adapter", str(second)], [first, second])
    assert cfg.rollout.width == 96 and len(err) == 2
    assert err[1] == (
        f"glm-grpo evaluate: warning: adapter_1's run ({tmp_path / 'b' / 'config.json'}) had rollout.width=128, "
        "rewards=[pixel_mse]; every model is evaluated with adapter_0's (give key=value to choose)"
    )


def test_no_rewards_anywhere_is_one_line_pointing_to_the_rewards_flag(tmp_path, capfd):
    bare = tmp_path / "adapter"  # saved outside a run: no config.json above it
    bare.mkdir()
    (bare / "adapter_config.json").write_text("{}")
    for extra in (["--adapter", str(bare)], []):
        assert evaluate.main(["--model", "m", "--prompts", "p.jsonl", *extra, "--out", str(tmp_path / "o")]) == 2
        err = capfd.readouterr().err
        assert err == (
            "glm-grpo evaluate: no rewards to score the images with: give --rewards NAME [NAME ...] "
            "(e.g. --rewards pixel_mse ssim) or --config with a rewards list\n"
        )
    assert not (tmp_path / "o").exists()


def test_a_missing_adapter_is_one_line_saying_it_does_not_exist(tmp_path, capfd):
    missing = tmp_path / "run" / "final_adapter"
    assert evaluate.main(["--model", "m", "--prompts", "p.jsonl", "--adapter", str(missing), "--rewards", "ssim"]) == 2
    assert capfd.readouterr().err == (
        f"glm-grpo evaluate: --adapter {missing} does not exist; give a run's final_adapter/ (or "
        "checkpoints/step_N/adapter/) directory\n"
    )


@pytest.mark.parametrize("given", ["--model", "model.path="])
def test_a_model_that_is_not_there_is_named_by_the_option_that_gave_it(given, tmp_path, capfd):
    (tmp_path / "p.txt").write_text("a red cube\n")
    model = str(tmp_path / "nope")
    chosen = ["--model", model] if given == "--model" else [f"model.path={model}"]
    assert evaluate.main(["--prompts", str(tmp_path / "p.txt"), "--rewards", "pixel_mse", *chosen]) == 2
    err = capfd.readouterr().err.splitlines()
    name = "--model" if given == "--model" else "model.path"
    assert err[-1].startswith(f"glm-grpo evaluate: {name} {model} is not a GLM-Image pipeline directory"), err


def test_the_start_line_says_what_is_coming():
    cfg = load_config(
        None, ["model.path=m", "data.train_file=t", "rewards=[{name: ssim}, {name: ocr}]", "rollout.height=512"]
    )
    from glm_grpo_ds.decoder import DecodeSettings

    line = evaluate.start_line(3, 8, 4, cfg, DecodeSettings(50, 1.5))
    assert line == (
        "evaluate: 3 models x 8 prompts x 4 samples = 96 images at 512x1024, decoded with 50 DiT steps "
        "(guidance 1.5), rewards ssim, ocr"
    )


def test_a_count_that_does_not_move_still_prints_every_interval():
    """A batch that takes minutes (1024x1024, 50 DiT steps) is not minutes of silence in a log: the line comes
    every ``every_s`` even when no prompt finished, with no ETA before the first."""
    from glm_grpo_ds.runtime.progress_count import Count

    log = io.StringIO()
    with Count(4, "x", "prompts", stream=log, every_s=0.2) as count:
        deadline = time.monotonic() + 30  # until the clock has printed twice (a loaded machine's thread is late)
        while len(log.getvalue().splitlines()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        count.update(4)
    lines = log.getvalue().splitlines()
    assert len(lines) >= 3 and all(re.match(r"x: 0/4 prompts, \d\d:\d\d, eta \?", line) for line in lines[:-1]), lines
    assert lines[-1].startswith("x: 4/4 prompts")
    time.sleep(0.3)
    assert log.getvalue().splitlines() == lines  # the clock stopped with the count


def test_each_gallery_tile_is_captioned_with_its_own_samples_reward():
    """The tile is the prompt's first sample; its caption is that sample's reward, not the mean of the K (a black
    first sample under a mean of 0.875 told the user the black image scored 0.875)."""
    from glm_grpo_ds.evaluation.paired import BASE, ModelResult
    from glm_grpo_ds.evaluation.report import shown_sample_rewards

    rewards = {"r": torch.tensor([[0.0, 1.0, 1.0, 1.0], [0.5, 0.25, 0.25, 0.25]], dtype=torch.float64)}
    results = {BASE: ModelResult(BASE, rewards), "adapter_0": ModelResult("adapter_0", {"r": rewards["r"].flip(1)})}
    assert shown_sample_rewards(results, [BASE, "adapter_0"], 2, "r") == [0.0, 1.0, 0.5, 0.25]
    with pytest.raises(IndexError):
        shown_sample_rewards(results, [BASE], 3, "r")


def test_overrides_after_the_rewards_flag_stay_overrides():
    # --rewards takes every word after it; a word with "=" is a config key, never a reward name
    a = evaluate.parse_args(["--rewards", "pixel_mse", "rollout.height=128", "ssim", "--prompts", "p.jsonl"])
    assert a.rewards == ["pixel_mse", "ssim"] and a.overrides == ["rollout.height=128"]


def test_trained_on_compares_each_reward_with_its_arguments_not_its_label(tmp_path):
    """A reward used twice is labelled ``ssim#2``, which no run names: it was reported out of domain; and a reward
    of the trained name with other arguments (another model) was reported trained on."""
    import torch

    from glm_grpo_ds.evaluation.paired import BASE, ModelResult
    from glm_grpo_ds.evaluation.report import summarise

    trained = "rewards=[{name: ssim}, {name: ssim, args: {win: 3}}, {name: pixel_mse}]"
    adapter = make_run(tmp_path / "run", "model.path=/models/tiny", trained)
    specs = [
        {"name": "ssim", "weight": 1.0, "args": {}},
        {"name": "ssim", "weight": 2.0, "args": {"win": 3}},
        {"name": "pixel_mse", "weight": 1.0, "args": {"scale": 2}},
    ]
    rewards = {label: torch.zeros(3, 2) for label in ("ssim", "ssim#2", "pixel_mse")}
    results = {name: ModelResult(name, rewards=dict(rewards)) for name in (BASE, "adapter_0")}
    out = summarise(results, {"adapter_0": str(adapter)}, None, specs)["adapter_0"]
    assert {label: s["trained_on"] for label, s in out["rewards"].items()} == {
        "ssim": True,
        "ssim#2": True,
        "pixel_mse": False,
    }
    assert out["trained_on"] == ["ssim", "ssim", "pixel_mse"]


def test_a_batch_a_reward_raised_on_is_not_stored_so_a_rerun_scores_it_again(tmp_path):
    """evaluate's progress store kept a batch whose remote reward was down (its rewards NaN) and a rerun, the server
    back, reused it without a word. The maker here stands in for the sampling (what is under test is the store):
    the real RewardSet scores, its reward raising on the first run only."""
    from types import SimpleNamespace

    from glm_grpo_ds.data.rows import PromptRow
    from glm_grpo_ds.evaluation.paired import BASE, evaluate_models
    from glm_grpo_ds.rewards.registry import RewardSet

    down = [True]

    def remote(images, prompts, samples):
        if down[0]:
            raise ConnectionError("server down")
        return images.mean(dim=(1, 2, 3))

    rewards = RewardSet([("remote", 1.0, remote)])

    class Maker:
        reward_fn = rewards

        def collect(self, rows, seeds, decode_seed, k, settings):
            images = torch.full((len(rows) * k, 3, 8, 8), 0.5)
            return SimpleNamespace(images=images, per_reward=rewards(images, [r.prompt for r in rows] * k, [{}] * k))

    rows = [PromptRow(index=0, prompt="a cat")]
    args = dict(rows=rows, samples_per_prompt=2, seed=0, decode_settings=None, store=tmp_path)
    first = evaluate_models(object(), [BASE], Maker(), **args)
    assert torch.isnan(first[BASE].rewards["remote"]).all() and not list(tmp_path.rglob("*.pt"))
    down[0] = False
    again = evaluate_models(object(), [BASE], Maker(), **args)
    assert again[BASE].rewards["remote"].tolist() == [[0.5, 0.5]] and len(list(tmp_path.rglob("*.pt"))) == 1


def test_the_adapters_run_record_is_found_past_a_models_config_and_a_cut_off_one_is_one_line(tmp_path):
    """evaluate reads the run's config.json beside the adapter (or up to three folders up): a model's config.json on
    the way is passed over; the run's cut off (a full disk) was a JSONDecodeError naming no file, and one holding a
    JSON list an AttributeError traceback."""
    from glm_grpo_ds.evaluation.report import run_config, trained_rewards

    run = tmp_path / "run"
    adapter = run / "checkpoints" / "step_000010" / "adapter"
    adapter.mkdir(parents=True)
    (adapter.parent / "config.json").write_text(json.dumps({"architectures": ["a model"]}))
    (run / "config.json").write_text(json.dumps({"train": {"rewards": [{"name": "pixel_mse"}]}}))
    assert run_config(str(adapter)) == (run, {"rewards": [{"name": "pixel_mse"}]})
    assert trained_rewards(str(adapter)) == [{"name": "pixel_mse"}]
    (run / "config.json").write_text('{"train": {"rewards": [')
    with pytest.raises(ValueError, match=rf"^{re.escape(str(run / 'config.json'))} cannot be read as a glm-grpo run"):
        run_config(str(adapter))
    (run / "config.json").write_text("[1, 2]")
    assert run_config(str(adapter)) is None  # not a run record: passed over like the model's
