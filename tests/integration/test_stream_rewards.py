"""`decoder.stream_rewards`: each DiT batch is scored while the next one decodes, with the same images,
the same rewards in sample order and the same failure accounting as scoring after the whole decode."""

import threading
import time

import pytest
import torch
from launching import FAST, run_cmd, train_cmd  # noqa: E402  (tests/integration/launching.py)
from run_files import metrics  # noqa: E402  (tests/run_files.py)

from glm_grpo_ds.config import DecoderConfig
from glm_grpo_ds.decoder import ImageDecoder
from glm_grpo_ds.experience import ToScore, decode_and_score
from glm_grpo_ds.observability.meter import Meter
from glm_grpo_ds.rewards.registry import RewardSet
from glm_grpo_ds.testing.tiny import CODEBOOK_SIZE

# two prompts interleaved, so the decoder's DiT batches (rows of one prompt, 2 at a time) reorder the rows
PROMPTS = ["a", "b", "a", "b", "a", "b", "a", "b"]


@pytest.fixture(scope="module")
def decoder(tiny_model_dir):
    return ImageDecoder(tiny_model_dir, DecoderConfig(num_inference_steps=2, batch_size=2))


def inputs():
    grids = torch.randint(0, CODEBOOK_SIZE, (8, 16), generator=torch.Generator().manual_seed(0))
    samples = [{"id": i, "bad": i in (1, 3)} for i in range(8)]
    return grids, PROMPTS, (64, 64), [7] * 8, samples


def sample_id(images, prompts, samples):
    return torch.tensor([float(s["id"]) for s in samples])


def brightness(images, prompts, samples):
    return images.mean(dim=(1, 2, 3))


def fails_on_bad(images, prompts, samples):
    if any(s["bad"] for s in samples):
        raise RuntimeError("bad batch")
    return torch.ones(len(samples))


@pytest.mark.parametrize("stream", [False, True])
def test_same_images_rewards_order_and_failures(decoder, stream):
    grids, prompts, size, seeds, samples = inputs()
    reference = decoder.decode(grids, prompts, *size, seeds)
    rewards = RewardSet([("id", 1.0, sample_id), ("bright", 1.0, brightness), ("flaky", 1.0, fails_on_bad)])
    meter = Meter()
    images, per_reward = decode_and_score(
        decoder, rewards, ToScore(grids, prompts, size, seeds, samples), meter, stream
    )
    assert torch.equal(images, reference)
    assert per_reward["id"].tolist() == list(range(8))  # back in sample order
    torch.testing.assert_close(per_reward["bright"], reference.mean(dim=(1, 2, 3)), rtol=0, atol=1e-6)
    flaky = per_reward["flaky"]
    if stream:  # rows 1 and 3 (prompt b) share a DiT batch: only that batch is undefined
        assert torch.isnan(flaky).tolist() == [False, True, False, True, False, False, False, False]
        assert rewards.failed == {"id": 0, "bright": 0, "flaky": 2}
    else:  # one call for all: the whole step is undefined, as before streaming
        assert torch.isnan(flaky).all() and rewards.failed == {"id": 0, "bright": 0, "flaky": 8}
    assert set(meter.timings) == {"decode", "reward"}


def test_a_decode_that_fails_mid_stream_does_not_score_the_queued_batches_first(decoder):
    """The error ends the step; the batches already queued behind a slow reward (a remote one may retry for minutes
    per batch) were all scored, one after another, before it surfaced. The third DiT batch fails while the first is
    being scored and the second waits: the second is not scored."""
    grids, prompts, size, seeds, samples = inputs()
    forwards, failed, called = [], threading.Event(), []

    def third_batch_fails(*_):
        forwards.append(1)
        if len(forwards) == 2 * 2 * 2 + 1:  # 2 DiT steps x (conditional + guidance pass) x 2 batches, then
            failed.set()
            raise RuntimeError("the DiT failed")

    def slow(images, prompts, samples):
        called.append(len(samples))
        failed.wait(timeout=10)
        time.sleep(0.5)  # still scoring when the error ends the decode
        return torch.zeros(len(samples))

    hook = decoder.pipe.transformer.register_forward_pre_hook(third_batch_fails)
    try:
        with pytest.raises(RuntimeError, match="the DiT failed"):
            todo = ToScore(grids, prompts, size, seeds, samples)
            decode_and_score(decoder, RewardSet([("r", 1.0, slow)]), todo, None, True)
    finally:
        hook.remove()
    assert called == [2]


@pytest.mark.parametrize("stream", [True, False])
def test_a_batch_is_scored_while_the_next_one_decodes(decoder, stream):
    """The decoder's third DiT batch waits for the first reward call to start: with streaming it starts
    while the decode goes on; without, only after the decode, so the wait runs out (the control)."""
    grids, prompts, size, seeds, samples = inputs()
    forwards, reward_started, waited = [], threading.Event(), []

    def third_batch_waits(*_):
        forwards.append(1)
        if len(forwards) == 2 * 2 * 2 + 1:  # 2 DiT steps x (conditional + guidance pass) x 2 batches, then
            waited.append(reward_started.wait(timeout=10 if stream else 1))

    def starts(images, prompts, samples):
        reward_started.set()
        return torch.zeros(len(samples))

    hook = decoder.pipe.transformer.register_forward_hook(third_batch_waits)
    try:
        decode_and_score(
            decoder, RewardSet([("r", 1.0, starts)]), ToScore(grids, prompts, size, seeds, samples), None, stream
        )
    finally:
        hook.remove()
    assert waited == [stream]


@pytest.mark.parametrize("stream", [False, True])
def test_no_reward_or_dit_forward_runs_while_another_thread_captures_a_graph(decoder, stream):
    """A reward may synchronize the device or empty the cache (reward code often does), and so does a DiT compile's
    autotuning at a kernel's first run; either fails a CUDA graph's capture on another thread (rollout.one_step_off's
    rollout) in every capture mode: every reward call, every DiT and glyph-encoder forward and every VAE decode
    waits while a capture holds runtime/capture_gate.py's gate. A thread stands in for the capture: it waits until
    the decode's first DiT forward holds the gate, then captures for 0.3 s: none of them may start in that window
    (streamed: the first reward's natural start, after the first DiT batch, falls in it), and they go on after it."""
    from glm_grpo_ds.runtime.capture_gate import CAPTURE_SAFE

    grids, prompts, size, seeds, samples = inputs()
    first, spans, called, forwards = threading.Event(), [], [], []

    def capture():
        first.wait(timeout=60)
        with CAPTURE_SAFE.capture():  # waits for the running forward, then holds the next ones
            spans.append(time.perf_counter())
            threading.Event().wait(0.3)
            spans.append(time.perf_counter())

    def block_started(*_):  # inside the DiT's forward, so inside its share of the gate
        assert CAPTURE_SAFE.held_shared()
        forwards.append(time.perf_counter())
        if not first.is_set():  # the first forward: the capture is asked for before it ends
            first.set()
            deadline = time.perf_counter() + 30
            while not CAPTURE_SAFE.asked() and time.perf_counter() < deadline:
                time.sleep(0.005)

    def records(images, prompts, samples):
        called.append(time.perf_counter())
        assert CAPTURE_SAFE.held_shared()  # held by this call until it returns
        return torch.zeros(len(samples))

    others = {"glyph encoder": [], "vae": []}  # the decoder's other kernels: behind the gate too

    def other_started(name):
        def started(*_):
            assert CAPTURE_SAFE.held_shared(), name
            others[name].append(time.perf_counter())

        return started

    capturer = threading.Thread(target=capture)
    capturer.start()
    pipe = decoder.pipe
    hooks = [pipe.transformer.transformer_blocks[0].register_forward_pre_hook(block_started)]
    # on a submodule each: a module's own pre-hooks run before its (gated) forward
    hooks += [pipe.text_encoder.encoder.register_forward_pre_hook(other_started("glyph encoder"))]
    hooks += [pipe.vae.decoder.register_forward_pre_hook(other_started("vae"))]  # inside vae.decode
    try:
        todo = ToScore(grids, prompts, size, seeds, samples)
        decode_and_score(decoder, RewardSet([("r", 1.0, records)]), todo, None, stream)
    finally:
        for hook in hooks:
            hook.remove()
        capturer.join()
    start, end = spans
    # 2 DiT steps x (conditional + guidance pass) x 4 batches, less the first guidance pass of each prompt's second
    # batch: one seed, so the first batch's is kept (decoder/first_uncond.py)
    assert len(forwards) == 2 * 2 * 4 - 2
    assert len(others["vae"]) == 4 and others["glyph encoder"]  # a VAE decode per batch
    calls = forwards + called + others["vae"] + others["glyph encoder"]
    assert not [t for t in calls if start <= t <= end]  # nothing in the capture's window
    assert [t for t in forwards if t > end] and min(called) > end  # and both went on after it
    assert not CAPTURE_SAFE.busy()


FAILS_ON_BAD = """
import torch
def fails_on_bad(images, prompts, samples):
    if any("bad" in p for p in prompts):
        raise RuntimeError("bad prompt")
    return images.mean(dim=(1, 2, 3))
"""


@pytest.mark.slow  # a training run
@pytest.mark.parametrize("stream,failed", [(True, 4), (False, 8)])
def test_a_run_streams_its_rewards_when_asked(tiny_model_dir, tmp_path, stream, failed):
    """Two prompts per step, one of them "bad": streamed, only its DiT batches fail (G=4 samples);
    scored after the decode, the one call for both prompts fails (8 samples)."""
    (tmp_path / "r.py").write_text(FAILS_ON_BAD)
    (tmp_path / "p.txt").write_text("a bad cube\na red apple\n")
    cmd = train_cmd()
    cmd += [f"model.path={tiny_model_dir}", f"data.train_file={tmp_path / 'p.txt'}", f"output_dir={tmp_path / 'run'}"]
    cmd += [
        *FAST,
        "batch.prompts_per_rank=2",
        "decoder.batch_size=2",
        "max_steps=1",
        f"decoder.stream_rewards={stream}",
    ]
    cmd += [f"rewards=[{{name: '{tmp_path / 'r.py'}:fails_on_bad'}}]"]
    proc = run_cmd(cmd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = metrics(tmp_path / "run")
    assert row[f"reward/{tmp_path / 'r.py'}:fails_on_bad_failed"] == failed
