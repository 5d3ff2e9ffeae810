"""What one request may cost a reward server (rewards/remote/serving.py ServingLimits, target_files.py): a body past
``--max-request-mb`` and images whose decoded size would pass it are answered 413 before anything is decoded (a PNG of
a few KB decodes to MBs), a target that is no image is 422, targets no sample names are not kept, the kept files stay
under ``--target-cache-mb``, and the server scores the next request as before. Served in a thread (uvicorn)."""

import base64
import gc
import io
import logging
import math
import os
import threading
import time
import weakref

import pytest
import requests
import torch
from PIL import Image

from glm_grpo_ds.rewards import build_reward
from glm_grpo_ds.rewards.remote import target_files
from glm_grpo_ds.rewards.remote.batcher import Batcher, _Job
from glm_grpo_ds.rewards.remote.client import RemoteRewardError
from glm_grpo_ds.rewards.remote.protocol import quantize
from glm_grpo_ds.rewards.remote.serving import ServingLimits, TargetFiles, build_app
from glm_grpo_ds.testing.reward_servers import CappedMean, SlowMean, serve_in_thread


def _png(width: int, height: int) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (width, height)).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def server():
    fn = SlowMean()  # the images' mean: any request that reaches the reward is scored
    app = build_app(fn, "mean", None, 8, 0.0, "cpu", None, ServingLimits(max_request_mb=1, target_cache_mb=1))
    with serve_in_thread(app) as (url, _):
        yield url, app, fn


def _score(url, body) -> requests.Response:
    return requests.post(f"{url}/score", json=body, timeout=30)


def test_images_that_decode_past_the_limit_are_413_naming_the_option_and_never_reach_the_reward(server):
    url, app, _ = server
    big = _png(1000, 1000)  # ~4 KB of PNG, 3 MB decoded: past 1 MB
    assert len(big) < 10_000
    calls = len(app.state.batcher.calls)
    r = _score(url, {"images": [big], "prompts": ["p"]})
    assert r.status_code == 413 and "--max-request-mb 1" in r.json()["detail"]
    r = _score(url, {"images": [_png(8, 8)], "prompts": ["p"], "target_images": {"t": big}})  # a target counts too
    assert r.status_code == 413
    assert len(app.state.batcher.calls) == calls  # nothing was scored
    small = _score(url, {"images": [_png(8, 8)] * 2, "prompts": ["p", "q"]})
    assert small.status_code == 200 and len(small.json()["rewards"]) == 2


def test_a_body_past_the_limit_is_413_and_the_client_says_which_option(server):
    url, _, _ = server
    long_prompt = "x" * (3 * 2**19)  # 1.5 MB of text beside an 8 x 8 image: the body alone passes 1 MB
    r = _score(url, {"images": [_png(8, 8)], "prompts": [long_prompt]})
    assert r.status_code == 413
    remote = build_reward("remote", {"url": url, "retries": 0, "timeout_s": 20})
    with pytest.raises(RemoteRewardError, match="HTTP 413.*--max-request-mb"):
        remote(torch.rand(1, 3, 8, 8), [long_prompt], [{}])


def test_a_target_that_is_no_image_is_422_and_targets_no_sample_names_are_not_kept(server):
    url, app, _ = server
    image = _png(8, 8)
    r = _score(url, {"images": [image], "prompts": ["p"], "target_images": {"t": base64.b64encode(b"text").decode()}})
    assert r.status_code == 422 and "target_images['t']" in r.json()["detail"]
    folder = app.state.targets.folder
    before = set(os.listdir(folder))
    unused = _png(9, 9)
    r = _score(url, {"images": [image], "prompts": ["p"], "samples": [{}], "target_images": {"u": unused}})
    assert r.status_code == 200 and set(os.listdir(folder)) == before
    listed = {"images": [image], "prompts": ["p"], "samples": [{"target_image": ["u"]}], "target_images": {"u": unused}}
    r = _score(url, listed)  # a key that is no string: one line, not a 500
    assert r.status_code == 422 and "is not a key of target_images" in r.json()["detail"]


def test_target_files_stay_under_the_budget_by_removing_the_least_recently_used_idle_ones(tmp_path):
    files = TargetFiles(tmp_path, budget=250)
    paths = [files.put(bytes([i]) * 100) for i in range(2)]  # 200 bytes: under the budget
    old = time.time() - target_files.TARGET_IDLE_S - 1
    os.utime(paths[0], (old, old))
    os.utime(paths[1], (old - 5, old - 5))
    assert files.put(bytes([0]) * 100) == paths[0]  # used again: its time refreshed, nothing written
    third = files.put(bytes([2]) * 100)  # 300 bytes: the least recently used idle file goes
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(p) for p in (paths[0], third))
    assert files.bytes == 200
    fourth = files.put(bytes([3]) * 100)  # over again, but every file was used within the idle time: all kept
    assert len(os.listdir(tmp_path)) == 3 and os.path.exists(fourth)


def test_a_call_that_runs_out_of_memory_is_scored_in_halves_and_the_server_keeps_the_half(caplog):
    """A reward call of more images than the device holds (CappedMean: 3) is scored again in halves, down to sizes
    that fit, rather than failing its requests; the server's max_batch (and /health's) stays at the size then scored,
    said once per lowering; one image that does not fit is a 500 naming the memory."""
    torch.manual_seed(0)
    images = torch.rand(10, 3, 8, 8)
    app = build_app(CappedMean(capacity=3), "capped", None, 8, 0.0, "cpu", None)
    server_log = logging.getLogger("uvicorn.error")  # uvicorn's: it does not reach the root logger caplog listens on
    with serve_in_thread(app) as (url, _):
        server_log.addHandler(caplog.handler)  # once uvicorn has set up its logging, which resets its handlers
        values = build_reward("remote", {"url": url, "retries": 0})(images, ["p"] * 10, [{}] * 10)
        first = list(app.state.batcher.calls)
        again = build_reward("remote", {"url": url, "retries": 0})(images[:8], ["p"] * 8, [{}] * 8)
        health = requests.get(f"{url}/health", timeout=30).json()
        calls = list(app.state.batcher.calls)[len(first) :]
    server_log.removeHandler(caplog.handler)
    expected = CappedMean(capacity=10)(quantize(images), [], [])
    assert torch.equal(values, expected) and torch.equal(again, expected[:8])  # every image scored, as in one call
    # a request of 10 at max_batch 8: jobs of 8 and 2; 8 -> 4 -> 2, 2 and 4 -> 2, 2; then the job of 2
    assert first == [8, 4, 2, 2, 4, 2, 2, 2]
    assert calls == [2, 2, 2, 2] and health["max_batch"] == 2  # the size that was scored kept: none fails again
    (lowered,) = [r.getMessage() for r in caplog.records if "ran out of CPU memory" in r.getMessage()]
    assert "on a call of 8 images" in lowered and "at most 2 images" in lowered and "--max-batch 2 " in lowered

    app = build_app(CappedMean(capacity=0), "capped", None, 8, 0.0, "cpu", None)
    with serve_in_thread(app) as (url, _):
        r = requests.post(f"{url}/score", json={"images": [_png(8, 8)], "prompts": ["p"]}, timeout=30)
    assert r.status_code == 500 and "ran out of the server's device memory on one image" in r.json()["detail"]


def test_requests_queued_before_a_lowering_are_scored_at_the_new_size():
    """Three concurrent requests of 8 images on a device that holds 2, end to end: one chain of failed calls (8, 4 and
    the other 4), then every call at the lowered size, whether a request came before the lowering (split at the old
    size, then chunked by the batcher) or after it (split at the new one). The chunking alone, deterministically:
    test_a_job_split_at_the_old_size_is_scored_at_the_new_one."""
    torch.manual_seed(0)
    images = torch.rand(8, 3, 8, 8)
    app = build_app(CappedMean(capacity=2), "capped", None, 8, 0.0, "cpu", None)
    results, errors = [], []

    def send(url):
        try:
            results.append(build_reward("remote", {"url": url, "retries": 0})(images, ["p"] * 8, [{}] * 8))
        except Exception as err:  # noqa: BLE001 - reported by the assertion below
            errors.append(err)

    with serve_in_thread(app) as (url, _):
        threads = [threading.Thread(target=send, args=(url,)) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        calls = list(app.state.batcher.calls)
    assert not errors and len(results) == 3
    assert all(torch.equal(r, CappedMean(capacity=8)(quantize(images), [], [])) for r in results)
    assert calls[:7] == [8, 4, 2, 2, 4, 2, 2] and calls[7:] == [2] * 8, calls


def _job(prompts: list[str]) -> _Job:
    return _Job(torch.randint(0, 256, (len(prompts), 3, 8, 8), dtype=torch.uint8), prompts, [{}] * len(prompts), None)


def _means(job: _Job) -> torch.Tensor:
    return job.images.float().div(255).mean(dim=(1, 2, 3))


def test_a_job_split_at_the_old_size_is_scored_at_the_new_one():
    """A job queued as 8 images before a call lowered max_batch to 2 is scored in calls of 2, none failing first."""
    torch.manual_seed(0)
    batcher = Batcher(CappedMean(capacity=2), "capped", 8, 0.0, torch.device("cpu"))
    first, queued = _job(["p"] * 8), _job(["q"] * 8)
    (values,) = batcher._call([first])
    assert torch.equal(values, _means(first)) and batcher.max_batch == 2
    batcher.calls.clear()
    (values,) = batcher._call([queued])
    assert torch.equal(values, _means(queued)) and list(batcher.calls) == [2, 2, 2, 2]
    batcher.close()


def test_the_batch_size_kept_is_below_every_size_that_failed():
    """Memory that depends on the images (two heavy ones cost 2 each, the device holds 4): 8 fails, its first half
    of 4 fits, its second (holding the heavy two) fails and is scored as 2 + 2. max_batch is then 2, not the 4 that
    fitted once: a size that failed is not kept."""
    torch.manual_seed(0)
    batcher = Batcher(CappedMean(capacity=4, costs={"heavy": 2}), "capped", 8, 0.0, torch.device("cpu"))
    job = _job(["a"] * 6 + ["heavy"] * 2)
    (values,) = batcher._call([job])
    assert torch.equal(values, _means(job))
    assert list(batcher.calls) == [8, 4, 4, 2, 2] and batcher.max_batch == 2
    batcher.close()


def test_an_image_that_does_not_fit_alone_fails_only_its_own_request():
    """Two requests in one call, the second holding an image no call can hold: the first is scored, the second
    fails with the out-of-memory error (the server's 500), instead of both, and that image lowers nothing."""
    torch.manual_seed(0)
    batcher = Batcher(CappedMean(capacity=8, costs={"huge": math.inf}), "capped", 8, 0.0, torch.device("cpu"))
    fits, unfit = _job(["a", "b"]), _job(["c", "huge"])
    scored, failed = batcher._call([fits, unfit])
    assert torch.equal(scored, _means(fits))
    assert isinstance(failed, torch.OutOfMemoryError)
    assert batcher.max_batch == 8  # the image, not the batch, does not fit: later calls stay whole
    batcher.close()


def test_a_reward_error_fails_every_request_of_its_call_once():
    """A reward that raises (not out of memory) on a call of two requests: both fail with that error, logged once,
    and nothing is scored again."""

    def broken(images, prompts, samples):
        raise ValueError("the judge's template lacks {question}")

    batcher = Batcher(broken, "judge", 8, 0.0, torch.device("cpu"))
    results = batcher._call([_job(["a"]), _job(["b", "c"])])
    assert len(results) == 2 and results[0] is results[1] and isinstance(results[0], ValueError)
    assert list(batcher.calls) == [3] and batcher.max_batch == 8
    batcher.close()


def test_a_reward_raising_system_exit_fails_its_request_and_the_server_serves_on():
    """SystemExit (a BaseException) raised by reward code fails its request with a 500 naming it; the batching task
    survives, so the next request is scored (before, every later request waited for ever while /health said 200)."""

    def quits(images, prompts, samples):
        if "quit" in prompts:
            raise SystemExit(1)
        return images.float().mean(dim=(1, 2, 3))

    app = build_app(quits, "quits", None, 8, 0.0, "cpu", None)
    with serve_in_thread(app) as (url, _):
        failed = requests.post(f"{url}/score", json={"images": [_png(8, 8)], "prompts": ["quit"]}, timeout=30)
        scored = requests.post(f"{url}/score", json={"images": [_png(8, 8)], "prompts": ["fine"]}, timeout=30)
    assert failed.status_code == 500 and "reward quits raised SystemExit" in failed.json()["detail"]
    assert scored.status_code == 200 and scored.json() == {"rewards": [0.0]}


def test_a_failed_requests_error_keeps_none_of_the_calls_tensors_alive():
    """The error a request fails with travels to its answer; the call's tensors in its frames are released at once
    (not at the next garbage collection: on a GPU they would hold the memory that ran out)."""
    held = []

    def starved(images, prompts, samples):
        work = torch.empty(1024)
        held.append(weakref.ref(work))
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 KiB.")

    batcher = Batcher(starved, "starved", 8, 0.0, torch.device("cpu"))
    gc.disable()  # reference counting alone
    try:
        (failed,) = batcher._call([_job(["a"])])
        assert isinstance(failed, torch.OutOfMemoryError) and held[0]() is None
    finally:
        gc.enable()
        batcher.close()


def test_a_reward_model_that_does_not_fit_at_startup_is_one_line_and_exit_8(tmp_path, capsys):
    from glm_grpo_ds.commands import reward_server

    plugin = tmp_path / "big.py"
    message = (  # torch's caching allocator's words
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.23 GiB is "
        "free. Of the allocated memory 70.00 GiB is allocated by PyTorch, and 0.50 GiB is reserved by PyTorch but "
        "unallocated."
    )
    plugin.write_text(
        f"import torch\n\n\nclass Big:\n    def __init__(self):\n        raise torch.OutOfMemoryError({message!r})\n"
    )
    code = reward_server.main(["--reward", f"{plugin}:Big", "--device", "cpu", "--port", "0"])
    out, err = capsys.readouterr()
    assert code == 8 and out == "", (code, out, err)
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(
        f"glm-grpo reward-server: out of GPU memory (loading reward {plugin}:Big on cpu): tried to allocate 2.00 GiB "
        "with 1.23 GiB of 79.15 GiB free; serve it on a device with more free memory (--device cuda:N"
    ), err
    assert err.rstrip().endswith("nothing is served"), err
