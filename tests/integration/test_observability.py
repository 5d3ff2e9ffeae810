"""Run outputs of the real trainer on the tiny pipeline: sample galleries, fixed-seed evaluation,
training-curve plots, non-terminal progress lines, TensorBoard / W&B through accelerate's trackers (when
installed; read back from their files), logged by rank 0 only.

Single-process runs (`python -m glm_grpo_ds.train`, ZeRO-3, world size 1) plus one 2-rank
`deepspeed` run for the gathering of galleries and eval results across ranks; and one step whose alarm must fire,
followed everywhere it is shown (closing lines, exit status, metrics.jsonl, check-run, the card, evaluate's
console). ~3 min on 2 idle cores.
"""

import importlib.util
import json
import math
import subprocess
from pathlib import Path

import pytest
from launching import CONFIG, ENV, FAST, common, launch, run_cmd, run_train, train_args, train_cmd  # noqa: E402  (tests/integration/launching.py)
from PIL import Image
from run_files import jsonl  # noqa: E402  (tests/run_files.py)

from glm_grpo_ds.observability.gallery import PROMPT_LINES, grid_size

THUMB = 48  # < the 64x64 images: galleries downscale
EVAL = ["eval.num_prompts=3", "eval.group_size=2", "eval.seed=99"]
SMALL = ["rollout.height=64", "rollout.width=64", "grpo.group_size=8", f"logging.gallery_thumbnail={THUMB}"]

# the tracker checks need pip install 'glm-grpo-ds[tracking]'
TRACKING = all(importlib.util.find_spec(m) for m in ("tensorboard", "wandb"))

pytestmark = [pytest.mark.slow, pytest.mark.distributed]  # training runs, one on 2 ranks


def run_single(tiny_model_dir, data, out_dir, *extra, timeout=300) -> subprocess.CompletedProcess:
    # One thread, like each of the 2 deepspeed ranks: numerics comparable across the runs, and no
    # spinning OpenMP threads when the test machine's cores are busy.
    env = dict(ENV, OMP_NUM_THREADS="1")
    cmd = [
        *train_cmd(ds_config="zero3.json"),
        *common(tiny_model_dir, data, out_dir, f"eval.file={data}", *SMALL, *EVAL, *extra),
    ]
    proc = run_cmd(cmd, env, timeout)
    if proc.returncode != 0:
        pytest.fail("training failed:\n" + "\n".join((proc.stdout + proc.stderr).splitlines()[-40:]))
    return proc


def png_size(path: Path) -> tuple[int, int]:
    with Image.open(path) as img:
        return img.size


@pytest.fixture(scope="module")
def run1(tiny_model_dir, data64, tmp_path_factory):
    """2 steps, gallery every step, eval at 0, every step (1) and at the end (2), on the adapter's moving average
    (lora.ema_decay: written into the adapters for each evaluation, their own weights put back)."""
    out = tmp_path_factory.mktemp("obs") / "run1"
    proc = run_single(
        tiny_model_dir,
        data64,
        out,
        "max_steps=2",
        "seed=0",
        "logging.gallery_steps=1",
        "logging.gallery_max_prompts=2",
        "eval.steps=1",
        "save_steps=1",
        "save_total_limit=1",
        "save_best=true",
        "lora.ema_decay=0.5",
    )
    return out, proc


def test_save_best_names_the_checkpoint_of_the_highest_eval_reward(run1):
    """save_best with a checkpoint and an evaluation every step: checkpoints/best names the step whose eval reward is
    the highest (step 0's evaluation has no checkpoint), that checkpoint is kept beside the latest under
    save_total_limit=1, and the closing lines say which."""
    out, proc = run1
    evals = {r["step"]: r["eval/reward_mean"] for r in jsonl(out / "eval.jsonl") if r["step"] > 0}
    step = max(evals, key=lambda s: (evals[s], -s))  # the first of equal rewards: a tie does not move it
    root = out / "checkpoints"
    assert (root / "best").read_text() == f"step_{step:06d}" and (root / f"step_{step:06d}").is_dir()
    assert sorted(p.name for p in root.glob("step_*")) == sorted({f"step_{step:06d}", "step_000002"})
    assert (
        f"best checkpoint: step {step}, eval reward {evals[step]:.4f} (checkpoints/best)" in proc.stdout + proc.stderr
    )


def is_grid(size, rows: int, cols: int) -> bool:
    """A gallery of rows x cols THUMB tiles (its prompts wrapped to however many lines they need)."""
    return any(size == grid_size(rows, cols, THUMB, THUMB, lines) for lines in range(1, PROMPT_LINES + 1))


def test_galleries_eval_records_plot_and_progress_lines(run1):
    out, proc = run1
    # training galleries: 1 prompt per step (1 rank x prompts_per_rank 1) x G=8 tiles of 48x48
    for step in (1, 2):
        assert is_grid(png_size(out / "samples" / f"step_{step:06d}.png"), 1, 8)
    # eval galleries: 3 eval prompts capped at gallery_max_prompts=2 rows x eval.group_size=2
    for step in (0, 1, 2):
        assert is_grid(png_size(out / "samples" / f"eval_step_{step:06d}.png"), 2, 2)
    assert sorted(p.name for p in (out / "samples").iterdir()) == [
        "eval_step_000000.png",
        "eval_step_000001.png",
        "eval_step_000002.png",
        "step_000001.png",
        "step_000002.png",
    ]

    rows = jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:  # fp32: the sampler's log-probs are the trainer's; the policy has entropy left
        assert r["mismatch/logp_abs_max"] <= 1e-5 and r["mismatch/frac_beyond"] == 0
        assert 0 <= r["mismatch/kl_k3"] <= 1e-9 and r["mismatch/logp_abs_mean"] <= r["mismatch/logp_abs_max"]
        assert 0 < r["entropy"] <= math.log(16)  # the tiny codebook has 16 ids
    assert all(r["gallery"] == f"samples/step_{r['step']:06d}.png" and r["time/gallery"] >= 0 for r in rows)
    evals = jsonl(out / "eval.jsonl")
    assert [e["step"] for e in evals] == [0, 1, 2]
    for e in evals:
        assert (
            e["eval/num_prompts"] == 3
            and e["eval/reward_mean"] < 0
            and e["eval/reward/pixel_mse"] == e["eval/reward_mean"]
            and e["eval/reward/pixel_mse_undefined"] == 0
        )
        assert e["gallery"] == f"samples/eval_step_{e['step']:06d}.png"
        # eval.* left null: the eval decode is the pipeline's own, not the config's cheap training decode
        assert (e["eval/decode_steps"], e["eval/decode_guidance"]) == (50, 1.5)
    log_text = (out / "logs" / "rank_0.log").read_text()
    assert "training rewards decode with 2 DiT steps, guidance 1.5 (decoder.*), evaluation with 50" in log_text

    # stderr is a pipe, not a terminal: compact lines, no tqdm redraws
    lines = [line for line in proc.stderr.splitlines() if line.startswith("grpo step")]
    assert [line.split()[2] for line in lines] == ["1/2", "2/2"] and all("eta" in line for line in lines)
    assert "\r" not in proc.stderr

    curve = out / "reward_curve.png"
    assert curve.stat().st_size > 1000
    curve.unlink()
    from glm_grpo_ds.commands.cli import main

    assert main(["plot", str(out)]) == 0 and png_size(curve)[0] > 300


def test_step0_eval_is_the_same_for_another_training_seed(run1, tiny_model_dir, data64, tmp_path):
    """Eval seeds do not depend on `seed` (and LoRA starts as the identity), so the initial policy's
    eval is bitwise identical; the training rollouts do change with the seed."""
    out1, _ = run1
    out = tmp_path / "run3"
    run_single(tiny_model_dir, data64, out, "max_steps=1", "seed=5", "eval.gallery=false", "logging.plot=false")
    first, other = jsonl(out1 / "eval.jsonl")[0], jsonl(out / "eval.jsonl")[0]
    assert other["step"] == first["step"] == 0
    for key in ("eval/reward_mean", "eval/reward_std", "eval/reward/pixel_mse"):
        assert other[key] == first[key], key
    assert jsonl(out / "metrics.jsonl")[0]["reward_mean"] != jsonl(out1 / "metrics.jsonl")[0]["reward_mean"]
    assert not (out / "samples").exists()


def test_two_ranks_gather_galleries_and_give_the_same_eval(run1, tiny_model_dir, data64, tmp_path):
    """2 ranks: training gallery rows come from both ranks; 3 eval prompts split 2 + 1 (+1 padding,
    dropped); the step-0 eval matches the single-process run (another seed, too); the trackers log
    once, from rank 0."""
    out1, _ = run1
    out = tmp_path / "run2"
    launch(
        2,
        [
            *train_args(ds_config="zero3.json"),
            *common(
                tiny_model_dir,
                data64,
                out,
                f"eval.file={data64}",
                *SMALL,
                *EVAL,
                "max_steps=1",
                "seed=7",
                "logging.gallery_steps=1",
                "logging.gallery_max_prompts=4",
                "logging.sample_records=1",
                "logging.plot=false",
                *(["logging.report_to=[tensorboard, wandb]"] if TRACKING else []),
            ),
        ],
        timeout=300,
        launcher=False,
    )
    if TRACKING:  # rank 0 alone logs: one TensorBoard event file, one W&B run, each step once
        from glm_grpo_ds.testing import wandb_offline

        assert len(list((out / "tensorboard" / "run2").glob("events.out.tfevents.*"))) == 1
        acc = read_tensorboard(out / "tensorboard" / "run2")
        assert [e.step for e in acc.Scalars("reward_mean")] == [1] and [e.step for e in acc.Images("samples")] == [1]
        (run_dir,) = (out / "wandb").glob("offline-run-*")
        assert [row["_step"] for row in wandb_offline.history(run_dir)] == [0, 1]
    assert is_grid(png_size(out / "samples" / "step_000001.png"), 2, 8)  # 2 ranks x 1 prompt
    assert is_grid(png_size(out / "samples" / "eval_step_000000.png"), 3, 2)  # padding dropped
    first, two = jsonl(out1 / "eval.jsonl")[0], jsonl(out / "eval.jsonl")[0]
    for key in ("eval/reward_mean", "eval/reward/pixel_mse"):
        # CPU GEMMs on 1 vs 2 threads may round differently; a different sample would move it by ~1e-3
        assert two[key] == pytest.approx(first[key], rel=1e-5), key
    # samples.jsonl gathers both ranks' groups in rank order, each line beside its own reward and advantage
    lines, (record,) = jsonl(out / "samples.jsonl"), jsonl(out / "metrics.jsonl")
    assert [(s["sample"], s["group_member"]) for s in lines] == [(i, i % 8) for i in range(16)]
    groups = [{(s["prompt_index"], s["prompt"]) for s in lines[g * 8 : (g + 1) * 8]} for g in (0, 1)]
    assert all(len(g) == 1 for g in groups) and groups[0] != groups[1]  # one prompt per rank's group
    prompts = {json.loads(line)["prompt"] for line in Path(data64).read_text().splitlines()}
    assert {next(iter(g))[1] for g in groups} <= prompts
    assert sum(s["reward"] for s in lines) / 16 == pytest.approx(record["reward_mean"], rel=1e-5)
    pixel = [s["rewards"]["pixel_mse"] for s in lines]
    assert sum(pixel) / 16 == pytest.approx(record["reward/pixel_mse"], rel=1e-5)
    for g in (0, 1):  # the advantages of a group, as the update took them: centred within it
        assert sum(s["advantage"] for s in lines[g * 8 : (g + 1) * 8]) == pytest.approx(0.0, abs=1e-3)


def test_unknown_report_to_is_a_config_error(capsys):
    from glm_grpo_ds.train import main

    assert (
        main(["--deepspeed", "ds_configs/zero3.json", "--config", str(CONFIG), "logging.report_to=[tensorbord, wandb]"])
        == 2
    )
    err = capsys.readouterr().err
    assert "logging.report_to[0]: unknown tracker 'tensorbord'; did you mean 'tensorboard'?" in err


def read_tensorboard(run_dir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    return acc


def test_tensorboard_and_wandb_get_every_record_and_the_galleries(tiny_model_dir, data64, tmp_path, monkeypatch):
    """One run with both trackers (accelerate's classes): each metrics.jsonl / eval.jsonl value at
    its step, the training and eval galleries as images, the config as hyper-parameters."""
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (pip install 'glm-grpo-ds[tracking]')")
    pytest.importorskip("wandb", reason="wandb is not installed (pip install 'glm-grpo-ds[tracking]')")
    from glm_grpo_ds.testing import wandb_offline

    out = tmp_path / "tracked"
    # no network, no credentials: offline mode must not try to log in
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    run_single(
        tiny_model_dir,
        data64,
        out,
        "max_steps=1",
        "logging.report_to=[tensorboard, wandb]",
        "logging.project=glm-grpo-test",
        "logging.gallery_steps=1",
    )
    train, evals = jsonl(out / "metrics.jsonl"), jsonl(out / "eval.jsonl")
    assert [e["step"] for e in evals] == [0, 1]

    acc = read_tensorboard(out / "tensorboard" / "tracked")  # run name = the output_dir's name
    tags = acc.Tags()
    # the #30 metrics too: entropy, the zero-std groups, the sampler-vs-trainer mismatch
    metrics_30 = {"entropy", "frac_reward_zero_std", "mismatch/logp_abs_mean", "mismatch/logp_abs_max"}
    metrics_30 |= {"mismatch/kl_k3", "mismatch/frac_beyond"}
    assert {"reward_mean", "loss", "reward/pixel_mse", "eval/reward_mean"} | metrics_30 <= set(tags["scalars"])
    assert "kl" not in tags["scalars"]  # beta 0: no reference, so no KL (a 0 nobody measured before)
    for key in metrics_30:
        assert [e.value for e in acc.Scalars(key)] == [pytest.approx(train[0][key], rel=1e-6, abs=1e-12)], (
            key
        )  # float32 in TensorBoard
    assert [(e.step, e.value) for e in acc.Scalars("reward_mean")] == [(1, pytest.approx(train[0]["reward_mean"]))]
    assert [(e.step, e.value) for e in acc.Scalars("eval/reward_mean")] == [
        (e["step"], pytest.approx(e["eval/reward_mean"])) for e in evals
    ]
    assert sorted(tags["images"]) == ["eval/samples", "samples"]
    assert [e.step for e in acc.Images("eval/samples")] == [0, 1]
    (tb_image,) = acc.Images("samples")
    assert (tb_image.step, tb_image.width, tb_image.height) == (1, *png_size(out / "samples" / "step_000001.png"))

    (run_dir,) = (out / "wandb").glob("offline-run-*")
    assert wandb_offline.run_info(run_dir)["project"] == "glm-grpo-test"
    assert wandb_offline.config(run_dir)["max_steps"] == 1
    rows = {row["_step"]: row for row in wandb_offline.history(run_dir)}
    assert sorted(rows) == [0, 1]
    assert rows[1]["reward_mean"] == pytest.approx(train[0]["reward_mean"])
    assert rows[1]["loss"] == pytest.approx(train[0]["loss"])
    for key in metrics_30:
        assert rows[1][key] == pytest.approx(train[0][key], rel=1e-6, abs=1e-12), key
    for e in evals:
        assert rows[e["step"]]["eval/reward_mean"] == pytest.approx(e["eval/reward_mean"])
        assert rows[e["step"]]["eval/samples"]["_type"] == "images/separated"
    assert (rows[1]["samples"]["width"], rows[1]["samples"]["height"]) == png_size(out / "samples" / "step_000001.png")


def test_eval_and_galleries_do_not_change_training(run1, tiny_model_dir, data64, tmp_path):
    """Eval and galleries draw from their own seeds only, and the evaluations' moving average leaves the adapters'
    own weights as they were (the last evaluation runs before final_adapter/ is saved): with them off, the same run
    trains bitwise identically (same rewards, losses and adapter)."""
    from safetensors.torch import load_file

    out1, _ = run1
    out = tmp_path / "plain"
    run_single(tiny_model_dir, data64, out, "max_steps=2", "seed=0", "eval.file=''", "logging.plot=false")
    assert not (out / "eval.jsonl").exists() and not (out / "samples").exists()
    plain, observed = jsonl(out / "metrics.jsonl"), jsonl(out1 / "metrics.jsonl")
    for a, b in zip(plain, observed):
        assert (a["reward_mean"], a["loss"]) == (b["reward_mean"], b["loss"])
    w1, w2 = (
        load_file(out1 / "final_adapter" / "adapter_model.safetensors"),
        load_file(out / "final_adapter" / "adapter_model.safetensors"),
    )
    assert w1.keys() == w2.keys() and all((w1[k] == w2[k]).all() for k in w1)


def test_an_alarm_stays_visible_and_fail_on_alarm_exits_6_after_saving_everything(
    tiny_model_dir, data64, tmp_path, capsys
):
    """One step with an alarm rule that holds for every image ('brightness > -1', checked at the evaluations of
    steps 0 and 1) beside one that cannot fire, and monitor.fail_on_alarm: the run saves its adapter, card and
    logs, lists the alarm in its closing lines and exits 6 with one line saying why; metrics.jsonl holds the
    alarm fields of the evaluation at its step; check-run prints it as a WARN (and its CPU memory lines as one
    INFO), the card lists it, and `glm-grpo evaluate` of the adapter prints it under its table."""
    out = tmp_path / "alarmed"
    decode = ["eval.num_inference_steps=1", "eval.guidance_scale=1.0", "decoder.num_inference_steps=1"]
    evals = [f"eval.file={data64}", "eval.num_prompts=2", "eval.group_size=2", *decode]
    alarms = ["monitor.alarms=[brightness > -1, dark_fraction > 2]", "monitor.fail_on_alarm=true"]
    env = dict(ENV, OMP_NUM_THREADS="1")  # as run_single: no spinning OpenMP threads on busy cores (30 s -> 4 s)
    proc = run_train(*common(tiny_model_dir, data64, out, "max_steps=1", *FAST, *evals, *alarms), env=env)
    assert proc.returncode == 6, proc.stderr[-3000:]
    assert (out / "final_adapter" / "adapter_model.safetensors").is_file() and (out / "logs" / "rank_0.log").is_file()
    first, last = jsonl(out / "eval.jsonl")
    brightness = first["eval/images/brightness"]
    line = (
        f"'brightness > -1' fired at step 0: brightness {brightness:.4g} vs bound -1 (start {brightness:.4g} at step "
        "0); held at steps 0, 1, still holding at the end"
    )
    stderr = proc.stderr.strip().splitlines()
    assert stderr[-1] == (
        f"glm-grpo train: training finished and everything is saved in {out}, but 1 alarm(s) fired (brightness > -1; "
        "listed above) and monitor.fail_on_alarm is true: exit 6"
    )
    assert stderr[-3:-1] == [
        "      alarms that fired (1; eval.jsonl): look at the samples (samples/) before trusting the reward or the "
        "adapter",
        f"        {line}",
    ]
    # the step's record carries what the evaluation at that step checked
    (row,) = jsonl(out / "metrics.jsonl")
    assert row["alarm/brightness"] == last["alarm/brightness"] == 1 and row["alarm/dark_fraction"] == 0
    assert f"- {line}" in (out / "final_adapter" / "README.md").read_text()

    from glm_grpo_ds.commands.check_run import main as check_run_main
    from glm_grpo_ds.commands.evaluate import main as evaluate_main

    capsys.readouterr()
    assert check_run_main([str(out)]) == 0  # a WARN is for a person to look, not a failure
    verdicts = capsys.readouterr().out.splitlines()
    assert [v for v in verdicts if v.startswith("WARN")] == [
        f"WARN  image-statistics alarm: {line}; look at {out / 'samples'}/"
    ]
    assert len([v for v in verdicts if v.startswith("INFO  not judged on a CPU: ")]) == 1

    args = ["--model", str(tiny_model_dir), "--prompts", str(data64), "--rewards", "pixel_mse", "--num-prompts", "1"]
    args += ["--samples-per-prompt", "1", "--adapter", str(out / "final_adapter"), "--out", str(tmp_path / "ev")]
    assert evaluate_main([*args, "rollout.height=64", "rollout.width=64", *decode]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert f"alarms: {line} ({out / 'eval.jsonl'})" in printed
