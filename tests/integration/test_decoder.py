"""Frozen DiT decode on the tiny pipeline: shapes, range, per-group seeds, determinism."""

import dataclasses

import pytest
import torch

from glm_grpo_ds.config import DecoderConfig
from glm_grpo_ds.decoder import DecodeSettings, ImageDecoder, pipeline_call_defaults, resolve_settings
from glm_grpo_ds.testing.tiny import CODEBOOK_SIZE


@pytest.fixture(scope="module")
def decoder(tiny_model_dir):
    return ImageDecoder(tiny_model_dir, DecoderConfig(num_inference_steps=3, batch_size=4))


def _grids(n, seed=0):
    return torch.randint(0, CODEBOOK_SIZE, (n, 24), generator=torch.Generator().manual_seed(seed))


def test_frozen_eval_and_no_ar(decoder):
    pipe = decoder.pipe
    assert pipe.vision_language_encoder is None
    for m in (pipe.transformer, pipe.vae, pipe.text_encoder):
        assert not m.training and not any(p.requires_grad for p in m.parameters())


def test_shape_range_and_seed_determinism(decoder):
    grids = _grids(3)
    a = decoder.decode(grids, ["a", "a", "a"], 64, 96, [1, 1, 2])
    b = decoder.decode(grids, ["a", "a", "a"], 64, 96, [1, 1, 2])
    assert a.shape == (3, 3, 64, 96) and a.dtype == torch.float32
    assert a.min() >= 0 and a.max() <= 1
    assert torch.equal(a, b)  # same inputs, same seeds -> bitwise identical
    c = decoder.decode(grids, ["a", "a", "a"], 64, 96, [9, 9, 9])
    assert (a - c).abs().max() > 1e-2  # the seed matters


def test_identical_grids_same_seed_identical_images(tiny_model_dir, decoder):
    grids = _grids(1).repeat(3, 1)
    # in one DiT batch, CPU GEMMs may round rows differently at the 1e-7 level
    together = decoder.decode(grids, ["p 'X'"] * 3, 64, 96, [4, 4, 4])
    torch.testing.assert_close(together[0], together[1], rtol=0, atol=1e-5)
    torch.testing.assert_close(together[0], together[2], rtol=0, atol=1e-5)
    # one row per DiT call: the same computation, bitwise identical
    single = ImageDecoder(tiny_model_dir, DecoderConfig(num_inference_steps=3, batch_size=1))
    one = single.decode(grids, ["p 'X'"] * 3, 64, 96, [4, 4, 4])
    assert torch.equal(one[0], one[1]) and torch.equal(one[0], one[2])


def test_image_does_not_depend_on_other_prompts_in_the_batch(decoder):
    grids = _grids(4, seed=5)
    mixed = decoder.decode(
        grids, ["a long prompt with 'GLYPHS'", "b", "b", "a long prompt with 'GLYPHS'"], 64, 96, [3, 7, 7, 3]
    )
    alone = decoder.decode(grids[1:3], ["b", "b"], 64, 96, [7, 7])
    assert torch.equal(mixed[1:3], alone)


def test_decoder_seeds_and_offload(tiny_model_dir):
    from glm_grpo_ds.runtime.seeding import decoder_seed

    fixed = DecoderConfig(seed=100, fixed_seeds=True)
    assert [decoder_seed(fixed, step, row) for step in (0, 5) for row in (0, 2)] == [100, 102, 100, 102]
    fresh = DecoderConfig(seed=100)
    seeds = {decoder_seed(fresh, step, row) for step in (0, 5) for row in (0, 2)}
    assert len(seeds) == 4 and all(0 <= s < 2**31 for s in seeds)  # new noise per (step, row)
    off = ImageDecoder(tiny_model_dir, DecoderConfig(num_inference_steps=2, offload=True))
    img = off.decode(_grids(2), ["x", "x"], 64, 64 + 32, [0, 0])
    assert img.shape == (2, 3, 64, 96) and next(off.pipe.transformer.parameters()).device.type == "cpu"
    pil = ImageDecoder.to_pil(img)
    assert pil[0].size == (96, 64)


def test_decode_input_errors(decoder):
    with pytest.raises(ValueError, match="needs 24"):
        decoder.decode(torch.zeros(1, 10, dtype=torch.long), ["a"], 64, 96, [0])
    with pytest.raises(ValueError, match="prompts"):
        decoder.decode(_grids(2), ["a"], 64, 96, [0, 0])


def test_a_decode_with_other_settings_equals_a_decoder_made_with_them(tiny_model_dir, decoder):
    grids, prompts, seeds = _grids(2), ["a", "a"], [5, 5]
    other = ImageDecoder(tiny_model_dir, DecoderConfig(num_inference_steps=2, guidance_scale=1.0, batch_size=4))
    assert decoder.training == DecodeSettings(3, 1.5) and other.training == DecodeSettings(2, 1.0)
    theirs = other.decode(grids, prompts, 64, 96, seeds)
    assert torch.equal(decoder.decode(grids, prompts, 64, 96, seeds, other.training), theirs)
    assert not torch.equal(decoder.decode(grids, prompts, 64, 96, seeds), theirs)


def _passes(decoder, settings: DecodeSettings) -> str:
    """The DiT forwards of one image's decode in order: c = conditional, u = unconditional (tokens dropped)."""
    calls = []

    def record(module, args, kwargs):
        calls.append("u" if bool(kwargs["prior_token_drop"].all()) else "c")

    hook = decoder.pipe.transformer.register_forward_pre_hook(record, with_kwargs=True)
    try:
        decoder.decode(_grids(1), ["a"], 64, 96, [0], settings)
    finally:
        hook.remove()
    return "".join(calls)


@pytest.mark.parametrize(
    "settings,passes",
    [
        (DecodeSettings(4, 1.0), "cccc"),  # guidance <= 1: no unconditional pass
        (DecodeSettings(4, 0.5), "cccc"),
        (DecodeSettings(4, 1.5), "cucucucu"),
        (DecodeSettings(4, 1.5, 4), "cucucucu"),  # guided on all 4 = guided on every step
        (DecodeSettings(4, 1.5, 2), "cucucc"),  # guidance_steps: the first 2 steps only
        (DecodeSettings(4, 1.5, 1), "cuccc"),
        # a hand-made setting the config refuses (the profilers build their own): 0 guided is none, not all; more
        # than the steps is every step (it guided every step, and the plans counted none / forwards never run)
        (DecodeSettings(4, 1.5, 0), "cccc"),
        (DecodeSettings(4, 1.5, 6), "cucucucu"),
    ],
)
def test_the_dit_forwards_of_a_decode(decoder, settings, passes):
    assert _passes(decoder, settings) == passes and settings.num_inference_steps + settings.guided_steps == len(passes)


def test_guidance_on_the_first_steps_only(decoder):
    grids, prompts, seeds = _grids(2, seed=3), ["a", "a"], [5, 6]
    every = decoder.decode(grids, prompts, 64, 96, seeds, DecodeSettings(4, 1.5))
    assert torch.equal(decoder.decode(grids, prompts, 64, 96, seeds, DecodeSettings(4, 1.5, 4)), every)
    first2 = decoder.decode(grids, prompts, 64, 96, seeds, DecodeSettings(4, 1.5, 2))
    unguided = decoder.decode(grids, prompts, 64, 96, seeds, DecodeSettings(4, 1.0))
    assert (first2 - every).abs().max() > 1e-3 and (first2 - unguided).abs().max() > 1e-3
    # the pipeline's guidance is back at the next call's own setting
    assert torch.equal(decoder.decode(grids, prompts, 64, 96, seeds, DecodeSettings(4, 1.5)), every)
    assert DecodeSettings(4, 1.5, 2).describe() == "4 DiT steps, guidance 1.5 on the first 2"
    assert DecodeSettings(4, 1.5, 4).describe() == DecodeSettings(4, 1.5).describe() == "4 DiT steps, guidance 1.5"


@pytest.mark.slow  # an inductor compile of the DiT block (~40 s on 2 cores)
def test_compiled_blocks_decode_the_eager_images(tiny_model_dir, decoder):
    """decoder.compile: the DiT's blocks through torch.compile (inductor on the CPU) render the eager decoder's
    images to fp32 rounding."""
    grids, prompts, seeds = _grids(2, seed=7), ["p 'AB'", "p 'AB'"], [1, 2]
    compiled = ImageDecoder(tiny_model_dir, DecoderConfig(num_inference_steps=3, batch_size=4, compile=True))
    blocks = compiled.pipe.transformer.transformer_blocks
    assert all(b._compiled_call_impl is not None for b in blocks)
    eager = decoder.decode(grids, prompts, 64, 96, seeds)
    torch.testing.assert_close(compiled.decode(grids, prompts, 64, 96, seeds), eager, rtol=0, atol=1e-5)


@pytest.mark.slow  # an inductor compile of the FP8 DiT block (~25 s on 2 cores)
def test_compiled_fp8_blocks_decode_the_eager_fp8_images(tiny_model_dir, cpu_fp8):
    """The FP8 linears inside the compiled blocks (the quantization fused on a GPU): the eager FP8 images."""
    grids, prompts, seeds = _grids(2, seed=7), ["p 'AB'", "p 'AB'"], [1, 2]
    fp8 = DecoderConfig(num_inference_steps=3, batch_size=4, fp8=True)
    fp8_eager = ImageDecoder(tiny_model_dir, fp8).decode(grids, prompts, 64, 96, seeds)
    fp8_compiled = ImageDecoder(tiny_model_dir, dataclasses.replace(fp8, compile=True))
    torch.testing.assert_close(fp8_compiled.decode(grids, prompts, 64, 96, seeds), fp8_eager, rtol=0, atol=1e-5)


def test_the_math_attention_kernel_decodes_the_same_images(tiny_model_dir, decoder, monkeypatch):
    """decoder.attention=sdpa_math: exact attention in another kernel, the same images to fp32 rounding; the kernel
    is asked for in every attention of the math decode and in none of the default one (else the option would be a
    no-op that this comparison could not tell from the reference)."""
    asked = []
    sdpa_kernel = torch.nn.attention.sdpa_kernel

    def recording(backends, *args, **kwargs):  # diffusers' native math backend enters torch's context per call
        asked.append(backends)
        return sdpa_kernel(backends, *args, **kwargs)

    monkeypatch.setattr(torch.nn.attention, "sdpa_kernel", recording)
    grids, prompts, seeds = _grids(2, seed=7), ["p 'AB'", "p 'AB'"], [1, 2]
    eager = decoder.decode(grids, prompts, 64, 96, seeds)
    assert asked == []
    math_cfg = DecoderConfig(num_inference_steps=3, batch_size=4, attention="sdpa_math")
    math_kernel = ImageDecoder(tiny_model_dir, math_cfg)
    images = math_kernel.decode(grids, prompts, 64, 96, seeds)
    blocks = len(math_kernel.pipe.transformer.transformer_blocks)
    assert len(asked) >= blocks * 3 and set(asked) == {torch.nn.attention.SDPBackend.MATH}  # each block, each step
    torch.testing.assert_close(images, eager, rtol=0, atol=1e-5)


def test_fp8_linears_move_the_images_a_little(tiny_model_dir, decoder, cpu_fp8):
    """decoder.fp8: the block linears in e4m3 move the images a little (measured 1.9e-3 at most on this DiT), not
    nothing (then the option would be a no-op), and leave the modulation and the VAE alone."""
    grids, prompts, seeds = _grids(2, seed=7), ["p 'AB'", "p 'AB'"], [1, 2]
    eager = decoder.decode(grids, prompts, 64, 96, seeds)
    fp8 = ImageDecoder(tiny_model_dir, DecoderConfig(num_inference_steps=3, batch_size=4, fp8=True))
    assert fp8.pipe.transformer.transformer_blocks[0].ff.net[2].weight.dtype == torch.float8_e4m3fn
    assert fp8.pipe.vae.dtype == torch.float32
    diff = (fp8.decode(grids, prompts, 64, 96, seeds) - eager).abs().max()
    assert 1e-5 < diff < 2e-2, diff


def test_eval_decode_defaults_are_the_pipelines_own():
    import inspect

    from diffusers import GlmImagePipeline

    call = inspect.signature(GlmImagePipeline.__call__).parameters
    own = (call["num_inference_steps"].default, call["guidance_scale"].default)
    assert own == (50, 1.5) and pipeline_call_defaults() == DecodeSettings(*own)  # GLM-Image's documented defaults
    assert resolve_settings(None, None) == DecodeSettings(*own)
    assert resolve_settings(4, None) == DecodeSettings(4, 1.5) and resolve_settings(None, 1.0) == DecodeSettings(50, 1)


# Run in a fresh process: memory a process has freed earlier stays mapped and would hide the peak.
MEASURE = """
import json, sys, threading, time
import torch
from glm_grpo_ds.config import DecoderConfig
from glm_grpo_ds.decoder import ImageDecoder

def anon_mib():
    return next(int(l.split()[1]) / 1024 for l in open("/proc/self/status") if l.startswith("RssAnon:"))

ImageDecoder(sys.argv[2], DecoderConfig(dtype="bf16"), device="meta")  # imports and first-call costs, not measured
samples, done = [], threading.Event()
def watch():
    while not done.is_set():
        samples.append(anon_mib())
        time.sleep(0.002)
base, watcher = anon_mib(), threading.Thread(target=watch)
watcher.start()
dec = ImageDecoder(sys.argv[1], DecoderConfig(dtype="bf16"), device="meta")
done.set()
watcher.join()
params = [p for m in (dec.pipe.transformer, dec.pipe.vae, dec.pipe.text_encoder) for p in m.parameters()]
weights = sum(p.numel() for p in params) * 2 / 2**20
devices, dtypes = sorted({p.device.type for p in params}), sorted({str(p.dtype) for p in params})
peak = max(samples + [base]) - base
print(json.dumps({"peak_mib": peak, "weights_mib": weights, "devices": devices, "dtypes": dtypes}))
"""


def test_weights_go_to_the_device_as_they_are_read(tiny_model_dir, tmp_path):
    """Every rank loads the decoder: its weights must not sit whole in host memory on the way to the GPU
    (8 ranks x 15 GB per node). `meta` stands in for the GPU (the same device_map path); a larger DiT
    makes the difference measurable: the old path (CPU load, then .to) held all of it, ~160 MiB here."""
    import json
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from diffusers import GlmImagePipeline, GlmImageTransformer2DModel

    root = tmp_path / "model"
    shutil.copytree(tiny_model_dir, root)
    cfg = {k: v for k, v in json.loads((root / "transformer" / "config.json").read_text()).items() if k[0] != "_"}
    shutil.rmtree(root / "transformer")
    cfg.update(num_layers=24, num_attention_heads=8, attention_head_dim=64)
    GlmImageTransformer2DModel(**cfg).save_pretrained(root / "transformer")  # fp32 on disk, loaded as bf16

    repo = Path(__file__).resolve().parents[2]
    # a fixed mmap threshold: freed tensors go back to the OS at once, so the peak is what was alive
    env = dict(os.environ, PYTHONPATH=str(repo), OMP_NUM_THREADS="1", MALLOC_MMAP_THRESHOLD_="131072")
    proc = subprocess.run(
        [sys.executable, "-c", MEASURE, str(root), str(tiny_model_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["devices"] == ["meta"] and r["dtypes"] == ["torch.bfloat16"], r
    assert r["weights_mib"] > 150 and r["peak_mib"] < 0.4 * r["weights_mib"], r

    # on the CPU the weights are those of the whole-pipeline load, bitwise
    ref = GlmImagePipeline.from_pretrained(root, vision_language_encoder=None, processor=None, dtype=torch.float32)
    mine = ImageDecoder(root, DecoderConfig())
    for name in ("transformer", "vae", "text_encoder"):
        a, b = getattr(ref, name).state_dict(), getattr(mine.pipe, name).state_dict()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name


def test_a_batch_of_glyph_embeddings_of_two_lengths_changes_the_dit_output_even_with_its_mask():
    """Why a decode batches only rows of one prompt, and why the conditional and unconditional passes are not one
    batched forward (benchmarks/glyph_padding.py, docs/memory-and-speed.md "The DiT decode"): zero tokens padded in
    front of the glyph embedding move the DiT's output, and the transformer's own ``attention_mask`` (a float 0/1
    matrix sdpa adds to the scores) does not hide them. When a diffusers release masks for real, this fails: then a
    batched guidance forward can be built and checked against the pipeline."""
    from benchmark_scripts import load_benchmark  # tests/benchmark_scripts.py

    gaps = load_benchmark("glyph_padding").padding_gaps(glyph_tokens=5, pad=7)
    assert gaps["unmasked"] > 1e-3 * gaps["scale"] and gaps["masked"] > 1e-3 * gaps["scale"]


def test_decode_agreement_warms_up_every_dit_shape_its_timed_decodes_meet(decoder):
    """decode-agreement times the reference decode first; its warm-up decoded one image, so with decoder.compile the
    reference alone paid the recompiles of every other DiT batch shape (the batch's split, each prompt's glyph
    length, guided or not) and every candidate looked faster. Each shape the timed decodes meet is warmed now."""
    from glm_grpo_ds.commands.decode_agreement import warm_up_shapes

    grids, seeds = _grids(6, seed=3), list(range(6))
    prompts = ["a 'AB'", "b", "c 'A LONGER TEXT'", "d", "e 'AB'", "f"]
    shapes = []

    def record(module, args, kwargs):
        shapes.append(tuple(tuple(v.shape) for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)))

    hook = decoder.pipe.transformer.register_forward_pre_hook(record, with_kwargs=True)
    try:
        every = [DecodeSettings(3, 1.5), DecodeSettings(2, 1.0), DecodeSettings(3, 1.5, 1)]
        decoder.decode(grids[:1], prompts[:1], 64, 96, seeds[:1])  # the old warm-up
        one_image, shapes[:] = set(shapes), []
        warm_up_shapes(decoder, grids, prompts, (64, 96), seeds, every)
        warmed, shapes[:] = set(shapes), []
        for settings in every:
            decoder.decode(grids, prompts, 64, 96, seeds, settings)
    finally:
        hook.remove()
    assert set(shapes) <= warmed, set(shapes) - warmed
    assert set(shapes) - one_image  # what the old warm-up left to the reference's timed decode


def _dit_rows(decoder, run) -> int:
    """The image rows the DiT's blocks computed while ``run()`` decoded (a pre-hook on its first block)."""
    (name,) = decoder.pipe.transformer._repeated_blocks
    block = next(m for m in decoder.pipe.transformer.modules() if type(m).__name__ == name)
    rows = []
    hook = block.register_forward_pre_hook(lambda module, args: rows.append(args[0].shape[0]))
    try:
        out = run()
    finally:
        hook.remove()
    return sum(rows), out


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    """diffusers' own pipeline of the tiny model, none of the decoder's wrappers."""
    from glm_grpo_ds.decoder.image_decoder import load_pipeline

    pipe = load_pipeline(tiny_model_dir, torch.float32, torch.device("cpu"))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_a_groups_first_unconditional_pass_is_computed_once_with_the_pipelines_images(decoder, reference):
    """The G rows of a group share a seed: the first step's unconditional pass (noise, empty prompt, tokens dropped)
    is one row's (decoder/first_uncond.py). Decoded with it shared, a group of 6 in DiT batches of 4 and 2 runs the
    DiT on 2*6*3 - 5 rows and its images are diffusers' own pipeline's up to batch rounding; rows of two seeds in one
    batch share nothing."""
    from glm_grpo_ds.decoder.settings import guidance_stop

    grids, prompt = _grids(6, seed=11), "p 'X'"

    def theirs(seeds, idx):
        with torch.no_grad():
            return reference(
                callback_on_step_end=guidance_stop(decoder.training),
                prompt=[prompt] * len(idx),
                prior_token_ids=grids[idx],
                height=64,
                width=96,
                num_inference_steps=3,
                guidance_scale=1.5,
                latents=decoder._latents([seeds[i] for i in idx], 64, 96),
                output_type="pt",
            ).images

    for seeds, passes in (([7] * 6, 2 * 6 * 3 - 5), ([7, 7, 8, 8, 7, 7], 2 * 6 * 3 - 1)):
        rows, ours = _dit_rows(decoder, lambda s=seeds: decoder.decode(grids, [prompt] * 6, 64, 96, s))
        assert rows == passes, seeds  # first batch of two seeds: unshared; the second batch's one seed: 1 row
        expected = torch.cat([theirs(seeds, [0, 1, 2, 3]), theirs(seeds, [4, 5])])
        torch.testing.assert_close(ours, expected, rtol=0, atol=1e-5)
    unguided = _dit_rows(decoder, lambda: decoder.decode(grids, [prompt] * 6, 64, 96, [7] * 6, DecodeSettings(3, 1.0)))
    assert unguided[0] == 6 * 3  # no unconditional pass to share


def test_the_glyph_encoder_runs_once_per_text_of_a_decode_with_the_pipelines_embeddings(decoder):
    """A DiT batch of rows of one prompt encoded its quoted text once per row and the empty negative prompt once more
    per row (decoder/glyph_memo.py): 6 rows in batches of 4 and 2 ran the glyph encoder 12 times, now 2. The
    embeddings are those of diffusers' own method on the same modules, bit for bit; two texts are left to it."""
    calls = []
    hook = decoder.pipe.text_encoder.encoder.register_forward_pre_hook(lambda module, args: calls.append(1))
    memo, cpu = decoder.pipe._get_glyph_embeds, torch.device("cpu")
    try:
        decoder.decode(_grids(6), ["p 'X'"] * 6, 64, 96, [3] * 6)
        assert len(calls) == 2
        for prompts in (["p 'HELLO'"] * 3, [""] * 2, ["p 'A'", "q 'LONGER TEXT'"]):
            ours = memo(prompts, 2048, cpu, torch.float32)
            assert torch.equal(ours, memo._encode(prompts, 2048, cpu, torch.float32)), prompts
    finally:
        hook.remove()
        memo.forget()
