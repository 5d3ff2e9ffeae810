"""A collective that timed out, or lost its peer, ends a rank with one line naming the rank(s) the others waited for,
read from the ranks' logs (glm_grpo_ds/observability/stuck.py), instead of the collective's traceback, which names no
rank (and the launcher's last line names the last rank it started, whatever failed). Real gloo ranks for the timeout;
the logs as the watchdog writes them."""

import os
import re
import time
from types import SimpleNamespace

import torch
from gloo_ranks import init_gloo, two_gloo_ranks  # noqa: E402  (tests/gloo_ranks.py)

from glm_grpo_ds.observability import stuck
from glm_grpo_ds.observability.stuck import holding_up

REPORT = (
    "2026-12-02 06:07:03,433 WARNING glm_grpo.watchdog: glm-grpo: watchdog: rank {r} (host vm, pid 22893) has been in "
    "{phase} for 11 s (5412 x its last 2.0 ms); its Python stacks follow; ..."
)
ENDED = "2026-12-02 06:07:13,433 WARNING glm_grpo.watchdog: glm-grpo: watchdog: rank {r}: {phase} ended after 21 s"


def _logs(out, texts: dict, ages: dict | None = None):
    (out / "logs").mkdir(parents=True, exist_ok=True)
    for rank, text in texts.items():
        path = out / "logs" / f"rank_{rank}.log"
        path.write_text(text + "\n")
        if ages and rank in ages:
            then = time.time() - ages[rank]
            os.utime(path, (then, then))


def test_the_rank_without_a_report_while_the_others_waited_is_the_one_that_stopped(tmp_path):
    wait = REPORT.format(r=0, phase="advantages of step 16")
    _logs(tmp_path, {0: wait, 1: "grpo step 15/40 ...", 2: wait.replace("rank 0", "rank 2")}, ages={1: 61})
    assert holding_up(tmp_path, 3) == (
        "rank 1 wrote no watchdog report (last written 61 s ago) while ranks 0, 2 waited in advantages of step 16: "
        "it stopped (killed, stopped, a node gone, or stuck in native code)"
    )


def test_a_rank_held_elsewhere_an_ended_report_and_no_reports_at_all(tmp_path):
    """All report (a reward that never returns keeps its rank's watchdog thread running): the odd phase is named."""
    held = {0: REPORT.format(r=0, phase="advantages of step 6"), 1: REPORT.format(r=1, phase="reward of step 6")}
    _logs(tmp_path / "held", held)
    _logs(tmp_path / "held", {2: REPORT.format(r=2, phase="advantages of step 6")})
    assert (
        holding_up(tmp_path / "held", 3)
        == "rank 1 in reward of step 6, while ranks 0, 2 waited in advantages of step 6"
    )
    # a slow rank that moved on (its report ended) waits no more: with no report open, the oldest log is named
    moved = {
        r: REPORT.format(r=r, phase="reward of step 6") + "\n" + ENDED.format(r=r, phase="reward of step 6")
        for r in (0, 1)
    }
    _logs(tmp_path / "moved", moved, ages={0: 5, 1: 90})
    assert holding_up(tmp_path / "moved", 2) == (
        "no rank wrote a watchdog report (logging.watchdog off?); the log written longest ago is rank 1's (90 s)"
    )
    _logs(tmp_path / "half", {0: REPORT.format(r=0, phase="advantages of step 6")})  # rank 1's log elsewhere
    assert holding_up(tmp_path / "half", 2).endswith(f"; rank 1 wrote no log in {tmp_path / 'half' / 'logs'}")


def _timed_out_rank(rank, port, out, results):
    """Rank 1 never comes to the collective (its log last written a minute ago); rank 0's gives up after 2 s."""
    init_gloo(rank, port, 2, timeout_s=2)
    if rank == 1:
        time.sleep(8)  # past rank 0's timeout; then leaves
        results.put(("rank 1", None))
        return
    cfg = SimpleNamespace(output_dir=str(out), dist_timeout_minutes=2 / 60)
    try:
        torch.distributed.all_reduce(torch.ones(3))
        results.put(("rank 0", "no error"))
    except RuntimeError as err:
        results.put(("rank 0", stuck.collective_line(err, cfg, 2, 16)))


def test_a_real_timeout_is_one_line_naming_the_rank_that_never_came(tmp_path):
    _logs(tmp_path, {0: REPORT.format(r=0, phase="advantages of step 16"), 1: "grpo step 15/40 ..."}, ages={1: 60})
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest").write_text("step_000014")
    got = dict(two_gloo_ranks(_timed_out_rank, tmp_path))
    line = got["rank 0"]
    assert line.startswith(
        "glm-grpo train: rank 0: a collective of step 16 timed out after dist_timeout_minutes=0.0333333 (Timed out "
        "waiting 2000ms for "
    ), line
    waited = (
        r": rank 1 wrote no watchdog report \(last written \d+ s ago\) while rank 0 waited in advantages of step 16"
    )
    assert re.search(waited + ": it stopped", line), line
    assert line.endswith(
        "the last checkpoint is step_000014 (checkpoints/latest): find what stopped it (its stacks: logs/rank_<r>.log; "
        "docs/troubleshooting.md#a-run-that-hangs), then resume with resume_from=latest"
    ), line
    assert "\n" not in line
