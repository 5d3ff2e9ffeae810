"""A checkpoint's files checked before a resume changes anything (glm_grpo_ds/lifecycle/checkpoint_files.py): the
DeepSpeed files its writing launch left, each rank's RNG file, every archive whole. Before, a copy cut short passed
`train --check`, and the resume loaded the models, set the final adapter aside and failed inside DeepSpeed."""

import json

import pytest
import torch
from run_files import write_ds_files  # noqa: E402  (tests/run_files.py)

from glm_grpo_ds.lifecycle import checkpoint
from glm_grpo_ds.lifecycle.checkpoint_files import damage, damage_line


def _checkpoint(root, step, world=2, stage=3):
    path = root / "checkpoints" / f"step_{step:06d}"
    write_ds_files(path, world, stage)
    (path / "rng").mkdir()
    for r in range(world):
        torch.save({"torch": torch.get_rng_state()}, path / "rng" / f"rank_{r}.pt")
    state = {"step": step, "run_id": "r", "world_size": world, "zero_stage": stage}
    (path / "trainer_state.json").write_text(json.dumps(state))
    return path


def test_a_whole_checkpoint_passes_at_every_stage(tmp_path):
    for stage in (0, 1, 2, 3):
        assert damage(_checkpoint(tmp_path / str(stage), 4, 2, stage), 2, stage) is None
    bf16 = _checkpoint(tmp_path / "bf16", 4, 1, 1)  # DeepSpeed's bf16 optimizer prefixes its files
    (bf16 / "ds" / "zero_pp_rank_0_mp_rank_00_optim_states.pt").rename(
        bf16 / "ds" / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"
    )
    assert damage(bf16, 1, 1) is None


@pytest.mark.parametrize(
    "remove, problem",
    [
        ("ds/zero_pp_rank_1_mp_rank_00_model_states.pt", "ds/zero_pp_rank_1_mp_rank_00_model_states.pt is missing"),
        ("ds/zero_pp_rank_0_mp_rank_00_optim_states.pt", "ds/zero_pp_rank_0_mp_rank_00_optim_states.pt is missing"),
        ("rng/rank_1.pt", "rng/rank_1.pt is missing"),
    ],
)
def test_a_missing_file_is_named(tmp_path, remove, problem):
    path = _checkpoint(tmp_path, 4)
    (path / remove).unlink()
    assert damage(path, 2, 3) == problem


def test_a_file_cut_short_is_named(tmp_path):
    path = _checkpoint(tmp_path, 4)
    optim = path / "ds" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    torch.save({"exp_avg": torch.randn(4096)}, optim)
    data = optim.read_bytes()
    optim.write_bytes(data[: len(data) // 2])  # a copy that stopped part way
    (path / "rng" / "rank_0.pt").write_bytes(b"")
    assert damage(path, 2, 3) == (
        "ds/zero_pp_rank_1_mp_rank_00_optim_states.pt, rng/rank_0.pt are cut short (not a complete archive)"
    )


def test_the_refusal_names_the_checkpoint_before_it_and_changes_nothing(tmp_path):
    earlier, damaged = _checkpoint(tmp_path, 2), _checkpoint(tmp_path, 4)
    (damaged / "ds" / "zero_pp_rank_0_mp_rank_00_model_states.pt").unlink()
    with pytest.raises(checkpoint.CheckpointError) as refused:
        checkpoint.check_compatible(damaged, 2, 3)
    assert str(refused.value) == (
        f"{damaged} is damaged: ds/zero_pp_rank_0_mp_rank_00_model_states.pt is missing; resume from the one before "
        f"it (resume_from={earlier}), or copy it again from where it came; nothing was changed"
    )
    alone = _checkpoint(tmp_path / "alone", 4)
    (alone / "adapter").mkdir()
    (alone / "ds" / "mp_rank_00_model_states.pt").touch()  # an empty file: cut at its first byte
    (alone / "ds" / "zero_pp_rank_0_mp_rank_00_model_states.pt").write_bytes(b"")
    assert damage_line(alone, 2, 3).endswith(
        f"copy it again from where it came, or start a new run from its adapter (lora.init_from={alone}/adapter); "
        "nothing was changed"
    )


def test_a_latest_that_names_no_checkpoint_names_the_newest_that_is_there(tmp_path):
    """`latest` naming a checkpoint that is gone said `resume_from .../step_000009 does not exist (...;
    resume_from=latest takes the newest)` to a user who had given resume_from=latest; an empty one said the
    checkpoints folder `is not a complete checkpoint`."""
    _checkpoint(tmp_path, 2), _checkpoint(tmp_path, 10)
    pointer = tmp_path / "checkpoints" / "latest"
    for named, what in (("step_000009", "names step_000009, which is not there"), ("", "is empty")):
        pointer.write_text(named)
        with pytest.raises(checkpoint.CheckpointError) as refused:
            checkpoint.resume_path(tmp_path, "latest")
        assert str(refused.value) == (
            f"resume_from=latest: {pointer} {what}; the newest checkpoint there is step_000010: resume_from="
            f"{tmp_path}/checkpoints/step_000010 goes on from it; nothing was changed"
        )
    pointer.write_text("step_000010")
    assert checkpoint.resume_path(tmp_path, "auto") == tmp_path / "checkpoints" / "step_000010"
