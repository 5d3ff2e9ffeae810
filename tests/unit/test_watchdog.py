"""The per-rank watchdog (glm_grpo_ds/observability/watchdog.py): when a phase is late (the floor at its first
occurrence, factor x its last duration after, never past half the collective timeout), that it reports once per
occurrence and says when a reported phase ends, what the report holds (the line, every thread's stack, the NCCL
settings), py-spy's dump or faulthandler's when py-spy fails, the thread, the step status it listens to, the config.
A clock of the test's, no sleeps. Two ranks under DeepSpeed with one held back:
tests/integration/test_held_back_rank.py."""

import os
import threading

import pytest

from glm_grpo_ds.config import LoggingConfig
from glm_grpo_ds.observability import watchdog as wd
from glm_grpo_ds.observability.watchdog import NCCL_SETTINGS, NO_WATCHDOG, Watchdog, for_run, python_stacks, watched
from glm_grpo_ds.runtime import log


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def watchdog(factor=5.0, min_seconds=10.0, timeout_s=None, reports=None):
    clock = Clock()
    dog = Watchdog(factor, min_seconds, rank=1, timeout_s=timeout_s, clock=clock, report=reports, host="node-b", pid=7)
    return dog, clock


def ran(dog, clock, name, seconds):
    """Phase ``name`` ran ``seconds`` and ended (the next phase starts)."""
    dog.phase(name)
    clock.now += seconds
    dog.phase("next")


def test_first_occurrence_waits_for_the_floor_then_reports_once():
    dog, clock = watchdog(min_seconds=10)
    dog.begin(1)
    dog.phase("rollout")
    clock.now += 9.9
    assert dog.due() is None
    clock.now += 0.1
    alarm = dog.due()
    assert (alarm.phase, alarm.step, alarm.last, alarm.limit) == ("rollout", 1, None, 10)
    assert alarm.elapsed == pytest.approx(10)
    clock.now += 100
    assert dog.due() is None  # once per occurrence


def test_later_occurrences_are_held_to_factor_times_the_last():
    dog, clock = watchdog(factor=5, min_seconds=1)
    dog.begin(1)
    ran(dog, clock, "decode", 4.0)
    dog.begin(2)
    dog.phase("decode")
    clock.now += 19.9  # the floor (1 s) is long past, 5 x 4 s is not
    assert dog.due() is None
    clock.now += 0.1
    alarm = dog.due()
    assert (alarm.phase, alarm.step, alarm.last, alarm.limit) == ("decode", 2, 4.0, 20.0)
    assert dog.limit("rollout") == 1  # another phase: its own expectation (none yet: the floor)


def test_the_floor_holds_for_quick_phases():
    dog, clock = watchdog(factor=5, min_seconds=3)
    ran(dog, clock, "advantages", 0.01)
    assert dog.limit("advantages") == 3
    dog.phase("advantages")
    clock.now += 2.9
    assert dog.due() is None
    clock.now += 0.2
    assert dog.due().limit == 3


def test_the_limit_stays_under_half_the_collective_timeout():
    dog, clock = watchdog(factor=5, min_seconds=10, timeout_s=60)
    ran(dog, clock, "update", 20.0)  # 5 x 20 s = 100 s: past the 60 s timeout
    assert dog.limit("update") == 30
    assert watchdog(min_seconds=100, timeout_s=60)[0].limit("x") == 30  # the floor too
    dog.phase("update")
    clock.now += 29
    assert dog.due() is None
    clock.now += 1
    assert dog.due().limit == 30


def test_a_reported_occurrence_does_not_raise_a_known_pace_and_its_end_is_told():
    dog, clock = watchdog(factor=5, min_seconds=1)
    dog.begin(1)
    ran(dog, clock, "reward", 2.0)
    dog.begin(2)
    dog.phase("reward")
    clock.now += 10
    assert dog.due() is not None
    clock.now += 50  # it took a minute, then ended
    dog.phase("advantages")
    assert dog.last["reward"] == 2.0  # the slow one does not raise the next limit to 5 x 60 s
    (ended,) = dog.ended()
    assert (ended.phase, ended.step, ended.seconds) == ("reward", 2, 60)
    assert dog.ended() == []
    dog.begin(3)
    dog.phase("reward")  # a later slow occurrence reports again, at the normal pace's limit
    clock.now += 10
    assert dog.due().step == 3


def test_a_phase_always_past_the_floor_is_reported_at_its_first_occurrence_only():
    dog, clock = watchdog(factor=5, min_seconds=10)
    dog.phase("checkpoint save")
    clock.now += 10
    assert dog.due() is not None
    clock.now += 10  # 20 s: its pace, without a normal occurrence to go by
    dog.phase("stop check")
    assert dog.last["checkpoint save"] == 20
    dog.phase("checkpoint save")
    clock.now += 99
    assert dog.due() is None  # 5 x 20 s
    clock.now += 1
    assert dog.due().last == 20


def test_idle_and_a_new_step_end_the_phase():
    dog, clock = watchdog(min_seconds=1)
    dog.phase("record")
    dog.idle()
    clock.now += 100
    assert dog.due() is None and dog.last["record"] == 0
    dog.phase("stop check")
    clock.now += 0.5
    dog.begin(5)
    clock.now += 100
    assert dog.due() is None and dog.last["stop check"] == 0.5


def test_the_report_line_stacks_and_nccl_settings():
    reports = []
    dog, clock = watchdog(factor=5, min_seconds=1, timeout_s=3600, reports=reports.append)
    dog.begin(1)
    ran(dog, clock, "reward", 2.0)
    dog.begin(2)
    dog.phase("reward")
    clock.now += 5
    dog.check()
    assert reports == []  # not late yet: nothing said
    clock.now += 7
    dog.check()
    dog.check()
    (report,) = reports  # once
    first, *stacks, last = report.splitlines()
    assert first.startswith(
        "glm-grpo: watchdog: rank 1 (host node-b, pid 7) has been in reward of step 2 for 12 s (6.0 x its last 2.0 s); "
        "its Python stacks follow; "
    )
    assert "dist_timeout_minutes=60" in first
    assert stacks[0].startswith("threads: ") and f"{threading.main_thread().ident:#018x} MainThread" in stacks[0]
    # this test's own frame, in faulthandler's words (no py-spy on this machine's PATH, or it would be its dump)
    assert any("test_the_report_line_stacks_and_nccl_settings" in line for line in stacks)
    assert f"thread {threading.main_thread().ident:#018x} (most recent call first):" in report  # ids match the list
    assert last.startswith(f"glm-grpo: watchdog: to see the collectives, rerun with {NCCL_SETTINGS} on every rank")
    assert "dist_timeout_minutes (e.g. 15)" in last
    dog.phase("advantages")
    dog.check()
    assert reports[1] == "glm-grpo: watchdog: rank 1: reward of step 2 ended after 12 s (reported above)"


def test_a_first_occurrence_names_the_floor():
    dog, clock = watchdog(min_seconds=300)
    dog.begin(4)
    dog.phase("checkpoint save")
    clock.now += 301
    line = dog.alarm_line(dog.due())
    assert "has been in checkpoint save of step 4 for 301 s (its first on this rank; the floor is " in line
    assert "logging.watchdog_min_seconds=300)" in line
    dog, clock = watchdog(min_seconds=300, timeout_s=120)  # dist_timeout_minutes=2: its cap comes first
    dog.phase("rollout")
    clock.now += 60
    assert "(its first on this rank; the limit is half of dist_timeout_minutes=2)" in dog.alarm_line(dog.due())


def _fake_py_spy(tmp_path, monkeypatch, body: str) -> None:
    script = tmp_path / "py-spy"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


def test_py_spy_dump_when_it_works(tmp_path, monkeypatch):
    _fake_py_spy(tmp_path, monkeypatch, 'echo "Thread 42 (idle): MainThread"; echo "  $1 $2 $3 $4"')
    dump = python_stacks(1234)
    assert dump == "py-spy dump --native --pid 1234:\nThread 42 (idle): MainThread\n  dump --native --pid 1234\n"


def test_faulthandler_when_py_spy_fails(tmp_path, monkeypatch):
    _fake_py_spy(tmp_path, monkeypatch, 'echo "Error: Permission denied (os error 13)" >&2; exit 1')
    stacks = python_stacks(os.getpid())
    failed = "(py-spy dump failed: Error: Permission denied (os error 13); Python's own dump instead)\n"
    assert stacks.startswith(failed)
    assert "test_faulthandler_when_py_spy_fails" in stacks


def test_the_thread_reports_a_late_phase_and_stops():
    said = threading.Event()
    reports = []

    def report(text):
        reports.append(text)
        said.set()

    dog, clock = watchdog(min_seconds=0.1, reports=report)
    assert dog.poll_s == 0.05
    with dog:  # the thread runs inside
        dog.begin(3)
        dog.phase("update")
        clock.now += 1  # the thread's next look finds it late
        assert said.wait(10)
    assert not any(t.name == "glm-grpo-watchdog" for t in threading.enumerate())
    assert len(reports) == 1 and "has been in update of step 3" in reports[0]


def test_a_reported_phase_that_ends_as_the_watchdog_closes_still_gets_its_line():
    """The thread stopped without a last look: a slow final save reported, then ended and closed within one poll,
    left "has been in final save" with no "ended after" (the docs promise the sequel)."""
    reports = []
    dog, clock = watchdog(min_seconds=0.1, reports=reports.append)
    dog.poll_s = 3600  # the thread's next look would come long after the close
    dog.begin(None)
    dog.phase("final save")
    clock.now += 1
    dog.check()  # reported
    assert len(reports) == 1
    dog.start()
    clock.now += 2
    dog.idle()  # ended
    dog.close()
    assert (
        len(reports) == 2 and reports[1] == "glm-grpo: watchdog: rank 1: final save ended after 3.0 s (reported above)"
    )


def test_the_step_status_phases_reach_it_with_their_prefix():
    class Status:
        in_place = False

        def __init__(self):
            self.calls = []

        def phase(self, name, total=None, unit=""):
            self.calls.append(("phase", name, total, unit))

        def advance(self, n=1):
            self.calls.append(("advance", n))

    dog, clock = watchdog()
    status = Status()
    train, evaluation = watched(status, dog), watched(status, dog, "eval ")
    train.phase("decode", 16, "images")
    assert dog.running.name == "decode"
    evaluation.phase("rollout", unit="tokens")
    evaluation.advance(2)
    assert dog.running.name == "eval rollout"
    assert status.calls == [("phase", "decode", 16, "images"), ("phase", "rollout", None, "tokens"), ("advance", 2)]
    assert watched(status, NO_WATCHDOG) is status  # off: the status alone, not a layer more


def test_the_config_switches_it_and_sets_its_limits():
    assert for_run(LoggingConfig(watchdog=False), 0, 60) is NO_WATCHDOG
    dog = for_run(LoggingConfig(watchdog_factor=3, watchdog_min_seconds=20), 2, 0.5)
    assert (dog.factor, dog.min_seconds, dog.rank, dog.timeout_s) == (3, 20, 2, 30)
    assert dog.limit("rollout") == 15  # half of the 30 s timeout, under the 20 s floor
    assert LoggingConfig().problems() == []
    assert LoggingConfig(watchdog_factor=0.5, watchdog_min_seconds=0).problems() == [
        "logging.watchdog_factor must be >= 1 (x a phase's last duration), got 0.5",
        "logging.watchdog_min_seconds must be > 0 seconds, got 0",
    ]


def test_every_rank_reports_on_stderr(capsys):
    """Rank 1's console shows errors only, but a watchdog report is for every rank (log.py's all_ranks)."""
    log.setup("info", 1)  # its handlers take the captured stderr
    try:
        log.warning("a rank-0 warning")  # not shown by rank 1
        wd._log("glm-grpo: watchdog: rank 1 ... has been in reward of step 2")
    finally:
        log.setup("info", log.env_rank())
    assert capsys.readouterr().err == "glm-grpo: watchdog: rank 1 ... has been in reward of step 2\n"
