"""A held-back rank under real DeepSpeed (2 CPU ranks, gloo): every rank's watchdog reports where it is stuck, with
its stacks, and the run still finishes (glm_grpo_ds/observability/watchdog.py; its decisions are unit-tested in
tests/unit/test_watchdog.py).

A reward plugin holds rank 1 back at step 2 until both ranks' watchdogs have reported (at most CAP_S): rank 1 is late
in its reward, rank 0 in the gather that follows (it waits for rank 1's rewards). Each rank's log must say so, for step
2, with its Python stacks - rank 1's showing the waiting reward - and the NCCL settings; once the reward returns each
says its phase ended, and the run exits 0."""

import re
import shutil

import pytest
from launching import FAST, common, launch, train_args  # noqa: E402  (tests/integration/launching.py)

CAP_S = 120  # the longest rank 1's reward waits for both reports (then the assertions below say which is missing)
STUCK = {0: "advantages", 1: "reward"}  # rank 0 waits in the gather for rank 1's rewards
# rank 1's reward at step 2 returns once both ranks' logs hold their whole watchdog report of step 2 (its line, the
# stacks, the NCCL hint after them: one record, written and flushed at once), not after a fixed sleep: a busy machine
# that slowed step 1 lifts step 2's limits (factor x the last duration), and a sleep shorter than them raced it
REWARD = """
import os
import time
from pathlib import Path

LOGS = Path({logs!r})
STUCK = {stuck!r}
calls = 0


def reported():
    for rank, phase in STUCK.items():
        path = LOGS / f"rank_{{rank}}.log"
        text = path.read_text() if path.exists() else ""
        at = text.find(f"has been in {{phase}} of step 2 for ")
        if at < 0 or "to see the collectives, rerun with" not in text[at:]:
            return False
    return True


def held_back(images, prompts, samples):
    global calls
    calls += 1
    if os.environ.get("RANK") == "1" and calls == 2:  # step 2, rank 1 only
        deadline = time.monotonic() + {cap}
        while not reported() and time.monotonic() < deadline:
            time.sleep(0.1)
    return images.mean(dim=(1, 2, 3))
"""


@pytest.mark.skipif(
    shutil.which("py-spy") is not None,
    reason="py-spy on PATH: the stacks are py-spy's dump, whose format tests/unit/test_watchdog.py checks",
)
def test_a_held_back_rank_is_reported_by_every_rank_and_the_run_finishes(tiny_model_dir, data64, tmp_path):
    plugin = tmp_path / "held_back.py"
    out = tmp_path / "run"
    plugin.write_text(REWARD.format(logs=str(out / "logs"), stuck=STUCK, cap=CAP_S))
    proc = launch(
        2,
        train_args(
            *common(tiny_model_dir, data64, out, "max_steps=3", *FAST),
            f"rewards=[{{name: '{plugin}:held_back'}}]",
            # quick phases are held to the floor; factor 1 (the least): a step-1 phase slowed by a busy machine (rank
            # 0's step-1 advantages: its wait for rank 1) lifts step 2's limit, and rank 1's wait, no more than that
            "logging.watchdog_min_seconds=2",
            "logging.watchdog_factor=1",
        ),
        timeout=300,
        launcher=False,
    )
    assert proc.returncode == 0
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 3  # every step trained: nothing was stopped
    logs = {rank: (out / "logs" / f"rank_{rank}.log").read_text() for rank in (0, 1)}
    # where each rank's main thread is: rank 1 in the waiting reward, rank 0 in the gather
    frame = {0: r'File ".*/dist\.py", line \d+ in all_gather', 1: r'File ".*/held_back\.py", line \d+ in held_back'}
    for rank, text in logs.items():
        line = re.search(
            rf"glm-grpo: watchdog: rank {rank} \(host \S+, pid \d+\) has been in {STUCK[rank]} of step 2 for "
            rf"[\d.]+ s \([\d.]+ x its last [\d.]+ m?s\); its Python stacks follow; .*",
            text,
        )
        assert line, (rank, text[-3000:])
        after = text[line.end() :]
        main = re.match(r"\nthreads: .*?(0x[0-9a-f]{16}) MainThread.*glm-grpo-watchdog", after)
        assert main, after[:500]
        # faulthandler's dump of every thread, the main thread's block among them
        block = after[after.index(f"hread {main.group(1)} (most recent call first):") :].split("\n\n")[0]
        assert re.search(frame[rank], block), block
        assert "glm-grpo: watchdog: to see the collectives, rerun with NCCL_DEBUG=INFO" in after
        assert f"glm-grpo: watchdog: rank {rank}: {STUCK[rank]} of step 2 ended after" in after
        assert re.search(rf"rank {rank} \(host \S+, pid \d+\) has been in {STUCK[rank]} of step 2", proc.stderr)
