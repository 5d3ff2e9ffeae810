"""``log.fatal``, the run's final error line: rank 0 prints it; the other ranks print nothing and wait
``FATAL_GRACE_S`` before they exit, so the deepspeed launcher, which ends the job at the first non-zero exit it
sees, cannot take rank 0's line with it (tests/integration/test_robustness.py runs it under the launcher). A failure
one rank met alone (``every_rank``) is printed by that rank, which does not wait: its exit is the one the launcher
must report, the others wait instead (ds/dist.py ``peer_lost``)."""

from glm_grpo_ds.runtime import log


def test_rank_0_prints_the_line_and_the_other_ranks_wait_silently(monkeypatch, capsys):
    slept = []
    monkeypatch.setattr(log.time, "sleep", slept.append)
    monkeypatch.setattr(log, "_rank", 0)
    log.fatal("glm-grpo train: rewards[0].name: unknown reward 'pixel_mes'")
    assert capsys.readouterr().err == "glm-grpo train: rewards[0].name: unknown reward 'pixel_mes'\n" and slept == []
    monkeypatch.setattr(log, "_rank", 1)
    log.fatal("glm-grpo train: rewards[0].name: unknown reward 'pixel_mes'")
    assert capsys.readouterr().err == "" and slept == [log.FATAL_GRACE_S] and log.FATAL_GRACE_S >= 2


def test_an_input_error_met_mid_run_is_printed_by_the_rank_that_met_it(monkeypatch, capsys):
    """A prompt file that changed under rank 3 alone: its line went to logs/rank_3.log only, the console said nothing
    while the other ranks waited in their next collective (train.py passes every_rank once training started)."""
    import socket

    slept = []
    monkeypatch.setattr(log.time, "sleep", slept.append)
    monkeypatch.setattr(log, "_rank", 3)
    log.fatal("glm-grpo train: p.txt changed while the run was reading it", every_rank=True)
    assert capsys.readouterr().err == f"[rank 3, {socket.gethostname()}] glm-grpo train: p.txt changed while the " + (
        "run was reading it\n"
    )
    assert slept == []  # its exit first: the launcher reports its status (2), not a waiting peer's
