"""Where a running step is (glm_grpo_ds/observability/step_status.py): lines at most every interval on a
non-terminal stream (a clock of the test's, no sleeps) and their text, the step line restarting the interval, the
in-place status in the step bar on a terminal (log lines lifting it), nothing on other ranks or with the progress
bar off. A real run's lines: tests/integration/test_console.py."""

import io
import logging

import pytest
import torch

from glm_grpo_ds.config import ConfigError, LoggingConfig, load_config
from glm_grpo_ds.observability.metrics import Progress
from glm_grpo_ds.observability.step_status import NO_STATUS, StepStatus, for_rank
from glm_grpo_ds.rewards.registry import RewardSet
from glm_grpo_ds.runtime.log import ConsoleHandler


class Stream(io.StringIO):
    def __init__(self, tty: bool = False):
        super().__init__()
        self.tty = tty

    def isatty(self):
        return self.tty


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def lines(stream: Stream) -> list[str]:
    return stream.getvalue().splitlines()


def record(step: int) -> dict:
    return {"step": step, "reward_mean": 0.5, "kl": 0.0, "loss": 0.1, "entropy": 2.0}


def test_lines_come_at_most_every_interval_and_phase_changes_name_the_phase_before():
    stream, clock = Stream(), Clock()
    status = StepStatus(stream, interval_s=30, clock=clock)
    status.begin("step 1/100")
    status.phase("rollout", unit="tokens")
    for k in range(1, 61):  # the rollout's decode loop reports every 64 tokens, here 1 s apart
        clock.now += 1
        status.on_tokens(64 * k, 3840)
    clock.now += 5
    status.phase("decode", total=16, unit="images")  # 5 s after the last line: not yet
    clock.now += 25
    status.advance(4)
    clock.now += 40
    status.phase("reward", total=2, unit="rewards done")
    status.advance()  # at once: no line
    # nothing in the first 30 s (a quick step prints none), then a line at most every 30 s
    assert lines(stream) == [
        "grpo [step 1/100] rollout: 1920/3840 tokens, 30 s into the step",
        "grpo [step 1/100] rollout: 3840/3840 tokens, 60 s into the step",
        "grpo [step 1/100] decode: 4/16 images, 90 s into the step (rollout took 65 s)",
        "grpo [step 1/100] reward: 0/2 rewards done, 130 s into the step (decode took 65 s)",
    ]


def test_interval_zero_prints_every_change_of_the_load_and_a_step():
    stream, clock = Stream(), Clock()
    status = StepStatus(stream, interval_s=0, clock=clock)
    status.begin("load")
    status.phase("process group")
    clock.now += 41.2
    status.phase("policy")
    clock.now += 2.5
    status.idle()
    status.begin("step 1/1")
    status.phase("update", total=2, unit="micro-batches")
    clock.now += 3
    status.advance()
    assert lines(stream) == [
        "grpo [load] process group, 0.0 s into the load",
        "grpo [load] policy, 41 s into the load (process group took 41 s)",
        "grpo [step 1/1] update: 0/2 micro-batches, 0.0 s into the step",
        "grpo [step 1/1] update: 1/2 micro-batches, 3.0 s into the step",
    ]


def test_a_step_line_restarts_the_interval():
    stream, clock = Stream(), Clock()
    status = StepStatus(stream, interval_s=30, clock=clock)
    progress = Progress(total=2, initial=0, enabled=True, every=10, stream=stream, status=status)
    status.begin("step 1/2")
    status.phase("update", total=4, unit="micro-batches")
    clock.now += 31
    status.advance()
    clock.now += 20
    progress.update(record(1))  # the first step's line
    status.begin("step 2/2")
    status.phase("rollout", unit="tokens")
    clock.now += 20
    status.on_tokens(64, 128)  # 20 s after the step line: not yet
    clock.now += 10
    status.on_tokens(128, 128)
    out = lines(stream)
    assert out[0] == "grpo [step 1/2] update: 1/4 micro-batches, 31 s into the step"
    assert out[1].startswith("grpo step 1/2 reward 0.5 ")
    assert out[2:] == ["grpo [step 2/2] rollout: 128/128 tokens, 30 s into the step"]


def test_on_a_terminal_the_status_is_the_step_bars_description_in_place():
    stream, clock = Stream(tty=True), Clock()
    status = StepStatus(stream, interval_s=0, clock=clock)
    status.begin("load")
    status.phase("policy")  # before the step bar: a status line of its own
    assert "grpo [load: policy]" in stream.getvalue() and status.bar is not None
    progress = Progress(total=3, initial=0, enabled=True, stream=stream, status=status)
    assert status.bar is progress.bar  # the load's own line is gone
    status.begin("step 1/3")
    status.phase("decode", total=16, unit="images")
    assert progress.bar.desc == "grpo [step 1/3: decode 0/16 images]"
    status.advance(4)  # within the refresh interval: not redrawn
    assert progress.bar.desc == "grpo [step 1/3: decode 0/16 images]"
    clock.now += 1
    status.advance(4)
    assert progress.bar.desc == "grpo [step 1/3: decode 8/16 images]"
    progress.update(record(1))
    assert progress.bar.desc == "grpo" and progress.bar.n == 1  # between steps: the plain bar
    progress.close()
    text = stream.getvalue()
    assert "grpo [step 1/3: decode 8/16 images]" in text and "\r" in text
    assert text.count("\n") == 1  # redrawn in place on one line (the bar's close ends it), no status lines


def test_a_log_line_on_a_terminal_lifts_the_status_line_and_redraws_it_below():
    stream = Stream(tty=True)
    logger = logging.getLogger("test_step_status")
    handler = ConsoleHandler(stream)  # the console handlers of glm_grpo_ds/runtime/log.py
    logger.addHandler(handler)
    try:
        status = StepStatus(stream, clock=Clock())
        status.begin("load")
        status.phase("policy")
        logger.warning("glm-grpo: resume_from=auto: no checkpoint in out, starting fresh")
        status.idle()
    finally:
        logger.removeHandler(handler)
    text = stream.getvalue()
    # the line starts on a cleared line (not after the status), and the status comes back after it
    assert "\rglm-grpo: resume_from=auto: no checkpoint in out, starting fresh\n\rgrpo [load: policy]" in text


def test_other_ranks_and_progress_bar_off_show_nothing(capsys):
    assert for_rank(1, LoggingConfig()) is NO_STATUS
    assert for_rank(0, LoggingConfig(progress_bar=False)) is NO_STATUS
    status = for_rank(0, LoggingConfig(status_interval_s=5))
    assert isinstance(status, StepStatus) and status.interval_s == 5
    NO_STATUS.begin("step 1/1")
    NO_STATUS.phase("decode", total=4, unit="images")
    NO_STATUS.advance(4)
    NO_STATUS.on_tokens(64, 128)
    NO_STATUS.printed()
    NO_STATUS.idle()
    NO_STATUS.show_in(None)
    NO_STATUS.close()
    assert capsys.readouterr() == ("", "")


def test_status_interval_must_not_be_negative():
    base = ["model.path=/m", "data.train_file=/d.jsonl", "rewards=[{name: pixel_mse}]"]
    assert load_config(None, [*base, "logging.status_interval_s=0"]).logging.status_interval_s == 0
    with pytest.raises(ConfigError, match="logging.status_interval_s must be >= 0"):
        load_config(None, [*base, "logging.status_interval_s=-1"])


def test_reward_set_says_each_reward_done():
    rewards = RewardSet([("a", 1.0, lambda i, p, s: torch.zeros(len(p))), ("b", 1.0, lambda i, p, s: 1 / 0)])
    done = []
    values = rewards(torch.zeros(2, 3, 4, 4), ["x", "y"], [{}, {}], on_scored=done.append)
    assert done == ["a", "b"] and torch.isnan(values["b"]).all()  # a reward that raised is done too
