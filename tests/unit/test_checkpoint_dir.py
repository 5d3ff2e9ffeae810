"""output_dir protection and checkpoint pruning (glm_grpo_ds/lifecycle/checkpoint.py), on fake checkpoint trees:
a fresh start refuses an earlier run and leaves it byte-identical, overwrite_output_dir deletes it,
pruning counts only this run's checkpoints by step, never deletes `latest`, and a crash while pruning
leaves `latest` loadable."""

import json
import shutil

import pytest
import torch
from run_files import tree_hash, write_ds_files  # noqa: E402  (tests/run_files.py)

from glm_grpo_ds.config import ConfigError, load_config
from glm_grpo_ds.lifecycle import checkpoint
from glm_grpo_ds.runtime import seeding


def fake_checkpoint(root, step, run_id, launch=None):
    path = root / checkpoint.CHECKPOINTS / checkpoint.step_dir_name(step)
    (path / "ds").mkdir(parents=True)
    state = {"step": step, "run_id": run_id} if launch is None else {"step": step, "run_id": run_id, "launch": launch}
    (path / "trainer_state.json").write_text(json.dumps(state))
    return path


def point_latest(root, step):
    (root / checkpoint.CHECKPOINTS / checkpoint.LATEST).write_text(checkpoint.step_dir_name(step))


@pytest.fixture
def earlier(tmp_path):
    out = tmp_path / "run"
    for step in (4, 5):
        fake_checkpoint(out, step, "old")
    point_latest(out, 5)
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    (out / "final_adapter").mkdir()
    (out / "final_adapter" / "adapter_model.safetensors").write_bytes(b"weights")
    (out / "samples").mkdir()
    (out / "config.json").write_text("{}")
    return out


def test_fresh_start_in_an_earlier_run_is_refused_and_touches_nothing(earlier):
    before = tree_hash(earlier)
    with pytest.raises(checkpoint.OutputDirError) as err:
        checkpoint.start_fresh(earlier, overwrite=False, rank=0)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(
        f"output_dir {earlier} holds an earlier run (checkpoints/, metrics.jsonl, final_adapter/)"
    )
    assert "continue it with resume_from=auto (or latest), or start over with overwrite_output_dir=true" in message
    assert tree_hash(earlier) == before


def test_without_a_checkpoint_the_error_offers_no_resume(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 1}\n')  # died before its first checkpoint
    with pytest.raises(checkpoint.OutputDirError) as err:
        checkpoint.start_fresh(out, overwrite=False, rank=0)
    assert str(err.value).endswith(
        "(metrics.jsonl); it has no checkpoint to resume from (save_steps writes them); start over with "
        "overwrite_output_dir=true (deletes it), or pick another output_dir="
    )


def test_a_finished_run_without_a_checkpoint_is_refused_with_lora_init_from(tmp_path):
    """A run that ended with save_steps=0 (issue #50: the demo did) has its final adapter and nothing to resume:
    resume_from=auto (a fresh start into it) and resume_from=latest both say, in one line, how to go on from that
    adapter (lora.init_from, in another output_dir)."""
    out = tmp_path / "run"
    (out / "final_adapter").mkdir(parents=True)
    (out / "metrics.jsonl").write_text('{"step": 80}\n')
    go_on = f"go on from its final adapter with lora.init_from={out / 'final_adapter'} and another output_dir="
    assert checkpoint.resume_path(out, "auto") is None  # auto: a fresh start, which start_fresh refuses
    with pytest.raises(checkpoint.OutputDirError) as err:
        checkpoint.start_fresh(out, overwrite=False, rank=0)
    assert "\n" not in str(err.value)
    assert str(err.value) == (
        f"output_dir {out} holds an earlier run (metrics.jsonl, final_adapter/); it has no checkpoint to resume from "
        f"(save_steps writes them); {go_on}, or start over with overwrite_output_dir=true (deletes it)"
    )
    with pytest.raises(checkpoint.CheckpointError) as err:
        checkpoint.resume_path(out, "latest")
    assert "\n" not in str(err.value) and str(err.value).endswith(
        f"no checkpoint was completed in {out} (save_steps writes them); {go_on}"
    )


def test_resume_from_auto_resumes_from_latest_when_there_is_one(tmp_path):
    out = tmp_path / "run"
    assert checkpoint.resume_path(out, "auto") is None  # nothing yet: a fresh start
    assert checkpoint.resume_path(out, None) is None
    with pytest.raises(checkpoint.CheckpointError, match="resume_from=latest but .* does not exist"):
        checkpoint.resume_path(out, "latest")
    fake_checkpoint(out, 1, "r")
    assert checkpoint.resume_path(out, "auto") is None  # complete on disk but never pointed at: not resumable
    newest = fake_checkpoint(out, 2, "r")
    point_latest(out, 2)
    assert checkpoint.resume_path(out, "auto") == newest == checkpoint.resume_path(out, "latest")


def test_a_resume_path_that_does_not_exist_lists_the_checkpoints_there(tmp_path):
    """resume_from=.../step_9 mistyped said "is not a complete checkpoint (needs trainer_state.json and ds/)"."""
    out = tmp_path / "run"
    fake_checkpoint(out, 1, "r")
    fake_checkpoint(out, 2, "r")
    gone = out / "checkpoints" / "step_000009"
    with pytest.raises(checkpoint.CheckpointError) as err:
        checkpoint.resume_path(out, str(gone))
    assert str(err.value) == (
        f"resume_from {gone} does not exist (the checkpoints in {gone.parent}: step_000001, step_000002; "
        "resume_from=latest takes the newest)"
    )


def test_overwrite_deletes_the_earlier_run(earlier):
    checkpoint.start_fresh(earlier, overwrite=True, rank=0)
    assert sorted(p.name for p in earlier.iterdir()) == ["config.json"]  # rewritten by every run anyway


def test_what_is_not_an_earlier_run(tmp_path):
    out = tmp_path / "run"
    (out / checkpoint.CHECKPOINTS / "step_000003.tmp").mkdir(parents=True)  # died in its first save
    (out / "metrics.jsonl").write_text("")  # failed before its first step
    (out / "config.json").write_text("{}")
    assert checkpoint.earlier_run(out) == []
    checkpoint.start_fresh(out, overwrite=False, rank=0)


def test_overwrite_with_resume_is_a_config_error():
    base = ["model.path=/m", "data.train_file=/d.txt", "rewards=[{name: pixel_mse}]"]
    with pytest.raises(ConfigError, match="overwrite_output_dir=true starts over but resume_from=latest continues"):
        load_config(None, [*base, "overwrite_output_dir=true", "resume_from=latest"])
    # auto: resume when there is a checkpoint, else start over
    assert load_config(None, [*base, "overwrite_output_dir=true", "resume_from=auto"]).resume_from == "auto"


def test_pruning_keeps_this_runs_newest_by_step_and_never_latest(tmp_path):
    root = tmp_path / checkpoint.CHECKPOINTS
    other = [fake_checkpoint(tmp_path, s, "other") for s in (4, 5)]  # another run's, higher steps
    for step in (1, 2, 3):
        fake_checkpoint(tmp_path, step, "mine")
    point_latest(tmp_path, 3)
    deleted = checkpoint.prune(root, 2, "mine")
    assert [p.name for p in deleted] == ["step_000001"]
    assert sorted(p.name for p in root.iterdir()) == [
        "latest",
        "step_000002",
        "step_000003",
        "step_000004",
        "step_000005",
    ]
    assert all(p.is_dir() for p in other)
    # resumed from an older checkpoint: `latest` is not the highest step, and is kept whatever the limit
    fake_checkpoint(tmp_path, 10, "mine")
    point_latest(tmp_path, 2)
    checkpoint.prune(root, 1, "mine")
    assert (root / "step_000002").is_dir() and (root / "step_000010").is_dir() and not (root / "step_000003").exists()
    assert checkpoint.resolve(tmp_path, "latest") == root / "step_000002"


def test_pruning_leaves_alone_the_branch_a_resume_went_back_from(tmp_path):
    """A run stopped at step 347 (diverged) and resumed from step_300 with a lower lr: with save_total_limit=2 its
    save at 350 deleted step_300, the point it went back to, and kept step_347, the branch it left behind."""
    root = tmp_path / checkpoint.CHECKPOINTS
    first = {"id": "first", "from_step": 0}
    for step in (100, 200, 300, 347):
        fake_checkpoint(tmp_path, step, "mine", first)
    second = {"id": "second", "from_step": 300}  # this launch, resumed from step_300
    fake_checkpoint(tmp_path, 350, "mine", second)
    point_latest(tmp_path, 350)
    assert [p.name for p in checkpoint.prune(root, 2, "mine", second)] == ["step_000100", "step_000200"]
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000300", "step_000347", "step_000350"]
    fake_checkpoint(tmp_path, 400, "mine", second)
    point_latest(tmp_path, 400)
    assert [p.name for p in checkpoint.prune(root, 2, "mine", second)] == ["step_000300"]  # this branch's newest 2
    assert (root / "step_000347").is_dir()  # the other branch: the user's to keep or delete


@pytest.mark.parametrize("text", ["[]", '{"step": 4}', '{"step": 4, "world_size": 2, "zero_stage": "two"}', "{"])
def test_a_trainer_state_that_is_not_one_is_a_one_line_checkpoint_error(tmp_path, text):
    """A list, a state without world_size, a stage that is no number: a KeyError / TypeError traceback on resume."""
    path = tmp_path / "step_000004"
    path.mkdir()
    (path / "trainer_state.json").write_text(text)
    with pytest.raises(checkpoint.CheckpointError, match=rf"^{path}/trainer_state.json is not a trainer state \("):
        checkpoint.check_compatible(path, 2, 2)


def test_pruning_passes_over_a_checkpoint_whose_state_is_not_ours(tmp_path):
    """A trainer_state.json that is valid JSON but not a state (a list, a step that is no number): pruning raised on
    rank 0's background thread, which surfaced at its next checkpoint while the other ranks waited in a collective."""
    root = tmp_path / checkpoint.CHECKPOINTS
    for step in (1, 2, 3):
        fake_checkpoint(tmp_path, step, "mine")
    point_latest(tmp_path, 3)
    for name, text in (("step_000007", "[]"), ("step_000008", '{"run_id": "mine", "step": "eight"}')):
        (root / name).mkdir()
        (root / name / "trainer_state.json").write_text(text)
    assert [p.name for p in checkpoint.prune(root, 1, "mine")] == ["step_000001", "step_000002"]
    assert (root / "step_000007").is_dir() and (root / "step_000008").is_dir()


def test_pruning_orders_by_step_number_not_name(tmp_path):
    root = tmp_path / checkpoint.CHECKPOINTS
    for step in (999_999, 1_000_000):  # the 7-digit name sorts before the 6-digit one
        fake_checkpoint(tmp_path, step, "mine")
    point_latest(tmp_path, 1_000_000)
    checkpoint.prune(root, 1, "mine")
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_1000000"]


def test_a_crash_while_pruning_leaves_latest_loadable(tmp_path, monkeypatch):
    root = tmp_path / checkpoint.CHECKPOINTS
    for step in (1, 2, 3):
        fake_checkpoint(tmp_path, step, "mine")
    point_latest(tmp_path, 3)

    def killed(path, *args, **kwargs):  # the process dies half-way through deleting step_000001
        (path / "trainer_state.json").unlink()
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.prune(root, 1, "mine")
    monkeypatch.undo()
    assert checkpoint.resolve(tmp_path, "latest") == root / "step_000003"
    # no half-deleted step_N is left under its name; the next start removes the .deleting leftover
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000001.deleting", "step_000002", "step_000003"]
    checkpoint.remove_stale(tmp_path)
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000002", "step_000003"]


def test_saving_a_step_again_never_leaves_latest_naming_a_half_deleted_checkpoint(tmp_path, monkeypatch):
    """A launch saves a step that `latest` already names and it wrote itself: the earlier one is set aside and
    deleted after the new one holds the name, so a kill during that multi-GB deletion leaves `latest` loadable (and
    the new checkpoint in it). The engine's own files are a stand-in: what is tested is the directory's life (the
    real save: tests/integration/test_checkpoint_resume.py)."""
    root = tmp_path / checkpoint.CHECKPOINTS
    fake_checkpoint(tmp_path, 2, "mine", {"id": "this launch", "from_step": 0})
    point_latest(tmp_path, 2)
    monkeypatch.setattr(checkpoint.ds_io, "save_ds_checkpoint", lambda engine, d: (d / "ds").mkdir())

    def killed(path, *args, **kwargs):  # the process dies half-way through deleting the earlier step_000002
        (path / "trainer_state.json").unlink()
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        state = {"step": 2, "run_id": "again", "launch": {"id": "this launch", "from_step": 0}}
        checkpoint.save(None, tmp_path, 2, state, rank=0, is_lora=False, total_limit=0)
    monkeypatch.undo()
    latest = checkpoint.resolve(tmp_path, "latest")
    assert json.loads((latest / "trainer_state.json").read_text())["run_id"] == "again"
    (latest / "universal.tmp" / "zero").mkdir(parents=True)  # and a conversion killed on the next start
    checkpoint.remove_stale(tmp_path)
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000002"]
    assert sorted(p.name for p in latest.iterdir()) == ["ds", "rng", "trainer_state.json"]


def test_a_rank_keeps_its_own_devices_random_state_whatever_devices_it_sees_on_resume(monkeypatch):
    """The CUDA random state saved is this rank's device's alone, and comes back there, also when the resumed rank
    sees fewer devices (one node of 8 GPUs requeued as 2 nodes of 4, same world size): a list of every visible
    device's state, restored index by index, raised IndexError there. A checkpoint of an earlier version (that list)
    is restored where the rank sees as many devices, else left (which was the rank's is not recorded), said once.
    torch.cuda stands in for this CPU machine's missing GPUs."""
    devices = {"current": 5, "states": {}}
    monkeypatch.setattr(seeding.torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(seeding.torch.cuda, "set_rng_state_all", lambda s: devices["states"].update(all=len(s)))
    monkeypatch.setattr(seeding.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(seeding.torch.cuda, "current_device", lambda: devices["current"])
    monkeypatch.setattr(seeding.torch.cuda, "get_rng_state", lambda: torch.tensor([devices["current"]]))
    monkeypatch.setattr(seeding.torch.cuda, "set_rng_state", lambda s: devices["states"].update(now=int(s)))
    saved = seeding.rng_state()  # rank 5 of a node of 8
    devices["current"] = 1  # the same rank requeued on a node of 4: its device is now cuda:1
    seeding.set_rng_state(saved)
    assert devices["states"] == {"now": 5}
    earlier = {k: v for k, v in saved.items() if k != "cuda_device"}
    for seen, restored in ((4, {"now": 5, "all": 4}), (8, {"now": 5, "all": 4})):
        seeding.set_rng_state(dict(earlier, cuda=[torch.tensor([i]) for i in range(seen)]))
        assert devices["states"] == restored


def test_a_stage_0_checkpoint_on_another_shape_is_refused_before_any_model_loads(tmp_path):
    """ZeRO stage 0 keeps no partitioned optimizer state, so DeepSpeed's converter cannot read it: a resume on another
    world size or stage is one line naming what resumes it, not a conversion failing after the models load (and
    `train --check` said ok). Its own shape resumes as before."""
    path = fake_checkpoint(tmp_path, 4, "mine")
    (path / "trainer_state.json").write_text(
        json.dumps({"step": 4, "run_id": "mine", "world_size": 1, "zero_stage": 0})
    )
    write_ds_files(path, 1, 0)
    assert checkpoint.check_compatible(path, 1, 0)["step"] == 4
    with pytest.raises(checkpoint.CheckpointError) as refused:
        checkpoint.check_compatible(path, 2, 2)
    line = str(refused.value)
    assert (
        "\n" not in line
        and "world size 1 and ZeRO stage 0" in line
        and "resume it with world size 1 at stage 0" in line
    )
    assert f"lora.init_from={path / 'adapter'}" in line


def test_rank_zero_background_jobs_run_in_order_beside_the_caller():
    """Pruning and checkpoint uploads (glm_grpo_ds/lifecycle/background.py): the caller goes on at once, the jobs run
    in the order submitted (a prune never overtakes an earlier upload of what it deletes), a new job of a kind
    whose previous one has not finished within its wait is skipped and said (it waited without end: rank 0 held
    while the other ranks waited in a collective that gives up after dist_timeout_minutes), and wait() waits for
    all."""
    import threading

    from glm_grpo_ds.lifecycle.background import Background

    events, release = [], threading.Event()
    background = Background()
    assert background.submit("upload", lambda: (release.wait(10), events.append("upload 1")))
    assert background.submit("prune", lambda: events.append("prune 1"))
    assert events == []  # submitted, not waited for
    assert not background.submit("upload", lambda: events.append("upload 2"), 0.2, lambda: events.append("busy"))
    assert not background.submit("prune", lambda: events.append("prune 2"))  # the queued one prunes then
    assert events == ["busy"]
    release.set()
    background.wait()
    assert events == ["busy", "upload 1", "prune 1"]
    assert background.submit("upload", lambda: events.append("upload 3"))  # the earlier one done
    slow = threading.Timer(0.3, release.set)
    release.clear()
    assert background.submit("upload", lambda: release.wait(10), wait_s=10)  # after upload 3
    slow.start()
    assert background.submit("upload", lambda: events.append("upload 4"), wait_s=10)  # it finished meanwhile
    background.wait()
    assert events[-2:] == ["upload 3", "upload 4"]
    # its worker ended with the wait: a non-daemon thread left idle held the process's exit in the slow teardown
    assert not [t for t in threading.enumerate() if t.name.startswith("glm-grpo-rank0")]
    assert background.submit("prune", lambda: events.append("prune 3"))  # a new worker for it
    background.wait()
    assert events[-1] == "prune 3"


def test_save_best_names_the_best_evaluated_checkpoint_and_pruning_keeps_it(tmp_path):
    """lifecycle/best.py: checkpoints/best follows the highest eval reward (a tie or a NaN does not move it) and
    pruning (save_total_limit=1) deletes every other old checkpoint but that one."""
    from glm_grpo_ds.lifecycle.best import BEST_RECORD, BestCheckpoint

    out = tmp_path / "run"
    root = out / checkpoint.CHECKPOINTS
    best = BestCheckpoint(out, True, True, resume_step=0)
    moved = []
    for step, reward in [(1, 0.2), (2, 0.7), (3, 0.7), (4, float("nan")), (5, 0.5), (6, None)]:
        path = fake_checkpoint(out, step, "r")
        point_latest(out, step)
        moved.append(best.consider(step, reward, path))
        checkpoint.prune(root, 1, "r")
    assert moved == [True, True, False, False, False, False]
    assert (root / checkpoint.BEST).read_text() == "step_000002" and (best.step, best.value) == (2, 0.7)
    record = json.loads((root / BEST_RECORD).read_text())
    assert (record["step"], record["checkpoint"], record["eval/reward_mean"]) == (2, "step_000002", 0.7)
    assert sorted(p.name for p in root.glob("step_*")) == ["step_000002", "step_000006"]  # the best and the latest
    assert not BestCheckpoint(out, False, False).consider(7, 9.0, root / "step_000006")  # not rank 0: nothing


def test_a_resume_takes_the_best_again_among_the_checkpoints_it_goes_on_from(tmp_path):
    """Rewards 0.3, 0.5, 0.4, 0.6 at steps 1-4, resumed from step 3: step 4 (a branch left behind) is no candidate and
    step 2 is the best again (it was forgotten: a later 0.45 became "best"); step 2 pruned meanwhile: step 3. A
    fresh start, or save_best off, removes an earlier run's pointer (pruning honoured it forever)."""
    from glm_grpo_ds.lifecycle.best import BEST_RECORD, BestCheckpoint

    out = tmp_path / "run"
    root = out / checkpoint.CHECKPOINTS
    best = BestCheckpoint(out, True, True, resume_step=0)
    for step, reward in [(1, 0.3), (2, 0.5), (3, 0.4), (4, 0.6)]:
        best.consider(step, reward, fake_checkpoint(out, step, "r"))
    assert best.step == 4
    resumed = BestCheckpoint(out, True, True, resume_step=3)
    assert (resumed.step, resumed.value) == (2, 0.5) and (root / checkpoint.BEST).read_text() == "step_000002"
    assert not resumed.consider(5, 0.45, fake_checkpoint(out, 5, "r")) and resumed.step == 2
    shutil.rmtree(root / "step_000002")
    assert BestCheckpoint(out, True, True, resume_step=3).step == 3
    assert BestCheckpoint(out, True, True, resume_step=None).step is None  # a fresh start
    assert not (root / checkpoint.BEST).exists() and not (root / BEST_RECORD).exists()
    BestCheckpoint(out, True, True, resume_step=0).consider(6, 0.9, fake_checkpoint(out, 6, "r"))
    BestCheckpoint(out, False, True, resume_step=6)  # resumed with save_best off
    assert not (root / checkpoint.BEST).exists()


def test_saving_a_step_another_launch_wrote_keeps_that_one(tmp_path, monkeypatch):
    """Resumed from step 1 by its path (the documented "go back to step N"), or with another run's step_2 copied in:
    this launch's step 2 had replaced that step_2 without a word. It is kept as earlier_step_000002 (~1 when the name
    is taken), out of pruning's and the resumes' reach."""
    root = tmp_path / checkpoint.CHECKPOINTS
    fake_checkpoint(tmp_path, 1, "mine", {"id": "before", "from_step": 0})
    fake_checkpoint(tmp_path, 2, "mine", {"id": "before", "from_step": 0})
    point_latest(tmp_path, 2)
    (root / "earlier_step_000002").mkdir()  # a name taken by an earlier branch
    monkeypatch.setattr(checkpoint.ds_io, "save_ds_checkpoint", lambda engine, d: (d / "ds").mkdir())
    state = {"step": 2, "run_id": "mine", "launch": {"id": "now", "from_step": 1}}
    checkpoint.save(None, tmp_path, 2, state, rank=0, is_lora=False, total_limit=1)
    names = ["earlier_step_000002", "earlier_step_000002~1", "latest", "step_000002"]
    assert sorted(p.name for p in root.iterdir()) == names  # step_000001 pruned (the limit is 1), the branch kept
    kept = json.loads((root / "earlier_step_000002~1" / "trainer_state.json").read_text())
    assert kept["launch"]["id"] == "before"
    assert (
        json.loads((checkpoint.resolve(tmp_path, "latest") / "trainer_state.json").read_text())["launch"]["id"] == "now"
    )
