"""tests/durations_budget.py: a test over the threshold is named at the end of the run, one under it is not."""

pytest_plugins = ["pytester"]


def test_a_test_over_the_threshold_is_named_with_its_seconds(pytester, monkeypatch):
    import durations_budget

    monkeypatch.setattr(durations_budget, "SLOW_TEST_S", 1.0)  # far above a quick test, stalled or not
    pytester.makepyfile(
        test_inner="""
import time

def test_slow():
    time.sleep(1.2)

def test_quick():
    pass
"""
    )
    result = pytester.runpytest_inprocess("-p", "durations_budget", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    out = result.stdout.str()
    assert "1 test(s) over 1 s (docs/testing.md, the time budget)" in out
    assert "test_inner.py::test_slow" in out and "test_inner.py::test_quick" not in out
