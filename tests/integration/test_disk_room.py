"""The real trainer on a real full disk (a tmpfs, where this machine lets a test mount one; the logic on any machine:
tests/unit/test_disk_space.py): a run that has no room for its first checkpoint stops before it, exit 7."""

from launching import FAST, common, run_train  # noqa: E402  (tests/integration/launching.py)

from glm_grpo_ds.lifecycle import disk_space
from glm_grpo_ds.lifecycle.disk_space import EXIT_DISK


def test_a_run_on_a_disk_without_room_stops_before_its_first_checkpoint(small_disk, tiny_model_dir, data64):
    """The real trainer on a 1 MiB tmpfs: the first checkpoint (its plan's size, + 256 MiB) does not fit, so the run
    stops there, exit 7, its one line on stderr, and no checkpoint directory was made."""
    out = small_disk / "run"
    proc = run_train(*common(tiny_model_dir, data64, out, "max_steps=2", "save_steps=1", *FAST))
    assert proc.returncode == EXIT_DISK, proc.stderr[-2000:]
    ours = [line for line in proc.stderr.splitlines() if line.startswith("glm-grpo train:")]
    assert len(ours) == 1 and ours[0].startswith("glm-grpo train: stopped before writing checkpoint step_000001")
    assert "the run has no checkpoint yet" in ours[0] and not (out / "checkpoints").exists()
    assert disk_space.SLACK_BYTES > 2**20  # why the first checkpoint cannot fit on 1 MiB
