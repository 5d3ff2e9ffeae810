"""The suite's time budget, seen in its output (docs/testing.md, "The time budget"): `make test` within 20 minutes on
the 2-core CI machine. Every test whose setup + call + teardown takes longer than :data:`SLOW_TEST_S` is named at the
end of the run with its seconds, so a new slow test shows at once; those that must be that long are listed in
docs/testing.md with what they prove. A module's shared fixture counts in its first test's setup.

tests/conftest.py registers the hook; ``GLM_GRPO_SLOW_TEST_S`` sets another threshold (seconds)."""

import os

SLOW_TEST_S = float(os.environ.get("GLM_GRPO_SLOW_TEST_S", "60"))


def pytest_terminal_summary(terminalreporter):
    seconds: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) in ("setup", "call", "teardown"):
                seconds[report.nodeid] = seconds.get(report.nodeid, 0.0) + report.duration
    slow = sorted(((s, node) for node, s in seconds.items() if s > SLOW_TEST_S), reverse=True)
    if slow:
        terminalreporter.write_sep(
            "-", f"{len(slow)} test(s) over {SLOW_TEST_S:g} s (docs/testing.md, the time budget)"
        )
        for s, node in slow:
            terminalreporter.write_line(f"{s:7.1f} s  {node}")
