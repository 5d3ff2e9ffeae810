"""The learnable tiny world: its decoder paints exact colour blocks through the real GlmImagePipeline,
its AR reads the colour word of the prompt, and GRPO under real DeepSpeed (2 CPU ranks, ZeRO-3, LoRA,
8-bit AdamW) learns to follow the prompt - while the same run with a learning rate of 1e-9 (the config
refuses 0) does not (the learning assertion is shown able to fail)."""

import json
import sys
from pathlib import Path

import pytest
import torch

from glm_grpo_ds.config import DecoderConfig
from glm_grpo_ds.decoder import ImageDecoder
from glm_grpo_ds.rollout import upsample_grid
from glm_grpo_ds.testing import world

sys.path.insert(0, str(Path(__file__).parent))
from launching import launch, run_train, train_args  # noqa: E402  (tests/integration/launching.py)
from run_files import jsonl  # noqa: E402  (tests/run_files.py)

WORLD_CONFIG = "launch/configs/tiny_world.yaml"


@pytest.fixture(scope="module")
def world_dir(tiny_world):
    return tiny_world  # built once per session (tests/integration/conftest.py), read-only


@pytest.mark.parametrize("steps,guidance", [(1, 1.0), (3, 1.5), (8, 4.0)])
def test_decoder_paints_each_token_its_colour(world_dir, steps, guidance):
    decoder = ImageDecoder(
        world_dir / "model", DecoderConfig(num_inference_steps=steps, guidance_scale=guidance), "cpu"
    )
    grids = torch.randint(0, 16, (4, 6), generator=torch.Generator().manual_seed(steps))  # 2x3 cells: 64x96
    images = decoder.decode(upsample_grid(grids, 2, 3), ["red image"] * 4, 64, 96, [0, 1, 2, 3])
    assert set(images.unique().tolist()) <= {0.0, 1.0}  # saturated, whatever the noise
    expected = torch.tensor([[world.COLOURS[world.token_colour(int(k))] for k in row] for row in grids]).view(
        4, 2, 3, 3
    )
    assert torch.equal(world.cell_colours(images), expected.float())
    assert (images.reshape(4, 3, 2, 32, 3, 32).std(dim=(3, 5)) == 0).all()  # every cell is one flat colour


def test_render_a_layout_prompt_with_every_world_word(world_dir, tmp_path):
    """Issue #27: "a red square on a blue background" (a colour_layout prompt of docs/rewards.md) raised
    IndexError: the vocabulary listed "a" twice, so the last words' ids were past the embedding."""
    from glm_grpo_ds.commands import render

    prompt = "a red square on a blue background"
    out = tmp_path / "png"
    assert (
        render.main(
            ["--model", str(world_dir / "model"), "--prompt", prompt, "--steps", "1", "--height", "64", "--width", "64"]
            + ["--out", str(out)]
        )
        == 0
    )
    assert len(list(out.glob("*.png"))) == 1


def test_write_world_best_and_prompts(world_dir):
    summary = json.loads((world_dir / "best.json").read_text())
    assert len(summary["palette"]) == 16 and summary["palette"][1] == [1.0, 0.0, 0.0]
    sets = {
        name: [json.loads(line)["prompt"] for line in (world_dir / f"{name}.jsonl").read_text().splitlines()]
        for name in ("train", "heldout", "layouts")
    }
    assert sets["train"][:2] == ["black image", "red image"] and len(sets["train"]) == 8
    assert sets["heldout"][:2] == ["black on the left, black on the right", "red on top, red at the bottom"]
    assert len(sets["layouts"]) == 24 and not set(sets["train"]) & set(sets["heldout"])
    assert all(summary["best"][p] == 1.0 for prompts in sets.values() for p in prompts)


def test_layer0_attends_to_the_colour_word(world_dir):
    """The world's AR reads its prompt: at a grid position, layer 0 puts > 90 % of every head's
    attention on the colour word (a random AR spreads it evenly over all earlier tokens)."""
    from transformers import AutoProcessor, GlmImageForConditionalGeneration

    tok = AutoProcessor.from_pretrained(world_dir / "model" / "processor").tokenizer
    ar = GlmImageForConditionalGeneration.from_pretrained(
        world_dir / "model" / "vision_language_encoder", attn_implementation="eager"
    )
    prompt = tok("[gMASK]<|user|>\nthe image is blue<|assistant|>\n")["input_ids"]
    ids = torch.tensor([prompt + torch.randint(0, 16, (40,), generator=torch.Generator().manual_seed(0)).tolist()])
    with torch.no_grad():
        attn = ar.model.language_model(input_ids=ids, output_attentions=True).attentions[0][0]  # [heads, q, k]
    colour = prompt.index(tok.convert_tokens_to_ids("blue"))
    assert attn[:, -40:, colour].min() > 0.9


def test_progress_fraction(tmp_path):
    from glm_grpo_ds.commands.progress import fraction_of_way, run_progress

    assert fraction_of_way(0.5, 0.8, 1.0) == pytest.approx(0.6)
    (tmp_path / "p.jsonl").write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    (tmp_path / "best.json").write_text(json.dumps({"best": {"a": 1.0, "b": 0.8}}))
    cfg = {
        "data": {"train_file": str(tmp_path / "p.jsonl")},
        "eval": {"file": str(tmp_path / "p.jsonl"), "num_prompts": 1},
    }
    (tmp_path / "config.json").write_text(json.dumps({"train": cfg}))
    # with a second reward (benchmarks/sweep_world.py's hack variants) the weighted reward and the world's own
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps({"reward_mean": r, "reward/world": r / 2}) + "\n" for r in (0.4, 0.5, 0.7, 0.8))
    )
    (tmp_path / "eval.jsonl").write_text(
        "".join(
            json.dumps({"step": s, "eval/reward_mean": r, "eval/reward/world": r and r / 2}) + "\n"
            for s, r in ((0, 0.2), (5, 0.5), (10, 0.6), (15, None))  # step 15: every reward undefined (a TypeError)
        )
    )
    res = run_progress(tmp_path, tmp_path / "best.json", window=2)
    assert res["eval"] == pytest.approx((0.2, 0.6, 1.0, 0.5, 0, 10))  # eval: first prompt only, best 1.0
    assert res["train"] == pytest.approx((0.45, 0.75, 0.9, 0.3 / 0.45))  # train: both prompts, best 0.9
    res = run_progress(tmp_path, tmp_path / "best.json", window=2, key="reward/world")
    assert res["eval"] == pytest.approx((0.1, 0.3, 1.0, 0.2 / 0.9, 0, 10))
    assert res["train"] == pytest.approx((0.225, 0.375, 0.9, 0.15 / 0.675))
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["a model's config"]}))
    with pytest.raises(ValueError, match=r"config.json is not a glm-grpo run's \(no train section\)"):
        run_progress(tmp_path, tmp_path / "best.json", window=2)  # was a KeyError traceback
    (tmp_path / "config.json").unlink()
    with pytest.raises(ValueError, match="holds no config.json: give a training run's output_dir"):
        run_progress(tmp_path, tmp_path / "best.json", window=2)  # was a FileNotFoundError's own words


def _eval_fraction(run_dir, best=1.0):
    rows = jsonl(run_dir / "eval.jsonl")
    start, end = rows[0]["eval/reward_mean"], rows[-1]["eval/reward_mean"]
    return start, end, (end - start) / (best - start)


LEARN_COLOURS = ("red", "green", "blue", "yellow")  # no single token grid scores above 0.58 on all four


def _train(world_dir, run_dir, *extra):
    train, held = run_dir.parent / f"{run_dir.name}_train.jsonl", run_dir.parent / f"{run_dir.name}_held.jsonl"
    train.write_text("".join(json.dumps({"prompt": f"{c} image"}) + "\n" for c in LEARN_COLOURS))
    held.write_text("".join(json.dumps({"prompt": f"{c} on top, {c} at the bottom"}) + "\n" for c in LEARN_COLOURS))
    proc = launch(
        2,
        [
            *train_args(config=WORLD_CONFIG, ds_config="zero3.json"),
            f"model.path={world_dir / 'model'}",
            f"data.train_file={train}",
            f"eval.file={held}",
            "eval.num_prompts=4",
            "eval.group_size=8",
            "eval.steps=0",
            "eval.gallery=false",
            "max_steps=20",
            "logging.gallery_steps=0",
            f"output_dir={run_dir}",
            "logging.progress_bar=false",
            "logging.plot=false",
            *extra,
        ],
        timeout=600,
        # the ranks the launcher starts, without it (launching.spawn_ranks): what is proved here is learning; the
        # launcher's own paths are test_robustness.py's, test_multinode.py's and test_launch_env.py's
        launcher=False,
    )
    run_dir.with_name(f"{run_dir.name}.stdout").write_text(proc.stdout)  # the console, beside the run
    return _eval_fraction(run_dir)


@pytest.fixture(scope="module")
def learned(world_dir, tmp_path_factory):
    """The learning run and its lr=1e-9 control: ``{name: (run_dir, (start, end, fraction))}``. The control trains 4
    steps, not 20: at lr=1e-9 its weights do not move whatever the steps, and what the control shows - the same
    start, the same evaluation, the same assertion failing without learning - needs a run through every phase, not
    its length (16 steps of ~3 s on 2 ranks saved)."""
    tmp = tmp_path_factory.mktemp("learned")
    return {
        "learn": (tmp / "learn", _train(world_dir, tmp / "learn")),
        "control": (tmp / "control", _train(world_dir, tmp / "control", "optimizer.lr=1e-9", "max_steps=4")),
    }


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.learning
def test_grpo_learns_to_follow_the_prompt_and_a_frozen_control_does_not(learned):
    """Four one-colour prompts (a fixed grid gets at most 17 % of the way), evaluated on rephrasings
    never trained on: the policy must read the colour word to get half way."""
    start, end, fraction = learned["learn"][1]
    print(f"learning run: held-out eval reward {start:.3f} -> {end:.3f}, {fraction:.0%} of the way to the best")
    c_start, c_end, c_fraction = learned["control"][1]
    print(f"control (lr=1e-9): eval reward {c_start:.3f} -> {c_end:.3f}, {c_fraction:.0%}")
    assert c_start == start  # same initial policy, same fixed eval seeds
    assert fraction >= 0.5
    assert not c_fraction >= 0.5  # the same assertion fails without learning


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.learning
def test_evaluate_finds_the_trained_adapter_better_and_the_control_not(world_dir, learned, tmp_path):
    """`glm-grpo evaluate` on the held-out rephrasings, paired seeds: the trained adapter's gain over the base
    has a 95 % interval above 0, on the reward it trained on; the control's interval holds 0."""
    from glm_grpo_ds.commands.evaluate import main

    held = learned["learn"][0].parent / "learn_held.jsonl"
    args = ["--config", WORLD_CONFIG, f"model.path={world_dir / 'model'}", "--prompts", str(held)]
    args += ["--adapter", str(learned["learn"][0] / "final_adapter")]
    args += ["--adapter", str(learned["control"][0] / "final_adapter")]
    args += ["--samples-per-prompt", "8", "--out", str(tmp_path), f"data.train_file={held}"]
    assert main(args) == 0
    summary = json.loads((tmp_path / "evaluate.json").read_text())["summary"]
    trained, control = (
        summary["adapter_0"]["rewards"]["colour_layout"],
        summary["adapter_1"]["rewards"]["colour_layout"],
    )
    print(f"evaluate: trained {trained['diff']:+.3f} {trained['ci']}, control {control['diff']:+.3f} {control['ci']}")
    assert trained["diff"] > 0 and trained["ci_excludes_0"] and trained["trained_on"] is True
    assert control["ci"][0] <= 0 <= control["ci"][1] and not control["ci_excludes_0"]
    # the report a person opens: both adapters' tables, each run's alarms (none fired), every prompt's images
    report = (tmp_path / "report.html").read_text()
    for name in ("adapter_0", "adapter_1"):
        assert f"{name}: rewards" in report and f"{name}: image statistics" in report
    assert report.count("No alarm fired during training.") == 2
    assert str(learned["learn"][0] / "eval.jsonl") in report and str(learned["control"][0] / "eval.jsonl") in report
    assert report.count('<img src="data:image/png;base64,') == 4 * 3 + 1  # 4 prompts x 3 models, and the plot


@pytest.mark.slow
@pytest.mark.learning
def test_the_learning_run_fires_no_alarm_at_the_defaults(learned):
    """The image statistics are in every evaluation's record and the default alarms (monitor.alarms) stay quiet
    on an ordinary learning run: no alarm line, every alarm/<statistic> 0."""
    run_dir = learned["learn"][0]
    rows = jsonl(run_dir / "eval.jsonl")
    for row in rows:
        assert 0 <= row["eval/images/dark_fraction"] <= 1 and row["eval/images/diversity"] >= 0
        assert [k for k, v in row.items() if k.startswith("alarm/") and v] == []
    first, last = rows[0], rows[-1]
    print(
        f"learning run: diversity {first['eval/images/diversity']:.3f} -> {last['eval/images/diversity']:.3f}, "
        f"dark fraction {first['eval/images/dark_fraction']:.3f} -> {last['eval/images/dark_fraction']:.3f}"
    )
    assert "alarm" not in (run_dir / "logs" / "rank_0.log").read_text()
    # each evaluation is a console line; the closing lines name eval.jsonl with the first and last eval reward
    log = run_dir.with_name(f"{run_dir.name}.stdout").read_text()
    assert "alarm" not in log
    for row in rows:
        assert f"eval at step {row['step']}: reward {row['eval/reward_mean']:.4f}, 4 prompts x 8 samples, " in log
    assert (
        f"evaluations {run_dir / 'eval.jsonl'}: {len(rows)} evaluation(s), reward {first['eval/reward_mean']:.4f} at "
        f"step 0 -> {last['eval/reward_mean']:.4f} at step {last['step']}"
    ) in log
    assert f"samples {run_dir / 'samples'}/ (eval_step_*.png" in log


@pytest.mark.slow
def test_a_reward_paying_for_dark_images_fires_the_alarm_and_stops_the_run(world_dir, tmp_path):
    """A hacked reward (testing.tiny_data.darkness: 1 - mean pixel) drives the world's images dark; the default
    dark-fraction alarm fires at an evaluation with its line and metric, and monitor.stop_on_alarm stops the run
    there with a checkpoint (exit 5)."""
    out = tmp_path / "run"
    proc = run_train(
        f"model.path={world_dir / 'model'}",
        f"data.train_file={world_dir / 'train.jsonl'}",
        f"eval.file={world_dir / 'heldout.jsonl'}",
        "rewards=[{name: 'python:glm_grpo_ds.testing.tiny_data:darkness'}]",
        "eval.steps=5",
        "max_steps=40",
        "monitor.stop_on_alarm=true",
        "logging.gallery_steps=0",
        "logging.plot=false",
        "logging.progress_bar=false",
        f"output_dir={out}",
        config=WORLD_CONFIG,
    )
    assert proc.returncode == 5, proc.stderr[-3000:]
    rows = jsonl(out / "eval.jsonl")
    fired = [row for row in rows if row.get("alarm/dark_fraction")]
    assert len(fired) == 1 and fired[0] is rows[-1]  # it stopped at the first evaluation that fired
    step, start, now = rows[-1]["step"], rows[0]["eval/images/dark_fraction"], rows[-1]["eval/images/dark_fraction"]
    assert now > start + 0.25 and step < 40
    line = f"glm-grpo: alarm at step {step}: dark_fraction is {now:.4g}, was {start:.4g} at step 0"
    assert line in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(f"glm-grpo train: stopped at step {step} on an alarm")
    assert (out / "checkpoints" / "latest").read_text().strip().endswith(f"{step}")
    assert jsonl(out / "metrics.jsonl")[-1]["alarm/dark_fraction"] == 1  # the step's record, as its evaluation's
    # what `glm-grpo evaluate`'s report reads of the run that wrote an adapter: this alarm, its step, still holding
    from glm_grpo_ds.evaluation.report import run_alarms

    adapter = out / "checkpoints" / (out / "checkpoints" / "latest").read_text().strip() / "adapter"
    alarms = run_alarms(str(adapter))
    assert alarms["file"] == str(out / "eval.jsonl") and "dark_fraction > start + 0.25" in alarms["rules"]
    (fired,) = alarms["fired"]
    rule = "dark_fraction > start + 0.25"
    assert (fired["rule"], fired["first_step"], fired["value"], fired["holding_at_end"]) == (rule, step, now, True)
    assert fired["bound"] == pytest.approx(start + 0.25) and fired["steps"] == [step]
