"""Room on output_dir's disk (glm_grpo_ds/lifecycle/disk_space.py, the figures: glm_grpo_ds/memory/disk.py): a
checkpoint that would not fit stops every rank before anything is written (exit 7); a write that meets a full file
system is one line (exit 7), any other write error passes as it is; the plan's figures by hand. The checkpoints the
plan is compared with on real runs: tests/integration/test_reshape_resume.py; a real full disk: the tmpfs tests below
(where this machine lets a test mount one)."""

import json
from pathlib import Path

import pytest
from gloo_ranks import init_gloo, two_gloo_ranks  # noqa: E402  (tests/gloo_ranks.py)

from glm_grpo_ds.config import TrainConfig, load_config
from glm_grpo_ds.lifecycle import disk_space
from glm_grpo_ds.lifecycle.disk_space import EXIT_DISK, DiskFull, DiskRoom, full_disk
from glm_grpo_ds.memory.basis import EstimateConfig
from glm_grpo_ds.memory.plan import plan

DATA = {"source": "prompts.jsonl", "rows": 8, "sha256": "a"}


def _tree(root: Path) -> list:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


class _Order:  # the prompt order's state, as RunLife.save_checkpoint records it (not what is tested here)
    def state(self):
        return {"epoch": 0, "position": 0}


def _saving_rank(rank, port, out, results):
    """One of two gloo ranks saving checkpoint 4 of a run whose plan says a checkpoint takes 1 PB: each puts (rank,
    the exit status and line it stopped with, or what it raised)."""
    from glm_grpo_ds.lifecycle.preempt import Stopped
    from glm_grpo_ds.lifecycle.run import RunLife, Start
    from glm_grpo_ds.runtime import log

    log.FATAL_GRACE_S = 0
    init_gloo(rank, port, 2)
    life = RunLife(TrainConfig(), out, Start(), rank, 2, 2, DATA, publisher=None, later=None)
    try:
        life.save_checkpoint(engine=None, prompt_order=_Order(), step=4, skipped_steps=0)
        results.put((rank, None, "saved"))
    except Stopped as stop:
        results.put((rank, stop.exit_code, str(stop)))
    except Exception as err:  # noqa: BLE001 - reported to the test, which fails on it
        results.put((rank, None, f"{type(err).__name__}: {err}"))


def test_a_checkpoint_that_does_not_fit_stops_every_rank_before_anything_is_written(tmp_path):
    """Rank 0 reads the free space, both ranks stop with exit 7 (rank 0's line names the room and the checkpoint to
    resume from); output_dir is as it was: no step_000004.tmp, latest still step_000002."""
    (tmp_path / "checkpoints" / "step_000002").mkdir(parents=True)
    (tmp_path / "checkpoints" / "latest").write_text("step_000002")
    (tmp_path / "memory_plan.json").write_text(json.dumps({"disk": {"checkpoint_bytes": 10**15, "run_bytes": 10**16}}))
    before = _tree(tmp_path)
    got = sorted(two_gloo_ranks(_saving_rank, tmp_path))
    assert [(rank, code) for rank, code, _ in got] == [(0, EXIT_DISK), (1, EXIT_DISK)], got
    line = got[0][2]
    assert line.startswith(f"glm-grpo train: stopped before writing checkpoint step_000004: {tmp_path}'s file system")
    assert "it takes ~931,322.6 GiB" in line  # 10**15 bytes
    assert "the last checkpoint is step_000002 (checkpoints/latest)" in line and "resume_from=latest" in line
    assert "\n" not in line and _tree(tmp_path) == before


def test_a_write_error_is_the_disks_line_only_when_it_says_the_disk_is_full(tmp_path):
    """ENOSPC, or a quota's EDQUOT behind another error (its cause), becomes DiskFull, exit 7, naming what was
    written and how to go on; a permission error, or a CUDA error, on this disk with room passes as it was."""
    import errno

    room = DiskRoom(tmp_path, 0)
    with pytest.raises(DiskFull) as full, room.writing("checkpoint step_000001", None):
        raise OSError(errno.ENOSPC, "No space left on device")
    assert full.value.exit_code == EXIT_DISK == 7
    line = str(full.value)
    assert line.startswith(f"writing checkpoint step_000001 into {tmp_path} failed with ") and "\n" not in line
    assert line.endswith("the run has no checkpoint yet: free space (save_total_limit keeps fewer checkpoints), then "
                         "launch it again")  # fmt: skip
    with pytest.raises(DiskFull), room.writing("final_adapter/", None, final=True):
        try:
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
        except OSError as quota:
            raise RuntimeError("saving the adapter failed") from quota
    for err in (PermissionError(errno.EACCES, "Permission denied"), RuntimeError("CUDA error: out of memory")):
        assert full_disk(err, "checkpoint step_000001", tmp_path) is None
        with pytest.raises(type(err)), room.writing("checkpoint step_000001", None):
            raise err


def test_the_least_room_is_the_first_checkpoint_or_one_and_the_final_weights():
    """train --check refuses below it: the first checkpoint with the trainer's margins (+10 %, +256 MiB), or at the
    end one checkpoint and the final weights (+5 %); a run that saves no checkpoint needs the final weights only."""
    mib = 2**20
    disk = {"checkpoint_bytes": 100 * mib, "final_bytes": 400 * mib, "checkpoints_kept": 3, "run_bytes": 0}
    assert disk_space.least_room(disk) == max(110 * mib + 256 * mib, 100 * mib + 420 * mib) == 520 * mib
    assert disk_space.least_room({**disk, "final_bytes": 10 * mib}) == 366 * mib
    assert disk_space.least_room({**disk, "checkpoints_kept": 0}) == 420 * mib


def test_the_plan_counts_each_part_of_a_checkpoint_by_hand(tiny_model_dir):
    """memory/disk.py on the tiny model in fp32: LoRA at ZeRO-2 with torch AdamW on 2 ranks is each rank's fp32 master
    and two moments of its half (+ the step counter), the adapter in DeepSpeed's model states and in adapter/, the
    fixed files and one RNG file a rank; ZeRO-3 writes a model-states file a rank, without the parameters; full
    fine-tuning's final_model/ is the whole AR. save_total_limit 2 of 5 saves: 3 at once (one being written); 0
    keeps all 5."""
    from glm_grpo_ds.ds.ds_config import read_ds_config
    from glm_grpo_ds.memory.disk import FINAL_FIXED_BYTES, FIXED_BYTES, RNG_BYTES, ZERO3_STATES_BYTES
    from glm_grpo_ds.memory.sizes import model_sizes

    root = Path(__file__).resolve().parents[2]
    base = [f"model.path={tiny_model_dir}", "data.train_file=x", "optimizer.name=adamw", "max_steps=10", "save_steps=2"]

    def disk(ds, *more):
        cfg = load_config(str(root / "launch/configs/tiny_cpu.yaml"), [*base, *more])
        est = EstimateConfig(num_gpus=2, device="cpu")
        return plan(cfg, read_ds_config(str(root / "ds_configs" / ds)), est)["disk"], model_sizes(cfg)

    got, sizes = disk("zero2.json", "save_total_limit=2")
    t, half = sizes.trainable, -(-sizes.trainable // 2)
    optimizer = 2 * (4 * half + 8 * half + 4)
    assert got["checkpoint_bytes"] == optimizer + 4 * t + 4 * t + FIXED_BYTES + 2 * RNG_BYTES
    assert got["final_bytes"] == 4 * t + FINAL_FIXED_BYTES
    assert got["checkpoints_kept"] == 3 and got["run_bytes"] == 3 * got["checkpoint_bytes"] + got["final_bytes"]
    zero3 = disk("zero3.json", "save_total_limit=2")[0]["checkpoint_bytes"]
    assert zero3 == optimizer + 2 * ZERO3_STATES_BYTES + 4 * t + FIXED_BYTES + 2 * RNG_BYTES
    assert disk("zero2.json", "save_total_limit=0")[0]["checkpoints_kept"] == 5
    full, sizes = disk("zero2.json", "lora=null", "rollout.fuse_lora=false")
    assert full["final_bytes"] == 4 * sum(sizes.ar_base) + FINAL_FIXED_BYTES and sizes.lora == []


def test_a_write_that_fills_the_disk_is_one_line_with_exit_7(small_disk):
    """torch.save of 4 MiB into a real 1 MiB file system raises torch's writer error ("unexpected pos ..." or
    "file write failed"); inside DiskRoom.writing it becomes DiskFull: exit status 7 and a line naming the folder."""
    import torch

    room = DiskRoom(small_disk, 0)
    with pytest.raises(DiskFull) as full, room.writing("checkpoint step_000001", None):
        torch.save(torch.zeros(2**20), small_disk / "state.pt")
    assert full.value.exit_code == EXIT_DISK == 7
    line = str(full.value)
    assert line.startswith(f"writing checkpoint step_000001 into {small_disk} failed with ")
    assert "left on its file system (RuntimeError: " in line
    assert "\n" not in line and line.endswith("then launch it again")  # no checkpoint in that folder
