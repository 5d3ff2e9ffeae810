"""runtime/capture_gate.py: shared work runs side by side, a capture alone; a waiting capture holds back new shared
work (so back-to-back DiT forwards cannot starve it), a nested hold on one thread does not wait for itself, and an
error inside either releases the gate. Events, not sleeps, order the threads; each wait has a timeout."""

import threading

import pytest

from glm_grpo_ds.runtime.capture_gate import CaptureGate

T = 10  # seconds: a wait that times out fails the test instead of hanging it


def _in_thread(target):
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def test_shared_work_runs_side_by_side():
    gate, both = CaptureGate(), threading.Barrier(2, timeout=T)

    def work():
        with gate.shared():
            both.wait()  # only returns once the other thread is inside too

    threads = [_in_thread(work) for _ in range(2)]
    for thread in threads:
        thread.join(T)
    assert not any(t.is_alive() for t in threads) and not gate.busy()


def test_a_capture_waits_for_running_work_and_holds_back_new_work():
    gate, order = CaptureGate(), []
    inside, release = threading.Event(), threading.Event()

    def running():
        with gate.shared():
            inside.set()
            release.wait(T)
            order.append("running work ends")

    def capture():
        with gate.capture():
            order.append("capture")
            threading.Event().wait(0.1)  # the late work, asked for meanwhile, waits

    def late():
        with gate.shared():
            order.append("late work")

    first = _in_thread(running)
    assert inside.wait(T)
    capturer = _in_thread(capture)
    while not gate.asked():  # the capture waits for the running work
        threading.Event().wait(0.001)
    latecomer = _in_thread(late)  # asks while the capture waits: after the capture, not before it
    threading.Event().wait(0.05)
    assert order == []
    release.set()
    for thread in (first, capturer, latecomer):
        thread.join(T)
    assert order == ["running work ends", "capture", "late work"] and not gate.busy()


def test_a_nested_hold_does_not_wait_for_a_capture_that_waits_for_it():
    gate, inside, done = CaptureGate(), threading.Event(), []

    def work():
        with gate.shared():
            inside.set()
            while not gate.asked():
                threading.Event().wait(0.001)
            with gate.shared():  # e.g. a reward that runs the DiT: counted once already
                done.append("nested")

    worker = _in_thread(work)
    assert inside.wait(T)
    with gate.capture():
        done.append("capture")
    worker.join(T)
    assert done == ["nested", "capture"] and not gate.busy()


def test_a_capture_inside_shared_work_is_refused_and_errors_release_the_gate():
    gate = CaptureGate()
    with gate.shared(), pytest.raises(RuntimeError, match="would wait for itself"):
        with gate.capture():
            pass
    with pytest.raises(ValueError), gate.shared():
        raise ValueError("a reward failed")
    with pytest.raises(ValueError), gate.capture():
        raise ValueError("the capture failed")
    assert not gate.busy() and not gate.held_shared()
    with gate.capture():  # usable again
        assert gate.busy()
