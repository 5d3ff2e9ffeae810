"""``glm-grpo reward-server`` and the ``remote`` reward on loopback: bitwise parity with the in-process
reward, tokens, concurrent batching, retries, a server dying mid-run, startup checks of training and
a 2-rank training run. Every server a test starts is stopped by it (testing/reward_servers.py), every
request has a timeout."""

import math
import signal
import threading
import time
from pathlib import Path

import pytest
import requests
import torch
from in_process import train_main  # noqa: E402  (tests/in_process.py)
from launching import CONFIG, FAST, run_train, train_args  # noqa: E402  (tests/integration/launching.py)
from PIL import Image
from run_files import metrics  # noqa: E402  (tests/run_files.py)

from glm_grpo_ds.data.rows import DatasetImage
from glm_grpo_ds.rewards import RewardError, RewardSet, build_reward
from glm_grpo_ds.rewards.remote.client import RemoteRewardError
from glm_grpo_ds.rewards.remote.protocol import encode_pngs, quantize
from glm_grpo_ds.rewards.remote.serving import build_app
from glm_grpo_ds.testing.reward_servers import SlowMean, serve_in_thread, server_process


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    d = tmp_path_factory.mktemp("targets")
    torch.manual_seed(1)
    Image.fromarray((torch.rand(40, 56, 3) * 255).byte().numpy()).save(d / "wide.png")  # fit rule: resize + crop
    Image.new("RGB", (32, 32), (200, 30, 30)).save(d / "red.jpg")
    return d


def test_remote_pixel_mse_equals_the_in_process_reward_bitwise(targets, tmp_path):
    """The served pixel_mse scores exactly what the in-process one gives the same (8-bit) images,
    through the real command, a request above --max-batch (split) and rows without a target (NaN)."""
    torch.manual_seed(0)
    x = torch.rand(7, 3, 32, 32)
    prompts = [f"p{i}" for i in range(7)]
    paths = [targets / "wide.png", targets / "red.jpg", None, targets / "wide.png", None, targets / "red.jpg", None]
    samples = [{"target_image": str(p) if p else None, "text": None, "index": i} for i, p in enumerate(paths)]
    local = build_reward("pixel_mse", {})
    with server_process(tmp_path, "--reward", "pixel_mse", "--max-batch", "3") as (url, _):
        health = requests.get(f"{url}/health", timeout=10).json()
        remote = build_reward("remote", {"url": url, "timeout_s": 20})
        got = remote(x, prompts, samples)
        # a target stored in the dataset (an Image column) is sent as its bytes, like the file
        stored = [
            dict(s, target_image=DatasetImage(Path(s["target_image"]).read_bytes(), f"row {i}"))
            if s["target_image"]
            else s
            for i, s in enumerate(samples)
        ]
        got_stored = remote(x, prompts, stored)
    assert torch.equal(got_stored.nan_to_num(7.0), got.nan_to_num(7.0))
    assert health["reward"] == "pixel_mse" and health["protocol"] == 1 and health["max_batch"] == 3
    assert health["needs"]["field"] == "target_image" and health["version"]
    assert url.startswith("http://127.0.0.1:")  # loopback unless --host says otherwise
    assert remote.needs.field == "target_image"
    want = local(quantize(x), prompts, samples)
    assert torch.equal(torch.isnan(got), torch.tensor([p is None for p in paths]))
    assert torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0))  # bitwise
    # what an in-process reward sees of the float images differs by the 8-bit rounding only
    assert not torch.equal(want.nan_to_num(7.0), local(x, prompts, samples).nan_to_num(7.0))


def test_token_is_required_never_logged_and_a_wrong_one_is_a_one_line_error(tmp_path):
    secret = "tok-5e3c1a9f0b7d"
    (tmp_path / "token").write_text(secret + "\n")
    (tmp_path / "wrong").write_text("tok-not-it\n")
    (png,) = encode_pngs(torch.rand(1, 3, 8, 8))
    body = {"images": [png], "prompts": ["p"], "samples": [{}]}
    args = ("--reward", "python:glm_grpo_ds.testing.reward_servers:SlowMean", "--reward-arg", "delay_s=0")
    with server_process(tmp_path / "srv", *args, "--token-file", str(tmp_path / "token")) as (url, _):
        for headers in ({}, {"Authorization": "Bearer tok-not-it"}, {"Authorization": secret}):
            # probes and the API description need no token (issue #27); scoring does
            assert requests.get(f"{url}/health", headers=headers, timeout=10).status_code == 200
            assert requests.post(f"{url}/score", json=body, headers=headers, timeout=10).status_code == 401
            assert requests.post(f"{url}/health", headers=headers, timeout=10).status_code == 401  # GET only
        docs = requests.get(f"{url}/docs", timeout=10)
        schema = requests.get(f"{url}/openapi.json", timeout=10).json()
        assert docs.status_code == 200 and "Authorization: Bearer" in schema["info"]["description"]
        assert schema["paths"]["/score"]["post"]["security"] and "HTTPBearer" in schema["components"]["securitySchemes"]
        good = {"Authorization": f"Bearer {secret}"}
        assert requests.get(f"{url}/health", headers=good, timeout=10).status_code == 200
        scored = requests.post(f"{url}/score", json=body, headers=good, timeout=10)
        assert scored.status_code == 200 and len(scored.json()["rewards"]) == 1
        with pytest.raises(RewardError) as no_token:
            build_reward("remote", {"url": url, "retries": 0})
        with pytest.raises(RewardError) as wrong:
            build_reward("remote", {"url": url, "token_file": str(tmp_path / "wrong"), "retries": 0})
        ok = build_reward("remote", {"url": url, "token_file": str(tmp_path / "token")})
        assert ok(torch.rand(2, 3, 8, 8), ["a", "b"], [{}, {}]).shape == (2,)
    assert str(no_token.value) == (
        f"the reward server at {url} refused the request (401 missing Authorization: Bearer <token> header): "
        "set args.token_file"
    )
    assert "holds another token than the server's --token-file" in str(wrong.value)
    for text in (str(no_token.value), str(wrong.value)):
        assert "\n" not in text and secret not in text
    logs = (tmp_path / "srv" / "server.out").read_text() + (tmp_path / "srv" / "server.err").read_text()
    assert "bearer token required" in logs and "POST /score" in logs and secret not in logs


def _wait_for(condition, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_two_concurrent_requests_share_one_reward_call_and_get_their_own_results():
    gate = threading.Event()
    fn = SlowMean(gate=gate)  # the first call waits until a and b are queued: no timing assumption
    app = build_app(fn, "slow", None, max_batch=8, max_wait_s=0.0, device="cpu", token=None)
    torch.manual_seed(0)
    batches = {k: torch.rand(n, 3, 16, 16) for k, n in (("first", 1), ("a", 2), ("b", 3))}
    results, errors = {}, []

    def send(url, key):
        try:
            results[key] = build_reward("remote", {"url": url, "retries": 0, "timeout_s": 20})(
                batches[key], [key] * len(batches[key]), [{}] * len(batches[key])
            )
        except Exception as err:  # noqa: BLE001 - reported by the assertion below
            errors.append(err)

    with serve_in_thread(app) as (url, _):
        first = threading.Thread(target=send, args=(url, "first"))
        first.start()
        batcher = app.state.batcher
        _wait_for(lambda: len(batcher.calls) == 1)  # the worker is now inside the first call
        threads = [threading.Thread(target=send, args=(url, k)) for k in ("a", "b")]
        for t in threads:
            t.start()
        _wait_for(lambda: batcher.queue.qsize() == 2)  # a and b queued behind it
        gate.set()
        for t in [first, *threads]:
            t.join(30)
        calls = list(app.state.batcher.calls)
    assert not errors and not any(t.is_alive() for t in [first, *threads])
    assert calls == [1, 5]  # a (2 images) and b (3 images) in one call
    for key, x in batches.items():
        assert torch.equal(results[key], fn(quantize(x), [], [])), key


def test_slow_server_is_retried_then_the_batch_is_undefined_and_warned_once(capsys):
    from glm_grpo_ds.runtime import log

    log.setup("info", 0)  # the handlers write to this test's captured stderr
    hung = threading.Event()  # the server's reward never answers while it is clear
    app = build_app(SlowMean(gate=hung), "slow", None, max_batch=8, max_wait_s=0.0, device="cpu", token=None)
    with serve_in_thread(app) as (url, _):
        try:
            remote = build_reward("remote", {"url": url, "timeout_s": 0.3, "retries": 1, "backoff_s": 0.05})
            rewards = RewardSet([("remote-slow", 1.0, remote)])  # a label no other test warned about
            start = time.monotonic()
            with pytest.raises(RemoteRewardError, match=r"did not score the batch \(timed out, after 1 retries\)"):
                remote(torch.rand(2, 3, 8, 8), ["a", "b"], [{}, {}])
            assert time.monotonic() - start < 30  # two attempts of 0.3 s, not the hung server's 60 s
            for _ in range(2):
                out = rewards(torch.rand(4, 3, 8, 8), ["a"] * 4, [{}] * 4)
                assert torch.isnan(out["remote-slow"]).all() and rewards.failed == {"remote-slow": 4}
        finally:
            hung.set()  # the server's worker lets go, and the server stops
    err = capsys.readouterr().err
    assert err.count("reward remote-slow raised RemoteRewardError") == 1 and "its 4 samples are undefined" in err


def test_a_request_whose_client_timed_out_is_not_scored_and_its_retry_adds_no_work(capsys):
    """A client times out and retries while the server is busy: the attempt it gave up on is dropped from the queue
    (its connection closed), so a slow server scores each batch once, not once per attempt. The reward is held on a
    gate (no timing assumption); a later request's call shows what ran between."""
    gate = threading.Event()
    app = build_app(SlowMean(gate=gate), "slow", None, max_batch=8, max_wait_s=0.0, device="cpu", token=None)
    with serve_in_thread(app) as (url, _):
        batcher = app.state.batcher
        remote = build_reward("remote", {"url": url, "timeout_s": 0.5, "retries": 1, "backoff_s": 0.05})
        with pytest.raises(RemoteRewardError, match="timed out, after 1 retries"):
            remote(torch.rand(2, 3, 8, 8), ["a", "b"], [{}, {}])  # attempt 1 runs (held), attempt 2 queues
        _wait_for(lambda: len(batcher.calls) == 1 and all(job.future.done() for job in list(batcher.queue._queue)))
        gate.set()
        later = build_reward("remote", {"url": url, "timeout_s": 20, "retries": 0})
        assert later(torch.rand(3, 3, 8, 8), ["c"] * 3, [{}] * 3).shape == (3,)
        calls = list(batcher.calls)
    assert calls == [2, 3]  # the held call and the later request: the retry of the first was never scored


def test_a_server_back_within_the_retries_scores_the_batch():
    from glm_grpo_ds.runtime.ports import free_port

    port = free_port()  # below the ephemeral range: no outgoing connection takes it before the restart binds it
    fn = SlowMean()
    app = build_app(fn, "mean", None, max_batch=8, max_wait_s=0.0, device="cpu", token=None)
    x = torch.rand(3, 3, 8, 8)
    with serve_in_thread(app, port=port) as (url, _):
        remote = build_reward("remote", {"url": url, "retries": 5, "backoff_s": 0.2, "timeout_s": 10})
    restarted, done = threading.Event(), threading.Event()

    def restart():
        time.sleep(0.5)  # the client's first attempts are refused meanwhile
        with serve_in_thread(build_app(fn, "mean", None, 8, 0.0, "cpu", None), port=port):
            restarted.set()
            done.wait(30)

    server = threading.Thread(target=restart)
    start = time.monotonic()  # before the restart's 0.5 s begin
    server.start()
    try:
        got = remote(x, ["p"] * 3, [{}] * 3)
        assert restarted.is_set() and time.monotonic() - start >= 0.4
        assert torch.equal(got, fn(quantize(x), [], []))
    finally:
        done.set()
        server.join(30)


def test_a_served_reward_that_says_none_for_a_sample_answers_null_for_it():
    """TRL's "not applicable" (None), as the in-process reward takes it: the server answered 500 (a float tensor cannot
    hold None), and the batcher's merged call failed every rank's request with it."""
    fn = lambda images, prompts, samples: [None if p == "skip" else 0.7 for p in prompts]  # noqa: E731
    with serve_in_thread(build_app(fn, "some", None, 8, 0.0, "cpu", None)) as (url, _):
        got = requests.post(
            f"{url}/score", json={"images": encode_pngs(torch.rand(2, 3, 8, 8)), "prompts": ["skip", "a"]}
        )
    assert got.status_code == 200, got.text
    assert got.json()["rewards"] == [None, pytest.approx(0.7)]


# ----------------------------------------------------------------------------- training
@pytest.mark.slow
def test_startup_checks_are_one_line_input_errors_before_any_model_loads(tiny_model_dir, data64, tmp_path, capfd):
    (tmp_path / "token").write_text("right\n")
    (tmp_path / "wrong").write_text("wrong\n")
    (tmp_path / "p.txt").write_text("a red apple\na blue car\n")
    base = [f"model.path={tiny_model_dir}", *FAST]
    with server_process(tmp_path / "srv", "--reward", "pixel_mse", "--token-file", str(tmp_path / "token")) as (
        url,
        _,
    ):
        free = f"http://127.0.0.1:{_closed_port()}"
        cases = [
            (data64, f"{{url: '{free}', retries: 0}}", f"the reward server at {free} does not answer"),
            (data64, f"{{url: '{url}', token_file: '{tmp_path / 'wrong'}'}}", "refused the request (401 wrong"),
            (tmp_path / "p.txt", f"{{url: '{url}', token_file: '{tmp_path / 'token'}'}}", "needs target_image but"),
        ]
        for i, (data, args, message) in enumerate(cases):
            out = tmp_path / f"run{i}"
            code, err = train_main(  # in this process (tests/in_process.py): ~0.5 s instead of ~6 s each
                ["--config", CONFIG, "--deepspeed", "ds_configs/zero2.json", *base, f"data.train_file={data}"]
                + [f"output_dir={out}", f"rewards=[{{name: remote, args: {args}}}]"],
                capfd,
            )
            text = "\n".join(err)
            assert code == 2, text[-2000:]
            lines = [line for line in err if line.startswith("glm-grpo")]
            assert len(lines) == 1 and "Traceback" not in text, text[-2000:]
            assert lines[0].startswith("glm-grpo train: rewards[0] remote") and message in lines[0], lines[0]
            assert not (out / "config.json").exists()  # written once the models are loaded


def _closed_port() -> int:
    from glm_grpo_ds.rewards.remote.serving import bind

    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    sock.close()
    return port


DIES = """
import os, signal, torch
calls = [0]
def dies_on_second_call(images, prompts, samples):
    calls[0] += 1
    if calls[0] == 2:
        os.kill(os.getpid(), signal.SIGKILL)  # the server dies in the middle of a request
    return images.mean(dim=(1, 2, 3))
"""


@pytest.mark.slow
def test_server_killed_mid_run_retries_then_undefined_rewards_and_the_run_goes_on(tiny_model_dir, data64, tmp_path):
    (tmp_path / "dies.py").write_text(DIES)
    with server_process(tmp_path / "srv", "--reward", f"{tmp_path / 'dies.py'}:dies_on_second_call") as (url, proc):
        out = tmp_path / "run"
        remote = f"{{name: remote, args: {{url: '{url}', retries: 2, backoff_s: 0.1, timeout_s: 20}}}}"
        train = run_train(
            f"model.path={tiny_model_dir}",
            f"data.train_file={data64}",
            f"output_dir={out}",
            "max_steps=3",
            *FAST,
            f"rewards=[{{name: pixel_mse}}, {remote}]",
            timeout=400,
        )
        assert proc.poll() == -signal.SIGKILL
    assert train.returncode == 0, train.stderr[-3000:]
    rows = metrics(out)
    assert [r["reward/remote_failed"] for r in rows] == [0, 4, 4]
    assert rows[0]["reward/remote"] is not None and rows[0]["reward/remote_undefined"] == 0
    assert all(r["skipped"] == 0 and r["reward/pixel_mse_undefined"] == 0 for r in rows)  # it trained on
    assert train.stderr.count(f"reward remote raised RemoteRewardError: {url} did not score the batch") == 1
    assert "after 2 retries); its 4 samples are undefined" in train.stderr


@pytest.mark.slow
@pytest.mark.distributed
def test_two_rank_training_with_a_remote_reward(tiny_model_dir, data64, tmp_path):
    from launching import launch  # noqa: E402  (tests/integration/launching.py)

    with server_process(tmp_path / "srv", "--reward", "pixel_mse") as (url, _):
        out = tmp_path / "run"
        launch(
            2,
            [
                *train_args(),
                f"model.path={tiny_model_dir}",
                f"data.train_file={data64}",
                f"output_dir={out}",
                "max_steps=2",
                *FAST,
                f"rewards=[{{name: remote, args: {{url: '{url}', timeout_s: 60}}}}]",
            ],
            timeout=600,
            launcher=False,
        )
    rows = metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert (
            math.isfinite(r["reward/remote"]) and r["reward/remote_undefined"] == 0 and r["reward/remote_failed"] == 0
        )
        assert math.isfinite(r["loss"]) and r["skipped"] == 0
    log = (tmp_path / "srv" / "server.out").read_text()
    assert log.count('"POST /score HTTP/1.1" 200') == 4  # each of the 2 ranks sent its own batch each step
