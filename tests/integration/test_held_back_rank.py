"""A held-back rank under real DeepSpeed (2 CPU ranks, gloo): every rank's watchdog reports where it is stuck, with
its stacks, and the run still finishes (glm_grpo_ds/observability/watchdog.py; its decisions are unit-tested in
tests/unit/test_watchdog.py).

A reward plugin sleeps on rank 1 at step 2: rank 1 is late in its reward, rank 0 in the gather that follows (it
waits for rank 1's rewards). Each rank's log must say so, for step 2, with its Python stacks - rank 1's showing the
sleeping reward - and the NCCL settings; once the sleep ends each says its phase ended, and the run exits 0."""

import re
import shutil

import pytest
from launching import FAST, common, launch, train_args  # noqa: E402  (tests/integration/launching.py)

SLEEP_S = 8  # rank 1's reward at step 2; the watchdog speaks after 2 s (the floor), the others' phases take < 1 s
REWARD = f"""
import os
import time

calls = 0


def held_back(images, prompts, samples):
    global calls
    calls += 1
    if os.environ.get("RANK") == "1" and calls == 2:  # step 2, rank 1 only
        time.sleep({SLEEP_S})
    return images.mean(dim=(1, 2, 3))
"""


@pytest.mark.skipif(
    shutil.which("py-spy") is not None,
    reason="py-spy on PATH: the stacks are py-spy's dump, whose format tests/unit/test_watchdog.py checks",
)
def test_a_held_back_rank_is_reported_by_every_rank_and_the_run_finishes(tiny_model_dir, data64, tmp_path):
    plugin = tmp_path / "held_back.py"
    plugin.write_text(REWARD)
    out = tmp_path / "run"
    proc = launch(
        2,
        train_args(
            *common(tiny_model_dir, data64, out, "max_steps=3", *FAST),
            f"rewards=[{{name: '{plugin}:held_back'}}]",
            # quick phases are held to the floor; factor 1 (the least) so a step-1 phase slowed by a busy machine
            # (rank 0's step-1 advantages: its wait for rank 1) lifts step 2's limit past the sleep only beyond 8 s
            "logging.watchdog_min_seconds=2",
            "logging.watchdog_factor=1",
        ),
        timeout=300,
        launcher=False,
    )
    assert proc.returncode == 0
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 3  # every step trained: nothing was stopped
    logs = {rank: (out / "logs" / f"rank_{rank}.log").read_text() for rank in (0, 1)}
    stuck = {0: "advantages", 1: "reward"}  # rank 0 waits in the gather for rank 1's rewards
    # where each rank's main thread is: rank 1 in the sleeping reward, rank 0 in the gather
    frame = {0: r'File ".*/dist\.py", line \d+ in all_gather', 1: r'File ".*/held_back\.py", line \d+ in held_back'}
    for rank, text in logs.items():
        line = re.search(
            rf"glm-grpo: watchdog: rank {rank} \(host \S+, pid \d+\) has been in {stuck[rank]} of step 2 for "
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
        assert f"glm-grpo: watchdog: rank {rank}: {stuck[rank]} of step 2 ended after" in after
        assert re.search(rf"rank {rank} \(host \S+, pid \d+\) has been in {stuck[rank]} of step 2", proc.stderr)
