"""The reward-server protocol's encoding (rewards/remote/protocol.py), the batcher of rewards/remote/serving.py
driven directly on an event loop, and the remote reward's argument checks (no server, no network)."""

import asyncio
import base64
import json
import math
import threading

import pytest
import torch

from glm_grpo_ds.rewards import RewardError, check_reward_specs
from glm_grpo_ds.rewards.remote.batcher import Batcher
from glm_grpo_ds.rewards.remote.protocol import (
    decode_png,
    encode_pngs,
    file_key,
    quantize,
    read_token,
    request_body,
    rewards_from_json,
    rewards_to_json,
)
from glm_grpo_ds.testing.reward_servers import SlowMean


def test_png_round_trip_is_the_8bit_rounding_of_the_image():
    torch.manual_seed(0)
    x = torch.rand(3, 17, 23) * 1.2 - 0.1  # values outside [0, 1] are clamped like the decoder's output
    (encoded,) = encode_pngs(x.unsqueeze(0))
    back = decode_png(encoded)
    assert back.dtype == torch.uint8 and back.shape == (3, 17, 23)
    assert torch.equal(back.float() / 255, quantize(x.unsqueeze(0))[0])
    with pytest.raises(ValueError, match="not a base64 image"):
        decode_png(base64.b64encode(b"not a png").decode())


def test_request_body_sends_each_target_file_once_and_is_json(tmp_path):
    (tmp_path / "t.png").write_bytes(b"target bytes")
    reads = []

    def read(path):
        reads.append(path)
        return (tmp_path / "t.png").read_bytes()

    samples = [
        {"target_image": str(tmp_path / "t.png"), "text": None, "index": 0, "colour": "red"},
        {"target_image": str(tmp_path / "t.png"), "text": "HI", "index": 0},
        {"target_image": None, "text": None, "index": 1},
    ]
    body = json.loads(json.dumps(request_body(torch.zeros(3, 3, 4, 4), ["a", "a", "b"], samples, read)))
    key = file_key(b"target bytes")
    assert body["target_images"] == {key: base64.b64encode(b"target bytes").decode()}
    assert [s["target_image"] for s in body["samples"]] == [key, key, None]
    assert body["samples"][0]["colour"] == "red" and body["samples"][1]["text"] == "HI"
    assert len(body["images"]) == 3 and body["prompts"] == ["a", "a", "b"]
    assert samples[0]["target_image"] == str(tmp_path / "t.png")  # the caller's rows are left alone


def test_fields_json_cannot_hold_are_left_out_of_the_request_and_said_once(capsys):
    """A Hub or Parquet prompt set's extra columns come as images, bytes, dates and NaN: the request carries what JSON
    can (NaN as null, a date as its ISO text) and leaves the rest out, said once, instead of failing to encode every
    batch (each then scored undefined, every step skipped)."""
    import datetime

    from PIL import Image

    from glm_grpo_ds.runtime import log

    log.setup("info", 0)
    row = {"index": 0, "thumb": Image.new("RGB", (2, 2)), "raw": b"x", "score": float("nan"), "tags": ["a", 1.5]}
    row["when"] = datetime.date(2026, 11, 30)
    for _ in range(2):
        body = request_body(torch.zeros(1, 3, 4, 4), ["a"], [row], lambda path: b"")
        sent = json.loads(json.dumps(body, allow_nan=False))["samples"][0]
    assert sent == {"index": 0, "score": None, "tags": ["a", 1.5], "when": "2026-11-30", "target_image": None}
    err = capsys.readouterr().err
    assert err.count("the prompt rows' fields thumb (Image), raw (bytes) cannot be sent as JSON") == 1, err


def test_rewards_json_null_is_nan_and_float32_round_trips_exactly():
    values = torch.tensor([0.1, float("nan"), -3.3e-7, float("inf")], dtype=torch.float32)
    as_json = json.loads(json.dumps(rewards_to_json(values)))
    assert as_json[1] is None and as_json[3] is None
    back = rewards_from_json(as_json)
    assert back.dtype == torch.float32 and torch.equal(back[[0, 2]], values[[0, 2]])
    assert math.isnan(back[1]) and math.isnan(back[3])


async def _until(condition, timeout_s: float = 30.0) -> None:
    """Poll ``condition`` on the event loop (the batcher's worker thread makes it true)."""
    for _ in range(int(timeout_s / 0.005)):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise TimeoutError("condition not reached")


def test_batcher_merges_queued_same_size_jobs_up_to_max_batch():
    """Jobs queued while a call runs share the next call, up to max_batch images of one size; a
    request above max_batch is split; every request gets its own values back, in its order."""
    gate = threading.Event()
    fn = SlowMean(gate=gate)  # A's call waits until B..E are queued: no timing assumption

    def img(n, size, offset):
        return (
            (torch.arange(n * 3 * size * size, dtype=torch.float32).view(n, 3, size, size) + offset)
            .remainder(256)
            .to(torch.uint8)
        )

    async def scenario():
        batcher = Batcher(fn, "slow", max_batch=4, max_wait_s=0.0, device=torch.device("cpu"))
        runner = asyncio.create_task(batcher.run())
        try:
            a = asyncio.create_task(batcher.score(img(2, 8, 0), ["a"] * 2, [{}] * 2))
            await _until(lambda: len(batcher.calls) == 1)  # the batcher is now inside A's call
            jobs = {
                "b": (img(1, 8, 1), 1),
                "c": (img(3, 8, 2), 3),
                "d": (img(2, 4, 3), 2),  # another size: never in B's or C's call
                "e": (img(6, 8, 4), 6),  # split 4 + 2
            }
            tasks = {k: asyncio.create_task(batcher.score(x, [k] * n, [{}] * n)) for k, (x, n) in jobs.items()}
            await _until(lambda: batcher.queue.qsize() == 5)  # B, C, D and E's two halves
            gate.set()
            results = await asyncio.wait_for(asyncio.gather(a, *tasks.values()), timeout=30)
        finally:
            gate.set()
            runner.cancel()
            batcher.close()
        return batcher.calls, dict(zip(["a", *jobs], results)), {k: x for k, (x, _) in jobs.items()}

    calls, results, inputs = asyncio.run(scenario())
    assert list(calls) == [2, 4, 2, 4, 2]  # A alone; B + C together; D; E split in two
    inputs["a"] = img(2, 8, 0)
    for key, x in inputs.items():
        assert torch.equal(results[key], fn(x.float() / 255, [], [])), key


def test_remote_reward_args_are_checked_before_anything_is_contacted(tmp_path):
    from glm_grpo_ds.config import RewardSpec

    cases = [
        ({}, r"rewards\[0\] remote: args.url '' must be the server's address"),
        ({"url": "127.0.0.1:8000"}, r"args.url '127.0.0.1:8000' must be the server's address, e.g. http://"),
        ({"url": "http://h:1", "retry": 2}, r"args \['retry', 'url'\]: expected some of url, timeout_s, retries"),
        ({"url": "http://h:1", "timeout_s": 0}, r"timeout_s=0 must be > 0"),
        ({"url": "http://h:1", "token_file": str(tmp_path / "none")}, r"args.token_file .*none does not exist"),
    ]
    for args, message in cases:
        with pytest.raises(RewardError, match=message):
            check_reward_specs([RewardSpec(name="remote", args=args)])
    (tmp_path / "tok").write_text("two words\n")
    with pytest.raises(ValueError, match="must hold one token"):
        read_token(str(tmp_path / "tok"), "--token-file")
    (tmp_path / "tok").write_bytes(b"\xff\xfe")
    with pytest.raises(ValueError, match="--token-file .*tok cannot be read"):
        read_token(str(tmp_path / "tok"), "--token-file")
    (tmp_path / "tok").write_text("  s3cret\n")
    (tmp_path / "tok").chmod(0o600)
    assert read_token(str(tmp_path / "tok"), "--token-file") == "s3cret"


def test_a_token_file_others_can_read_is_warned_about(tmp_path, capsys):
    from glm_grpo_ds.runtime import log

    log.setup("info", 0)
    token = tmp_path / "tok"
    token.write_text("s3cret\n")
    token.chmod(0o600)
    read_token(str(token), "--token-file")
    assert "readable by other users" not in capsys.readouterr().err
    token.chmod(0o644)  # what `openssl rand -hex 32 > FILE` makes under the usual umask 022
    assert read_token(str(token), "--token-file") == "s3cret"
    assert "--token-file " + str(token) + " is readable by other users (0o644): chmod 600 it" in capsys.readouterr().err


def test_requests_that_bring_the_same_new_target_at_once_all_get_it(tmp_path):
    """The server writes each new target image once under its content's name: requests bringing the same one at the
    same time each write a temporary file of their own (they shared one `.part` name, and all but one failed with an
    unretried 500, their batch scored NaN)."""
    from types import SimpleNamespace

    from glm_grpo_ds.rewards.remote import serving

    raw = b"\x89PNG the same target, many times" * 5000
    body = SimpleNamespace(samples=[{"target_image": "t"}], prompts=["a"])
    for round_ in range(5):
        where = tmp_path / str(round_)
        where.mkdir()
        start, errors, files = threading.Barrier(8), [], serving.TargetFiles(where, 2**30)

        def request(files=files, start=start, errors=errors):
            start.wait()
            try:
                serving._samples(body, {"t": raw}, files)
            except OSError as err:
                errors.append(err)

        threads = [threading.Thread(target=request) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [] and [p.suffix for p in where.iterdir()] == [""], errors
