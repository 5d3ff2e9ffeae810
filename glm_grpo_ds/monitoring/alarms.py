"""Alarms on what the images become: rules over the image statistics (monitoring/image_stats.py), each checked
against the run's start, that print one line naming the statistic, its value then and now, and the step.

A rule is one string, ``STATISTIC < BOUND`` or ``STATISTIC > BOUND``, where BOUND is one of::

    0.5                 an absolute value                        near_duplicates > 0.5
    0.5 x start         a multiple of the value at the start     diversity < 0.5 x start
    start + 0.25        the start's value plus (or minus) this   dark_fraction > start + 0.25
    start - 3 spread    ... this many of the start's spreads     brightness < start - 3 spread

"start" is the first record the monitor sees: the first evaluation when the run evaluates (``eval.file``; the step-0
one with ``eval.at_start``, else the first after ``eval.steps`` steps), else the first training step; "spread" is
the standard deviation of the statistic over the start's images (over its groups for the group statistics). The
monitor checks each evaluation when there are any, else each training step. A rule fires once (its line), and its
metric ``alarm/<statistic>`` is 1 in every checked record while it holds, 0 otherwise. Imports nothing of this
package but the statistic names.

    monitor = Monitor(parse_rules(cfg.monitor.alarms), prefix="images/")
    fields, lines = monitor.check(record)   # record: {"step": ..., "images/<statistic>": ..., ...}

After the run, :func:`replay` checks the records written to disk again, with the same code and the same start,
and says per rule that fired when, at which value against which bound, and whether it still held at the end;
:func:`describe` is its one line (the end-of-run summary, ``glm-grpo check-run``, ``glm-grpo evaluate``'s
console and the model card print it).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from .image_stats import STATISTICS

PREFIX = "images/"
SPREAD = "_spread"
_NUMBER = r"[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?"
_RULE = re.compile(r"^\s*(?P<stat>[a-z_]+)\s*(?P<op>[<>])\s*(?P<bound>.+?)\s*$")
_ABSOLUTE = re.compile(rf"^(?P<sign>-?)(?P<value>{_NUMBER})$")
_RATIO = re.compile(rf"^(?P<value>{_NUMBER})\s*x\s*start$")
_OFFSET = re.compile(rf"^start\s*(?P<sign>[-+])\s*(?P<value>{_NUMBER})(?:\s*(?P<spread>spread))?$")
SYNTAX = "STATISTIC < BOUND or STATISTIC > BOUND, BOUND = N, N x start, start + N, start - N spread"
# Exit status of a run that finished and saved everything while alarms fired, with monitor.fail_on_alarm (3: non-
# finite steps, 4: an upload failed, 5: stopped by monitor.stop_on_alarm; glm_grpo_ds/train.py lists them all).
EXIT_ALARMS_FIRED = 6


class RuleError(ValueError):
    """A malformed alarm rule or an unknown statistic; the message names the rule and the fix."""


@dataclass(frozen=True)
class Rule:
    text: str
    statistic: str
    above: bool  # fires when the value is above the bound (">"), else below
    kind: str  # "absolute" | "ratio" | "offset" | "spread"
    value: float  # signed for offsets

    def bound(self, start: float, spread: float) -> float:
        if self.kind == "absolute":
            return self.value
        if self.kind == "ratio":
            return self.value * start
        return start + self.value * (spread if self.kind == "spread" else 1.0)

    def fires(self, now: float, start: float, spread: float) -> bool:
        bound = self.bound(start, spread)
        if any(math.isnan(x) for x in (now, bound)):
            return False
        return now > bound if self.above else now < bound


def parse_rule(text: str, where: str = "monitor.alarms") -> Rule:
    """One rule (see the module docstring); :class:`RuleError` names ``where`` and the fix."""
    m = _RULE.match(str(text))
    if not m:
        raise RuleError(f"{where}: {text!r} is not an alarm rule; write {SYNTAX}")
    stat, op, bound = m["stat"], m["op"], m["bound"]
    if stat not in STATISTICS:
        raise RuleError(f"{where}: {text!r}: unknown statistic {stat!r}; known: {', '.join(STATISTICS)}")
    above = op == ">"
    if a := _ABSOLUTE.match(bound):
        return Rule(text, stat, above, "absolute", float(a["sign"] + a["value"]))
    if r := _RATIO.match(bound):
        return Rule(text, stat, above, "ratio", float(r["value"]))
    if o := _OFFSET.match(bound):
        value = float(o["value"]) * (-1 if o["sign"] == "-" else 1)
        return Rule(text, stat, above, "spread" if o["spread"] else "offset", value)
    raise RuleError(f"{where}: {text!r}: cannot read the bound {bound!r}; write {SYNTAX}")


def parse_rules(texts: list[str], where: str = "monitor.alarms") -> list[Rule]:
    """Every rule, or :class:`RuleError` with one line per bad one."""
    rules, problems = [], []
    for i, text in enumerate(texts):
        try:
            rules.append(parse_rule(text, f"{where}[{i}]"))
        except RuleError as err:
            problems.append(str(err))
    if problems:
        raise RuleError("\n".join(problems))
    return rules


class Monitor:
    """Checks records against ``rules`` (see the module docstring): a record's statistic is ``prefix +
    statistic`` (``eval/images/`` in eval.jsonl). ``start``: the start record when it is known already (a
    resumed run reads it back from its metrics file); else the first checked record."""

    def __init__(self, rules: list[Rule], prefix: str = PREFIX, start: dict | None = None):
        self.rules, self.prefix, self.start = rules, prefix, start
        self.fired: dict[str, int] = {}  # rule text -> the step it first fired at
        self.holding: set[str] = set()

    def verdicts(self, record: dict) -> list[tuple[Rule, float, float, float, bool]]:
        """``(rule, now, start, spread, fires)`` for each rule whose statistic ``record`` and the start both hold
        (the first record checked is the start when none is known yet)."""
        if self.start is None:
            self.start = record
        out = []
        for rule in self.rules:
            key = self.prefix + rule.statistic
            now, start = record.get(key), self.start.get(key)
            if now is None or start is None:
                continue
            spread = self.start.get(key + SPREAD)
            spread = float("nan") if spread is None else spread
            out.append((rule, now, start, spread, rule.fires(now, start, spread)))
        return out

    def check(self, record: dict) -> tuple[dict, list[str]]:
        """``(fields, lines)``: ``alarm/<statistic>`` 0/1 for the record, and a console line for each rule
        that fires now for the first time."""
        if not self.rules:
            return {}, []
        fields, lines = {}, []
        self.holding = set()
        for rule, now, start, spread, fires in self.verdicts(record):
            fields[f"alarm/{rule.statistic}"] = max(fields.get(f"alarm/{rule.statistic}", 0), int(fires))
            if fires:
                self.holding.add(rule.text)
            if fires and rule.text not in self.fired:
                self.fired[rule.text] = record["step"]
                lines.append(self.line(rule, record["step"], now, start, spread))
        return fields, lines

    def line(self, rule: Rule, step: int, now: float, start: float, spread: float) -> str:
        at = f"step {self.start['step']}"
        then = f"{start:.4g}" + (f" (spread {spread:.3g})" if rule.kind == "spread" else "")
        return (
            f"glm-grpo: alarm at step {step}: {rule.statistic} is {now:.4g}, was {then} at {at} "
            f"(rule '{rule.text}', bound {rule.bound(start, spread):.4g}); look at the samples (samples/) before "
            "trusting the reward"
        )


def replay(rules: list[Rule], records: list[dict], prefix: str = PREFIX) -> list[dict]:
    """What the monitor saw in ``records`` (the checked records in order, the first being the start, as the
    trainer's monitor takes it, also after a resume): per rule that fired, in the order of ``rules``,
    ``{"statistic", "rule", "first_step", "value" and "bound" (at that step), "start", "start_step", "steps"
    (every checked step it held at), "holding_at_end"}``."""
    monitor = Monitor(rules, prefix, records[0] if records else None)
    fired: dict[str, dict] = {}
    for record in records:
        for rule, now, start, spread, fires in monitor.verdicts(record):
            if not fires:
                continue
            entry = fired.setdefault(
                rule.text,
                {
                    "statistic": rule.statistic,
                    "rule": rule.text,
                    "first_step": record["step"],
                    "value": now,
                    "bound": rule.bound(start, spread),
                    "start": start,
                    "start_step": monitor.start["step"],
                    "steps": [],
                },
            )
            entry["steps"].append(record["step"])
    last = records[-1]["step"] if records else None
    return [
        {**fired[rule.text], "holding_at_end": fired[rule.text]["steps"][-1] == last}
        for rule in rules
        if rule.text in fired
    ]


def _steps(steps: list[int]) -> str:
    if len(steps) == 1:
        return f"step {steps[0]}"
    if len(steps) <= 6:
        return "steps " + ", ".join(map(str, steps))
    return f"steps {steps[0]}, {steps[1]}, ..., {steps[-2]}, {steps[-1]} ({len(steps)} checks)"


def describe(alarm: dict) -> str:
    """One line for one entry of :func:`replay`: the rule, where it first fired with the value against the bound
    and the start, the steps it held at, and whether it still held at the end."""
    end = "still holding at the end" if alarm["holding_at_end"] else "cleared by the end"
    return (
        f"'{alarm['rule']}' fired at step {alarm['first_step']}: {alarm['statistic']} {alarm['value']:.4g} vs bound "
        f"{alarm['bound']:.4g} (start {alarm['start']:.4g} at step {alarm['start_step']}); held at "
        f"{_steps(alarm['steps'])}, {end}"
    )


def alarm_failure(fired: list[dict], fail_on_alarm: bool) -> bool:
    """Whether a finished run ends with :data:`EXIT_ALARMS_FIRED`: ``fail_on_alarm`` (monitor.fail_on_alarm) and
    any rule fired (``fired``: :func:`replay`'s list), at any step, whether or not it still held at the end."""
    return fail_on_alarm and bool(fired)
