"""Checkpoints under real DeepSpeed: exact resume (the adaptive entropy coefficient's, the reset reference's and the
adapter average's state too), a resume with
another lr that runs with it, atomic writes, refused global-batch and optimizer changes, and `glm-grpo merge` from
checkpoint directories (LoRA and full fine-tuning)."""

import json
import shutil
import sys

import pytest
import torch
from in_process import glm_grpo, train_main  # noqa: E402  (tests/in_process.py)
from launching import CONFIG, FAST, ROOT, common, launch, run_cmd, run_train, train_args, train_cmd  # noqa: E402  (tests/integration/launching.py)
from run_files import assert_no_frozen_parameters, metrics, tree_hash  # noqa: E402  (tests/run_files.py)
from safetensors.torch import load_file

VOLATILE = ("time/", "_per_s", "peak_", "memory/")  # wall-clock and memory differ between runs

pytestmark = [pytest.mark.slow, pytest.mark.distributed]  # training runs, one through the deepspeed launcher


def _stable(record):
    return {k: v for k, v in record.items() if not any(tag in k for tag in VOLATILE)}


def train(nprocs, args, timeout=600):
    launch(
        nprocs,
        train_args(*args, ds_config="zero3.json"),
        timeout,
        launcher=False,  # the ranks the launcher starts, without it (launching.spawn_ranks)
    )


@pytest.fixture(scope="module")
def runs(tiny_model_dir, data64, tmp_path_factory):
    root, data = tmp_path_factory.mktemp("resume"), data64
    extra = ["rollout.height=64", "rollout.width=64", "optimizer.name=adamw_8bit", "logging.progress_bar=false"]
    # the adaptive entropy coefficient, a state of the run's own (a target no entropy reaches: it grows every step)
    extra += ["grpo.entropy_target=100", "grpo.entropy_coef=0.01"]
    # the KL's reference reset after steps 2 and 4, and the adapter's moving average: the checkpoint keeps both
    extra += ["grpo.beta=0.04", "grpo.ref_sync_steps=2", "lora.ema_decay=0.9"]
    straight, resumed = root / "straight", root / "resumed"
    train(2, common(tiny_model_dir, data, straight, "max_steps=4", *extra))
    train(2, common(tiny_model_dir, data, resumed, "max_steps=2", "save_steps=2", *extra))
    # a later checkpoint that died mid-write must be ignored and cleaned up
    stale = resumed / "checkpoints" / "step_000003.tmp"
    (stale / "ds").mkdir(parents=True)
    (stale / "ds" / "junk.pt").write_bytes(b"partial")
    train(2, common(tiny_model_dir, data, resumed, "max_steps=4", "save_steps=2", "resume_from=latest", *extra))
    return {"straight": straight, "resumed": resumed, "data": data, "extra": extra}


def test_resume_is_exact(runs):
    for final in ("final_adapter", "final_adapter_ema"):
        a = load_file(runs["straight"] / final / "adapter_model.safetensors")
        b = load_file(runs["resumed"] / final / "adapter_model.safetensors")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), final  # bitwise
        assert json.loads((runs["resumed"] / final / "training_state.json").read_text()) == {"step": 4}  # its end
    ma, mb = metrics(runs["straight"]), metrics(runs["resumed"])
    assert [r["step"] for r in ma] == [r["step"] for r in mb] == [1, 2, 3, 4]  # a record per step, none twice
    for x, y in zip(ma, mb, strict=True):
        assert _stable(x) == _stable(y), x["step"]
    # no bonus before an entropy is measured, then 0.01 + 0.005 a step: the resumed run took step 2's from its
    # checkpoint (restarted, its step 3 would have had none)
    assert [r["entropy_coef"] for r in mb] == pytest.approx([0.0, 0.015, 0.02, 0.025], abs=1e-12)
    assert [r["entropy_control/coef"] for r in mb] == pytest.approx([0.015, 0.02, 0.025, 0.03], abs=1e-12)


def test_a_reference_reset_makes_the_next_steps_kl_zero_and_a_resume_keeps_it(runs):
    """grpo.ref_sync_steps=2: step 3's policy (before its update) is the one the reference was reset to after step 2,
    so its KL is 0, where steps 2 and 4 measure one update and more away from their references. The resumed run
    took that reference from step 2's checkpoint (test_resume_is_exact: equal to the straight run's record)."""
    kl = {r["step"]: r["kl"] for r in metrics(runs["resumed"])}
    assert kl[3] == pytest.approx(0.0, abs=1e-9)
    assert kl[2] > 1e-7 and kl[4] > 1e-7, kl
    assert (runs["resumed"] / "checkpoints" / "step_000002" / "reference-00000.safetensors").is_file()


def test_a_resume_with_other_settings_says_so_and_keeps_the_history(runs):
    """The resumed launch ran with max_steps=4 where its checkpoint's had 2: one warning lists the change, and
    config.json's segments and the final model card say from which step it held; an unresumed run has one segment."""
    log = (runs["resumed"] / "logs" / "rank_0.log").read_text()
    assert "glm-grpo: warning: resuming at step 2 with 1 changed setting(s): max_steps 2 -> 4. Steps 1-2 ran" in log
    saved = json.loads((runs["resumed"] / "config.json").read_text())
    assert saved["segments"] == [{"from_step": 0, "changed": {}}, {"from_step": 2, "changed": {"max_steps": [2, 4]}}]
    assert "- from step 3: `max_steps` 2 -> 4" in (runs["resumed"] / "final_adapter" / "README.md").read_text()
    assert json.loads((runs["straight"] / "config.json").read_text())["segments"] == [{"from_step": 0, "changed": {}}]
    assert "Settings changed during training" not in (runs["straight"] / "final_adapter" / "README.md").read_text()


def test_checkpoint_layout_and_atomicity(runs):
    ckpts = runs["resumed"] / "checkpoints"
    assert (ckpts / "latest").read_text() == "step_000004"
    assert not list(ckpts.glob("*.tmp"))  # the stale half-written checkpoint was removed
    for step in ("step_000002", "step_000004"):
        d = ckpts / step
        assert (
            (d / "trainer_state.json").is_file()
            and (d / "ds").is_dir()
            and len(list((d / "rng").glob("rank_*.pt"))) == 2
        )
        weights = load_file(d / "adapter" / "adapter_model.safetensors")
        assert weights and all(t.numel() > 0 for t in weights.values())
    state = json.loads((ckpts / "step_000002" / "trainer_state.json").read_text())
    assert state["step"] == 2 and state["world_size"] == 2 and state["zero_stage"] == 3


def test_checkpoint_holds_no_frozen_base_parameter(runs):
    for step in ("step_000002", "step_000004"):  # written fresh, and after a resume
        assert_no_frozen_parameters(runs["resumed"] / "checkpoints" / step / "ds")


def test_a_resume_on_fewer_ranks_that_would_change_the_global_batch_is_refused(runs, tiny_model_dir, tmp_path, capfd):
    """2 ranks x 1 prompt resumed on 1 rank x 1 prompt: one line naming the batch.prompts_per_rank that keeps the
    global batch, exit 2, before any model loads, nothing written (tests/integration/test_reshape_resume.py resumes
    it with that setting)."""
    out = tmp_path / "other"
    shutil.copytree(runs["resumed"] / "checkpoints", out / "checkpoints")
    before = tree_hash(out)
    args = ["--config", CONFIG, "--deepspeed", ROOT / "ds_configs/zero3.json"]
    args += common(tiny_model_dir, runs["data"], out, "max_steps=6", "resume_from=latest", *runs["extra"])
    code, err = train_main(args, capfd)  # one process: world size 1
    assert code == 2
    assert (
        "trained 2 prompts per step (world size 2 x batch.prompts_per_rank 1); this launch would train 1 (1 x 1): "
        "set batch.prompts_per_rank=2 to keep 2, or allow_batch_change=true to go on with 1 prompts per step; "
        "nothing was changed" in "\n".join(err)
    )
    assert tree_hash(out) == before


def test_a_resume_with_another_lr_runs_with_it(short_run, tiny_model_dir, data64, tmp_path):
    """Issue #50: one checkpoint (short_run's step 1, trained at the config's lr 1e-2; ZeRO-2, torch AdamW) resumed
    once at lr 1e-12 and once at 3e-2. DeepSpeed's load restored the old lr over both, and the two adapters came
    out bitwise identical; now each step 2 runs at its own lr: the logged lr is it, the 1e-12 adapter stays where
    the checkpoint left it, the 3e-2 one moves."""
    saved = load_file(short_run / "checkpoints" / "step_000001" / "adapter" / "adapter_model.safetensors")
    adapters = {}
    for lr in (1e-12, 3e-2):
        out = tmp_path / f"lr{lr:g}"
        shutil.copytree(short_run, out)
        args = common(tiny_model_dir, data64, out, "max_steps=2", "resume_from=latest", f"optimizer.lr={lr}", *FAST)
        proc = run_train(*args)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert [(r["step"], r["lr"]) for r in metrics(out)] == [(1, 1e-2), (2, lr)]
        assert "optimizer.lr 0.01 -> " in proc.stdout + proc.stderr  # the warning that names the change
        assert f"runs with this launch's settings from step 2: lr {lr:.6g} (optimizer.lr={lr:g}," in proc.stdout
        assert "over 2 optimizer steps with warmup_steps=" in proc.stdout  # max_steps=2 x grpo.num_iterations 1
        adapters[lr] = load_file(out / "final_adapter" / "adapter_model.safetensors")
    moved = {lr: max((a[k] - saved[k]).abs().max().item() for k in saved) for lr, a in adapters.items()}
    assert moved[1e-12] < 1e-9 < 1e-4 < moved[3e-2], moved


def test_the_logged_lr_is_the_one_each_step_trained_at(tiny_model_dir, data64, tmp_path):
    """Linear schedule, warmup 1 of 2 steps, lr 1e-2: step 1 trains at 0 and step 2 at 1e-2 (transformers' linear
    warmup). The record read the rate after the optimizer step had moved the schedule, the next step's: [1e-2, 0.0],
    the last step of a decaying run always 0 (HF Trainer logs the rate before the step)."""
    out = tmp_path / "run"
    args = common(tiny_model_dir, data64, out, "max_steps=2", "optimizer.lr=1e-2", "optimizer.schedule=linear")
    proc = run_train(*args, "optimizer.warmup_steps=1", *FAST)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [(r["step"], r["lr"]) for r in metrics(out)] == [(1, 0.0), (2, 1e-2)]


def test_zero_engines_step_with_the_resumed_launchs_optimizer_settings(tmp_path):
    """Real ZeRO-2 / ZeRO-3 engines, torch AdamW and bitsandbytes AdamW8bit wrapped by ZeRO
    (tests/integration/optimizer_resume_worker.py): trained 2 steps at lr 3e-3 (warmup 4, clipping 1.0), loaded into
    an engine built with lr 1e-3, betas (0.8, 0.99), eps 1e-6, weight decay 0.1, clipping 0.5. DeepSpeed's load
    alone puts the checkpoint's values back over the config (ZeRO-2 its clipping too); ds/io.load_ds_checkpoint
    leaves the new ones in force, with the warmup at its position (2 of 4 steps: half of the new lr)."""
    worker = ROOT / "tests" / "integration" / "optimizer_resume_worker.py"
    proc = run_cmd([sys.executable, worker, tmp_path])
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(report) == ["zero2_adamw", "zero2_adamw_8bit", "zero3_adamw", "zero3_adamw_8bit"]
    for case, seen in report.items():
        restored, applied = seen["restored"], seen["applied"]
        assert (restored["lr"], restored["base_lrs"], restored["betas"]) == (1.5e-3, [3e-3], [0.9, 0.999]), case
        assert restored["clip_grad"] == (1.0 if case.startswith("zero2") else 0.5), case
        assert applied == {
            "lr": 5e-4,
            "betas": [0.8, 0.99],
            "eps": 1e-6,
            "weight_decay": 0.1,
            "base_lrs": [1e-3],
            "last_epoch": 2,
            "clip_grad": 0.5,
        }, case


def test_a_resume_that_cannot_apply_its_settings_or_has_no_checkpoint_is_refused_in_one_line(
    short_run, tiny_model_dir, data64, tmp_path, capfd
):
    """Before any model loads, exit 2, one line, nothing touched: optimizer.name changed against the checkpoint
    (its state would not load into the other optimizer), and resume_from=auto on a run without checkpoints (a
    save_steps=0 run such as the demo before issue #50), which names lora.init_from on its final adapter."""
    out = tmp_path / "run"
    shutil.copytree(short_run, out)
    base = ["--config", CONFIG, "--deepspeed", ROOT / "ds_configs/zero2.json"]
    base += common(tiny_model_dir, data64, out, "max_steps=2", *FAST)
    before = tree_hash(out)
    code, err = train_main([*base, "resume_from=latest", "optimizer.name=adamw_8bit"], capfd)
    assert code == 2
    assert [line for line in err if line.startswith("glm-grpo")] == [
        f'glm-grpo train: optimizer.name "adamw" -> "adamw_8bit" cannot change on resume: {out}/checkpoints/'
        "step_000001 was trained with optimizer.name=adamw, and the optimizer state it holds is that optimizer's "
        "(adamw: fp32 moments; adamw_8bit, paged_adamw_8bit: bitsandbytes' 8-bit blocks and scales); resume with "
        "optimizer.name=adamw, or start a new run from its weights with "
        f"lora.init_from={out}/checkpoints/step_000001 in another output_dir (fresh optimizer state); nothing was "
        "changed"
    ]
    assert tree_hash(out) == before
    shutil.rmtree(out / "checkpoints")
    before = tree_hash(out)
    code, err = train_main([*base, "resume_from=auto"], capfd)
    assert code == 2
    assert [line for line in err if line.startswith("glm-grpo")] == [
        f"glm-grpo train: output_dir {out} holds an earlier run (metrics.jsonl, final_adapter/); it has no checkpoint "
        f"to resume from (save_steps writes them); go on from its final adapter with lora.init_from="
        f"{out}/final_adapter and another output_dir=, or start over with overwrite_output_dir=true (deletes it)"
    ]
    assert tree_hash(out) == before


def test_a_damaged_checkpoint_is_refused_before_anything_changes(short_run, tiny_model_dir, data64, tmp_path, capfd):
    """A checkpoint whose optimizer file was cut short (a copy that stopped) passed `train --check`; the resume then
    moved final_adapter/ aside and failed inside DeepSpeed with a traceback, and a relaunch said the final weights
    were never written. Now: one line naming the file, exit 2, nothing touched."""
    out = tmp_path / "run"
    shutil.copytree(short_run, out)
    step = out / "checkpoints" / "step_000001"
    optim = step / "ds" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    whole = optim.read_bytes()
    optim.write_bytes(whole[: len(whole) // 2])
    base = ["--config", CONFIG, "--deepspeed", ROOT / "ds_configs/zero2.json", "--device", "cpu", "--num-gpus", "1"]
    base += common(tiny_model_dir, data64, out, "max_steps=2", "resume_from=latest", *FAST)
    before = tree_hash(out)
    code, err = train_main(base[:4] + base[8:], capfd)
    assert code == 2
    assert [line for line in err if line.startswith("glm-grpo")] == [
        f"glm-grpo train: {step} is damaged: ds/zero_pp_rank_0_mp_rank_00_optim_states.pt is cut short (not a "
        "complete archive); copy it again from where it came, or start a new run from its adapter (lora.init_from="
        f"{step}/adapter); nothing was changed"
    ]
    assert tree_hash(out) == before
    code, said, _ = glm_grpo(["train", "--check", *base], capfd)  # the preflight says the same
    assert code == 2 and f"{step} is damaged: ds/zero_pp_rank_0_mp_rank_00_optim_states.pt is cut short" in said, said


def _merge(base, src, out, capfd):
    code, _, err = glm_grpo(["merge", "--base", base, "--adapter", src, "--out", out, "--dtype", "fp32"], capfd)
    assert code == 0, err  # fp32: compared exactly below
    return load_file(out / "vision_language_encoder" / "model.safetensors")


def test_merge_from_checkpoint_equals_merge_from_adapter(runs, tiny_model_dir, tmp_path, capfd):
    ckpt = runs["resumed"] / "checkpoints" / "step_000004"
    from_adapter = _merge(tiny_model_dir, runs["resumed"] / "final_adapter", tmp_path / "a", capfd)
    bare = tmp_path / "bare_ckpt"
    shutil.copytree(ckpt, bare)
    shutil.rmtree(bare / "adapter")  # no export: consolidate the ZeRO shards
    from_shards = _merge(tiny_model_dir, bare, tmp_path / "b", capfd)
    assert from_adapter.keys() == from_shards.keys()
    for k in from_adapter:
        torch.testing.assert_close(from_shards[k], from_adapter[k], rtol=0, atol=1e-6)


def test_full_finetuning_checkpoint_exports_a_pipeline(tiny_model_dir, tmp_path, capfd):
    from diffusers import GlmImagePipeline

    (tmp_path / "p.txt").write_text("a red cube\na blue ball\n")
    out = tmp_path / "full"
    proc = run_cmd(
        [
            *train_cmd(),
            f"model.path={tiny_model_dir}",
            f"data.train_file={tmp_path / 'p.txt'}",
            f"output_dir={out}",
            "lora=null",
            "optimizer.name=adamw",
            "optimizer.lr=1e-3",
            "grpo.beta=0",
            "max_steps=1",
            "save_steps=1",
            "rollout.height=64",
            "rollout.width=64",
            "grpo.group_size=4",
            "logging.progress_bar=false",
            "rewards=[{name: 'python:glm_grpo_ds.testing.tiny_data:mean_brightness'}]",
        ]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_no_frozen_parameters(out / "checkpoints" / "step_000001" / "ds")  # vision tower and VQ model stay out
    merged = _merge(tiny_model_dir, out / "checkpoints" / "step_000001", tmp_path / "pipe", capfd)
    trained = load_file(out / "final_model" / "model.safetensors")
    # the run's final_model/ itself (the AR, no adapter): the same pipeline, with no checkpoint needed
    from_final = _merge(tiny_model_dir, out / "final_model", tmp_path / "pipe_final", capfd)
    assert set(trained) == set(merged) == set(from_final)
    for k in trained:
        torch.testing.assert_close(merged[k], trained[k], rtol=0, atol=0)
        torch.testing.assert_close(from_final[k], trained[k], rtol=0, atol=0)
    pipe = GlmImagePipeline.from_pretrained(tmp_path / "pipe")
    pipe.set_progress_bar_config(disable=True)
    img = pipe(
        "a red cube",
        height=64,
        width=64,
        num_inference_steps=2,
        output_type="pt",
        generator=torch.Generator().manual_seed(0),
    ).images
    assert img.shape == (1, 3, 64, 64)
