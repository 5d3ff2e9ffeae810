"""The resume-or-start decision of glm_grpo_ds/lifecycle/run.py, without DeepSpeed or a model: a fresh
output_dir starts at step 0, an earlier run is refused (or deleted with overwrite_output_dir), a checkpoint
is resumed at its step, a finished one leaves everything untouched (NothingToDo), one from another cluster
shape continues when the global batch is kept (else one line), and a changed prompt source is a warning. The
trainer's use of it: tests/integration/test_robustness.py (resume_from=auto), test_checkpoint_resume.py,
test_reshape_resume.py."""

import json
import logging
import shutil
from pathlib import Path

import pytest
from gloo_ranks import init_gloo, two_gloo_ranks  # noqa: E402  (tests/gloo_ranks.py)
from run_files import write_ds_files  # noqa: E402  (tests/run_files.py)

from glm_grpo_ds.config import TrainConfig, to_dict
from glm_grpo_ds.lifecycle.checkpoint import CheckpointError, OutputDirError
from glm_grpo_ds.lifecycle.resume import NothingToDo
from glm_grpo_ds.lifecycle.run import Start, decide_start

DATA = {"source": "prompts.jsonl", "rows": 8, "sha256": "a"}


def _cfg(**fields):
    cfg = TrainConfig()
    for key, value in fields.items():
        setattr(cfg, key, value)
    return cfg


def _checkpoint(out, step, world=2, stage=3, data=DATA, config=None):
    path = out / "checkpoints" / f"step_{step:06d}"
    path.mkdir(parents=True)
    state = {"step": step, "world_size": world, "zero_stage": stage, "data": data, "sampler": {}}
    if config is not None:
        state["config"] = to_dict(config)
    (path / "trainer_state.json").write_text(json.dumps(state))
    write_ds_files(path, world, stage)
    (out / "checkpoints" / "latest").write_text(path.name)
    return path


def _tree(root):
    return sorted((str(p.relative_to(root)), p.stat().st_mtime_ns) for p in root.rglob("*"))


def test_a_fresh_output_dir_starts_at_step_0_and_says_so_for_auto(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="glm_grpo_ds"):
        assert decide_start(tmp_path, None, _cfg(resume_from="auto"), 2, 3, DATA, 0) == Start(None, 0)
    assert f"resume_from=auto: no checkpoint in {tmp_path}, starting fresh" in caplog.text


def test_an_earlier_run_is_refused_unless_overwritten(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(OutputDirError, match="holds an earlier run .*overwrite_output_dir=true"):
        decide_start(tmp_path, None, _cfg(), 2, 3, DATA, 0)
    assert (tmp_path / "metrics.jsonl").exists()
    assert decide_start(tmp_path, None, _cfg(overwrite_output_dir=True), 2, 3, DATA, 0) == Start()
    assert not (tmp_path / "metrics.jsonl").exists()


def test_an_overwrite_killed_mid_delete_leaves_no_latest_naming_a_half_deleted_checkpoint(tmp_path, monkeypatch):
    """overwrite_output_dir deletes the earlier run in place: a kill during the checkpoints' delete (here the delete
    interrupted) left `latest` naming a half-deleted step, which a relaunch with resume_from=auto resumed."""
    import shutil

    from glm_grpo_ds.lifecycle import checkpoint

    _checkpoint(tmp_path, 4)
    (tmp_path / "metrics.jsonl").write_text("{}\n")

    rmtree = shutil.rmtree

    def killed(path, *args, **kwargs):
        rmtree(next(Path(path).rglob("*.json")).parent)  # part of it gone
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        decide_start(tmp_path, None, _cfg(overwrite_output_dir=True), 2, 3, DATA, 0)
    assert not (tmp_path / "checkpoints" / "latest").exists()
    monkeypatch.undo()
    with pytest.raises(OutputDirError, match="holds an earlier run"):  # the relaunch: no checkpoint to resume
        decide_start(tmp_path, None, _cfg(resume_from="auto"), 2, 3, DATA, 0)


def test_a_checkpoint_is_resumed_at_its_step(tmp_path, caplog):
    path = _checkpoint(tmp_path, 4)
    with caplog.at_level(logging.WARNING, logger="glm_grpo_ds"):
        assert decide_start(tmp_path, path, _cfg(max_steps=10), 2, 3, DATA, 0) == Start(path, 4)
    assert caplog.text == ""  # same data: nothing to say


def test_a_finished_run_is_left_untouched(tmp_path):
    path = _checkpoint(tmp_path, 10)
    (tmp_path / "final_adapter").mkdir()
    (tmp_path / "final_adapter" / "training_state.json").write_text('{"step": 10}\n')
    before = _tree(tmp_path)
    with pytest.raises(NothingToDo, match="finished at step 10 of max_steps=10"):
        decide_start(tmp_path, path, _cfg(max_steps=10), 2, 3, DATA, 0)
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("resume_from", ["auto", "latest"])
def test_a_finished_run_whose_newest_checkpoint_is_older_is_left_untouched_by_a_relaunch(tmp_path, resume_from):
    """save_steps=4, max_steps=6: the run ends with final_adapter/ of step 6 and its newest checkpoint at 4. A requeue
    (the launch scripts pass resume_from=auto) resumed at 4, set final_adapter/ aside and trained steps 5-6 again;
    every relaunch another copy. A checkpoint named by its path is still trained from."""
    path = _checkpoint(tmp_path, 4)
    (tmp_path / "final_adapter").mkdir()
    (tmp_path / "final_adapter" / "training_state.json").write_text('{"step": 6}\n')
    before = _tree(tmp_path)
    with pytest.raises(NothingToDo, match="finished at step 6 of max_steps=6 .* the newest checkpoint is step 4"):
        decide_start(tmp_path, path, _cfg(max_steps=6, resume_from=resume_from), 2, 3, DATA, 0)
    assert _tree(tmp_path) == before
    assert decide_start(tmp_path, path, _cfg(max_steps=6, resume_from=str(path)), 2, 3, DATA, 0) == Start(path, 4)
    assert decide_start(tmp_path, path, _cfg(max_steps=8, resume_from="auto"), 2, 3, DATA, 0) == Start(path, 4)


def test_a_run_stopped_at_its_last_step_without_its_final_weights_resumes_to_write_them(tmp_path, caplog):
    """A stop (an alarm, a diverged run; before, a signal) at the last step saved a checkpoint there, and the resume
    said "nothing to do": no final_adapter/, no card, no upload, ever. An older step's final_*/ does not count."""
    path = _checkpoint(tmp_path, 10)
    (tmp_path / "final_adapter").mkdir()
    (tmp_path / "final_adapter" / "training_state.json").write_text('{"step": 6}\n')
    with caplog.at_level(logging.INFO, logger="glm_grpo_ds"):
        assert decide_start(tmp_path, path, _cfg(max_steps=10), 2, 3, DATA, 0) == Start(path, 10)
    assert "is the run's last step (10) but its final weights were not written" in caplog.text


class _NoState:
    """An engine whose load finds no DeepSpeed state (what DeepSpeed's load_checkpoint returns for files it cannot
    read): the load fails after every check before it passed."""

    def load_checkpoint(self, *args, **kwargs):
        return None, None


def test_final_weights_are_set_aside_only_once_the_checkpoint_has_loaded(tmp_path):
    """A resume that failed in DeepSpeed's load had already moved final_adapter/ aside; the relaunch then said the
    run's final weights had never been written. Set aside after the load, they stay where they were."""
    from glm_grpo_ds.lifecycle.run import RunLife

    path = _checkpoint(tmp_path, 3, world=1, stage=2)
    (tmp_path / "final_adapter").mkdir()
    (tmp_path / "final_adapter" / "training_state.json").write_text('{"step": 3}\n')
    start = decide_start(tmp_path, path, _cfg(max_steps=6), 1, 2, DATA, 0)
    life = RunLife(_cfg(max_steps=6), tmp_path, start, 0, 1, 2, DATA, publisher=None, later=None)
    with pytest.raises(FileNotFoundError, match="no DeepSpeed state"):
        life.restore(_NoState(), prompt_order=None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints", "final_adapter"]


def test_a_signal_during_the_last_step_lets_the_run_write_its_final_weights(tmp_path):
    """SIGTERM near a job's time limit, in the last step: the stop saved a checkpoint at max_steps and exited 143
    instead of writing final_adapter/ (which the resume then never wrote)."""
    import signal

    from glm_grpo_ds.lifecycle.preempt import Stopped
    from glm_grpo_ds.lifecycle.run import RunLife

    life = RunLife(_cfg(max_steps=3), tmp_path, Start(), 0, 1, 2, DATA, publisher=None, later=None)
    saved = []
    life.stop_if_asked(3, int(signal.SIGTERM), 0, None, lambda: saved.append(3))
    assert saved == []  # no checkpoint, no stop: the loop ends and writes the final weights
    with pytest.raises(Stopped, match="preempted by SIGTERM at step 2"):
        life.stop_if_asked(2, int(signal.SIGTERM), 0, None, lambda: saved.append(2) or tmp_path)
    assert saved == [2]


def test_a_checkpoint_of_another_cluster_shape_continues_when_the_global_batch_is_kept(tmp_path, caplog):
    """Written on 2 ranks x 1 prompt at ZeRO-3: ZeRO-2 on 2 ranks, and 1 rank x 2 prompts, resume (through a universal
    checkpoint: ``written_on``), the new shape among the changes the history records."""
    path = _checkpoint(tmp_path, 4, config=_cfg(max_steps=10))
    with caplog.at_level(logging.WARNING, logger="glm_grpo_ds"):
        start = decide_start(tmp_path, path, _cfg(max_steps=10), 2, 2, DATA, 0)
    assert start == Start(path, 4, {"zero_stage": [3, 2]}, written_on=(2, 3))
    assert "zero_stage 3 -> 2" in caplog.text
    cfg = _cfg(max_steps=10)
    cfg.batch.prompts_per_rank = 2
    start = decide_start(tmp_path, path, cfg, 1, 3, DATA, 0)
    assert start.written_on == (2, 3)
    assert start.changes == {"batch.prompts_per_rank": [1, 2], "world_size": [2, 1]}


def test_a_global_batch_the_new_world_size_changes_is_refused_in_one_line_unless_allowed(tmp_path):
    path = _checkpoint(tmp_path, 4)
    with pytest.raises(CheckpointError) as err:
        decide_start(tmp_path, path, _cfg(max_steps=10), 1, 3, DATA, 0)
    assert str(err.value) == (
        f"{path} trained 2 prompts per step (world size 2 x batch.prompts_per_rank 1); this launch would train 1 "
        "(1 x 1): set batch.prompts_per_rank=2 to keep 2, or allow_batch_change=true to go on with 1 prompts per "
        "step; nothing was changed"
    )
    with pytest.raises(CheckpointError, match=r"2 prompts per step cannot be split over 4 ranks \(world sizes that "
                       r"can: 1, 2\); or allow_batch_change=true to go on with 4"):  # fmt: skip
        decide_start(tmp_path, path, _cfg(max_steps=10), 4, 3, DATA, 0)
    start = decide_start(tmp_path, path, _cfg(max_steps=10, allow_batch_change=True), 4, 3, DATA, 0)
    assert start.written_on == (2, 3) and start.changes == {"world_size": [2, 4]}


def test_a_stage_without_zero_partitions_cannot_take_another_shapes_checkpoint(tmp_path):
    path = _checkpoint(tmp_path, 4)
    with pytest.raises(CheckpointError, match="only ZeRO-1, 2 or 3 take a checkpoint written on another"):
        decide_start(tmp_path, path, _cfg(max_steps=10), 2, 0, DATA, 0)


def test_a_changed_prompt_source_is_a_warning_not_a_refusal(tmp_path, caplog):
    path = _checkpoint(tmp_path, 4)
    with caplog.at_level(logging.WARNING, logger="glm_grpo_ds"):
        start = decide_start(tmp_path, path, _cfg(max_steps=10), 2, 3, dict(DATA, sha256="b"), 0)
    assert start == Start(path, 4) and "differs" in caplog.text


def test_a_changed_optimizer_is_refused_in_one_line_and_other_optimizer_settings_are_changes(tmp_path, caplog):
    """optimizer.name cannot change on resume (the checkpoint's optimizer state is that optimizer's: torch AdamW's
    and bitsandbytes' 8-bit states each fail to load into the other, with a KeyError at the first step); lr, betas,
    weight decay, schedule and warmup are changes that apply (ds/engine.apply_optimizer_settings)."""
    from glm_grpo_ds.config import to_dict

    path = _checkpoint(tmp_path, 4)
    state = json.loads((path / "trainer_state.json").read_text())
    state["config"] = to_dict(_cfg(max_steps=10))
    (path / "trainer_state.json").write_text(json.dumps(state))
    before = _tree(tmp_path)
    cfg = _cfg(max_steps=10)
    cfg.optimizer.name = "adamw"
    with pytest.raises(CheckpointError) as refused:
        decide_start(tmp_path, path, cfg, 2, 3, DATA, 0)
    line = str(refused.value)
    assert "\n" not in line and line.startswith('optimizer.name "adamw_8bit" -> "adamw" cannot change on resume: ')
    assert (
        f"resume with optimizer.name=adamw_8bit, or start a new run from its weights with lora.init_from={path}" in line
    )
    assert _tree(tmp_path) == before
    cfg = _cfg(max_steps=10)
    cfg.optimizer.lr, cfg.optimizer.warmup_steps, cfg.optimizer.schedule = 1e-3, 5, "cosine"
    with caplog.at_level(logging.WARNING, logger="glm_grpo_ds"):
        start = decide_start(tmp_path, path, cfg, 2, 3, DATA, 0)
    assert start.changes == {
        "optimizer.lr": [1e-5, 1e-3],
        "optimizer.schedule": ["constant", "cosine"],
        "optimizer.warmup_steps": [0, 5],
    }
    assert "resuming at step 4 with 3 changed setting(s)" in caplog.text


@pytest.mark.parametrize(
    "change, key, old, new",
    [
        ({"r": 8}, "lora.r", 16, 8),
        ({"target_modules": ["q_proj", "v_proj"]}, "lora.target_modules", None, ["q_proj", "v_proj"]),
        (None, "lora.r", 16, None),  # LoRA -> full fine-tuning
        ({"alpha": 64}, "lora.alpha", 32, 64),  # the weights load, and the model is another from the first step
    ],
)
def test_a_changed_lora_shape_is_refused_before_any_model_loads(tmp_path, change, key, old, new):
    """A checkpoint's adapters (and their optimizer state) of another rank or on other modules, or a LoRA checkpoint
    resumed as full fine-tuning, cannot load into the model this launch builds: it was a warning at the start and
    a RuntimeError traceback on every rank after the whole model had loaded. The way on: the merged weights."""
    import dataclasses

    from glm_grpo_ds.config import LoraConfig

    path = _checkpoint(tmp_path, 4, config=_cfg(max_steps=10))
    old = LoraConfig().target_modules if old is None else old
    lora = None if change is None else dataclasses.replace(LoraConfig(), **change)
    before = _tree(tmp_path)
    with pytest.raises(CheckpointError) as refused:
        decide_start(tmp_path, path, _cfg(max_steps=10, lora=lora), 2, 3, DATA, 0)
    line = str(refused.value)
    assert "\n" not in line and line.startswith(f"{key} {json.dumps(old)} -> {json.dumps(new)} cannot change on resume")
    assert f"model.path=DIR after glm-grpo merge --base MODEL --adapter {path} --out DIR" in line
    assert _tree(tmp_path) == before  # nothing was changed


def test_a_full_fine_tuning_resumed_with_lora_names_lora_null(tmp_path):
    """The way back to a full fine-tuning's checkpoint is lora=null: the line said lora.r=None, itself refused."""
    path = _checkpoint(tmp_path, 4, config=_cfg(max_steps=10, lora=None))
    with pytest.raises(CheckpointError) as refused:
        decide_start(tmp_path, path, _cfg(max_steps=10), 2, 3, DATA, 0)
    assert f"{path} was trained with lora=null, and its trainable weights" in str(refused.value)
    assert "; resume with lora=null, or start a new run" in str(refused.value)


GROUP_TIMEOUT_S = 1  # the process group's timeout in the ranks below; rank 0's long work outlasts it 3-4 times


def _converting_rank(rank, port, out, results):
    """One of two gloo ranks whose process group times out after 1 s: rank 0's conversion takes 3 s. Each puts (rank,
    gloo's error or None, when it entered ``convert``, when rank 0's conversion began and ended (rank 0) or when it
    returned (rank 1)): times of one clock for every process of the machine (time.monotonic)."""
    import time

    import torch

    from glm_grpo_ds.ds import portable
    from glm_grpo_ds.lifecycle.run import RunLife

    init_gloo(rank, port, 2, timeout_s=GROUP_TIMEOUT_S)
    try:
        start = Start(out / "checkpoints" / "step_000002", 2, {}, written_on=(4, 2))
        life = RunLife(TrainConfig(), out, start, rank, 2, 2, DATA, publisher=None, later=None)
        portable.check_converted = lambda universal, ds_dir: False  # not converted yet
        slept = []

        def conversion(ds_dir, universal):  # the conversion itself: test_reshape_resume.py
            slept.append(time.monotonic())
            time.sleep(3 * GROUP_TIMEOUT_S)
            slept.append(time.monotonic())

        life._convert = conversion
        began, err = time.monotonic(), None
        try:
            life.convert()
        except RuntimeError as gloo:  # gloo's timeout
            err = str(gloo).splitlines()[0]
        results.put((rank, err, began, *(slept if rank == 0 else [time.monotonic()])))
    finally:
        torch.distributed.destroy_process_group()


def test_the_other_ranks_wait_for_a_conversion_longer_than_the_process_groups_timeout(tmp_path):
    """Rank 0 converts a checkpoint of another cluster shape while the others wait: on a group of their own, so a
    conversion longer than dist_timeout_minutes (which is there to catch hangs) does not end the run. Timed across
    the ranks (a rank that starts late under load still waits for the whole conversion)."""
    got = sorted(two_gloo_ranks(_converting_rank, tmp_path))
    assert [(rank, err) for rank, err, *_ in got] == [(0, None), (1, None)], got
    (_, _, _, converting, converted), (_, _, waiting, returned) = got
    assert converted - converting >= 3 * GROUP_TIMEOUT_S
    # rank 1 waited from before the conversion began (convert's group is collective) to after it ended
    assert waiting <= converting and returned >= converted, got


def _stopped_rank(rank, port, results):
    """One rank of a stopped run whose rank 0 uploads the checkpoint for 4 s, with a process group timeout of 1 s.
    Each puts (rank, its exit status or gloo's error, when it entered ``end_stopped``, when rank 0's upload began and
    ended (rank 0) or when it returned (rank 1)): times of one clock for every process of the machine."""
    import time

    from glm_grpo_ds.config import TrainConfig
    from glm_grpo_ds.lifecycle.preempt import Stopped
    from glm_grpo_ds.lifecycle.run import RunLife, Start
    from glm_grpo_ds.runtime import log

    log.FATAL_GRACE_S = 0  # the other ranks' wait for rank 0's line: not what is measured here
    init_gloo(rank, port, 2, timeout_s=GROUP_TIMEOUT_S)
    slept = []

    class Upload:
        def wait(self):
            if rank == 0:
                slept.append(time.monotonic())
                time.sleep(4 * GROUP_TIMEOUT_S)
                slept.append(time.monotonic())

    life = RunLife(TrainConfig(), Path("."), Start(), rank, 2, 2, DATA, publisher=Upload(), later=None)
    began = time.monotonic()
    try:
        code = life.end_stopped(Stopped("preempted", 143))
    except RuntimeError as err:  # gloo's timeout
        code = str(err).splitlines()[0]
    results.put((rank, code, began, *(slept if rank == 0 else [time.monotonic()])))


def test_a_stopped_runs_ranks_wait_for_rank_0s_upload_longer_than_the_process_groups_timeout():
    """They waited in the process group's barrier, which gave up after dist_timeout_minutes: rank 1 exited with an
    error, and the launcher ended rank 0 mid-upload. Timed across the ranks, as the conversion's wait above."""
    got = sorted(two_gloo_ranks(_stopped_rank))
    assert [(rank, code) for rank, code, *_ in got] == [(0, 143), (1, 143)], got
    (_, _, _, uploading, uploaded), (_, _, waiting, returned) = got
    assert uploaded - uploading >= 4 * GROUP_TIMEOUT_S
    # rank 1 waited from before the upload began (end_stopped's group is collective) to after it ended
    assert waiting <= uploading and returned >= uploaded, got


def _signal_during_the_stops_wait(tmp_path, signum, stop_code: int, repo=None) -> tuple[int, bool]:
    """A stopped run's ``end_stopped`` on rank 0 while its upload runs; the upload sends ``signum`` to this process once
    the main thread waits for it. (The exit status, whether the upload ran to its end.)"""
    import os
    import threading
    import time

    from glm_grpo_ds.lifecycle.preempt import Stopped, signal_name
    from glm_grpo_ds.lifecycle.run import RunLife
    from glm_grpo_ds.sharing.hub import Publisher

    submitted, uploaded = threading.Event(), threading.Event()

    def signal_then_finish():
        submitted.wait(30)  # the job is pending (it starts before submit has recorded it)
        while publisher.background._pending:  # until the main thread's wait in end_stopped has taken this job
            time.sleep(0.005)
        os.kill(os.getpid(), signum)  # lands in the main thread, which waits for this job
        time.sleep(0.5)
        uploaded.set()

    publisher = Publisher(TrainConfig(), tmp_path, 0)  # no repo: prepares nothing on the Hub
    publisher.hub.repo_id = repo  # what a line names
    try:
        life = RunLife(TrainConfig(), tmp_path, Start(), 0, 1, 2, DATA, publisher=publisher, later=None)
        publisher.background.submit("upload", signal_then_finish)
        submitted.set()
        line = f"glm-grpo train: preempted by {signal_name(signum)} at step 3; checkpoint at X"
        code = life.end_stopped(Stopped(line, stop_code))
    finally:
        publisher.wait()
    return code, uploaded.is_set()


@pytest.mark.parametrize("repo", [None, "me/run"])
def test_a_ctrl_c_while_a_stopped_run_waits_for_rank_0s_upload_or_pruning_is_one_line(tmp_path, capfd, repo):
    """The stop's line, then a second Ctrl-C during the wait for the checkpoint's upload (or the pruning of old
    checkpoints): one line saying what is saved and how to upload it, exit 130; it was a chained traceback (the
    KeyboardInterrupt raised inside ``except Stopped``)."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # a terminal's, whatever pytest inherited
    try:
        code, _ = _signal_during_the_stops_wait(tmp_path, signal.SIGINT, 130, repo)
    finally:
        signal.signal(signal.SIGINT, previous)
    err = capfd.readouterr().err
    assert code == 130
    what = "while pruning" if repo is None else f"upload to {repo} interrupted by SIGINT"
    assert "Traceback" not in err and err.count("\n") == 2, err
    assert "preempted by SIGINT at step 3" in err and what in err and f"saved in {tmp_path}" in err, err


def test_a_repeated_sigterm_while_a_stopped_run_waits_for_rank_0s_upload_is_passed_over(tmp_path):
    """The stop's checkpoint is saved and the ranks wait for rank 0's upload; out of StopSignals SIGTERM's default
    handler was back, and a scheduler's repeated SIGTERM (launch/signals.sh forwards each) killed the ranks
    mid-upload, silently, exit -15. The wait goes on and the run exits as the stop said."""
    import signal

    previous = signal.getsignal(signal.SIGTERM)
    assert _signal_during_the_stops_wait(tmp_path, signal.SIGTERM, 143) == (143, True)
    assert signal.getsignal(signal.SIGTERM) is previous  # put back as it was


def test_going_back_to_an_earlier_checkpoint_points_latest_at_it(tmp_path):
    """resume_from=<step 4's path> with step 6 the latest: `latest` named step 6 until the first save, so a run killed
    before it and relaunched with resume_from=auto (the launch scripts) went on with the steps it had gone back from.
    A checkpoint of another output_dir is not named."""
    from glm_grpo_ds.lifecycle.run import RunLife
    from glm_grpo_ds.sharing.hub import Publisher

    four = _checkpoint(tmp_path, 4)
    _checkpoint(tmp_path, 6)
    latest = tmp_path / "checkpoints" / "latest"
    other = _checkpoint(tmp_path / "other", 2)

    def tidy(start):
        cfg = _cfg(max_steps=10)
        RunLife(cfg, tmp_path, start, 0, 1, 2, DATA, publisher=Publisher(cfg, tmp_path, 0), later=None).tidy()

    tidy(Start(other, 2))
    assert latest.read_text() == "step_000006"
    tidy(Start(four, 4))
    assert latest.read_text() == "step_000004"


STOPPED_RANK_1 = """
import os, signal, sys, threading, time
from pathlib import Path
from glm_grpo_ds.config import TrainConfig
from glm_grpo_ds.lifecycle.preempt import Stopped, StopSignals
from glm_grpo_ds.lifecycle.run import RunLife, Start
from glm_grpo_ds.runtime import log

log.setup("info", 1)  # rank 1: log.fatal waits FATAL_GRACE_S for rank 0's line first


class Upload:
    def wait(self):
        time.sleep(0.5)  # rank 0's upload, waited for


life = RunLife(TrainConfig(), Path("."), Start(), 1, 2, 2, {}, publisher=Upload(), later=None)
with StopSignals(None) as signals:  # the loop: the first SIGTERM is recorded, the step ends, Stopped is raised
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)
threading.Timer(float(sys.argv[1]), os.kill, (os.getpid(), signal.SIGTERM)).start()  # the scheduler repeats it
print("returned", life.end_stopped(Stopped("glm-grpo train: preempted by SIGTERM", 143)), flush=True)
"""


@pytest.mark.parametrize("delay", [0.5, 2.0])
def test_a_repeated_sigterm_while_a_stopped_rank_says_its_line_is_passed_over(delay):
    """A rank other than 0 waits ``FATAL_GRACE_S`` (3 s) in log.fatal before its stop line; that wait was before
    terms_ignored, and a repeated SIGTERM then killed the rank, silently (-15), and the launcher the node's ranks
    with it, rank 0 mid-upload."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", STOPPED_RANK_1, str(delay)], capture_output=True, text=True, timeout=60
    )
    assert (proc.returncode, proc.stdout.splitlines()[-1:]) == (0, ["returned 143"]), proc.stderr[-2000:]


FINAL_UPLOAD = """
import os, signal, sys, threading, time
from pathlib import Path
from glm_grpo_ds.config import TrainConfig
from glm_grpo_ds.lifecycle.run import RunLife, Start
from glm_grpo_ds.sharing import hub

out = Path(sys.argv[1])
uploads = []
hub.upload = lambda folder, *args, **kwargs: (time.sleep(1.5), uploads.append(folder), "https://hub/commit")[-1]
publisher = hub.Publisher(TrainConfig(), out, 0)
publisher.hub.repo_id = "me/run"
publisher.final_weights = out / "final_adapter"
life = RunLife(TrainConfig(), out, Start(), 0, 1, 1, {}, publisher=publisher, later=None)
threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()  # a job's time limit, mid-upload
print("exit", life.finish_uploads(), "uploads", len(uploads), flush=True)
"""


def test_a_sigterm_during_the_final_upload_is_passed_over(tmp_path):
    """Rank 0 uploads the final weights after the process group is gone, outside the training's signal handling: a
    scheduler's SIGTERM (launch/slurm.sbatch forwards the time limit's) killed it mid-upload, silently, and the
    requeued job found the run finished and never uploaded."""
    import subprocess
    import sys

    (tmp_path / "final_adapter").mkdir()
    proc = subprocess.run(
        [sys.executable, "-c", FINAL_UPLOAD, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert (proc.returncode, proc.stdout.splitlines()[-1:]) == (0, ["exit 0 uploads 1"]), proc.stderr[-2000:]


def test_another_runs_checkpoint_is_refused_into_an_output_dir_holding_a_run(tmp_path):
    """Resumed by its path into run A's output_dir, run F's checkpoint appended F's steps to A's metrics.jsonl and
    config.json as one history. Refused (nothing changed); into a new output_dir, or A's own checkpoint kept
    elsewhere, it resumes."""
    a, f = tmp_path / "A", tmp_path / "F"
    for out, run_id in ((a, "run A"), (f, "run F")):
        path = _checkpoint(out, 3, config=_cfg(max_steps=10))
        state = json.loads((path / "trainer_state.json").read_text())
        (path / "trainer_state.json").write_text(json.dumps({**state, "run_id": run_id, "lora": True}))
    (a / "metrics.jsonl").write_text('{"step": 1}\n')
    theirs = f / "checkpoints" / "step_000003"
    before = _tree(tmp_path)
    with pytest.raises(CheckpointError) as refused:
        decide_start(a, theirs, _cfg(max_steps=10), 2, 3, DATA, 0)
    assert str(refused.value) == (
        f"{theirs} is another run's checkpoint than the run in output_dir {a}: resumed there, metrics.jsonl and "
        f"config.json would mix the two runs' steps; resume it with a new output_dir=, or start from its adapter with "
        f"lora.init_from={theirs}/adapter; nothing was changed"
    )
    assert _tree(tmp_path) == before
    assert decide_start(tmp_path / "new", theirs, _cfg(max_steps=10), 2, 3, DATA, 0).step == 3
    kept = shutil.copytree(a / "checkpoints" / "step_000003", tmp_path / "archive" / "step_000003")
    assert decide_start(a, kept, _cfg(max_steps=10), 2, 3, DATA, 0).step == 3  # A's own, kept elsewhere
    assert decide_start(f, theirs, _cfg(max_steps=10), 2, 3, DATA, 0).step == 3
