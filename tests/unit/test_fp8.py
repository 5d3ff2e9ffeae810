"""FP8 linear layers of the frozen DiT (glm_grpo_ds/decoder/fp8.py) and what a device may run
(glm_grpo_ds/decoder/compute.py): values computed by hand, row independence, the layers chosen, the refusals."""

import pytest
import torch

from glm_grpo_ds.config import ConfigError, DecoderConfig
from glm_grpo_ds.decoder.compute import check_device, device_problems
from glm_grpo_ds.decoder.fp8 import FP8Linear, fp8_supported, fp8_targets, is_fp8, quantize_rows, to_fp8


def test_values_by_hand(cpu_fp8):
    # W = I: each row's largest entry 1 -> 448 (e4m3's largest), exactly representable, so q(W) * s = I exactly.
    # x = [2, 0.3, 0, ...]: scale 2/448; 0.3 -> 67.2, which e4m3 (3 mantissa bits: 64, 72, ... in [64, 128))
    # rounds to 64 -> 64 * 2 / 448 = 0.2857...; 2 -> 448 exactly.
    linear = torch.nn.Linear(16, 16, bias=True)
    with torch.no_grad():
        linear.weight.copy_(torch.eye(16))
        linear.bias.copy_(torch.arange(16.0) / 10)
    x = torch.zeros(1, 16)
    x[0, 0], x[0, 1] = 2.0, 0.3
    y = FP8Linear(linear)(x)
    expected = torch.arange(16.0) / 10
    expected[0] += 2.0
    expected[1] += 64 * 2 / 448
    torch.testing.assert_close(y[0], expected, rtol=0, atol=1e-6)
    assert abs(float(linear(x)[0, 1]) - 0.4) < 1e-6  # the unquantized layer: 0.3 + 0.1


def test_quantize_rows_scales_each_row_to_the_e4m3_range():
    x = torch.tensor([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0], [300.0, 1.0, -30.0]])
    q, scale = quantize_rows(x)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (3, 1)
    torch.testing.assert_close(scale[:, 0], torch.tensor([2 / 448, 1e-12 / 448, 300 / 448]))
    assert q.float().abs().amax(dim=1).tolist() == [448.0, 0.0, 448.0]  # the row's largest magnitude hits 448
    assert torch.equal(x, torch.tensor([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0], [300.0, 1.0, -30.0]]))  # input intact


def test_rows_are_independent_and_close_to_full_precision(cpu_fp8):
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48)
    fp8 = FP8Linear(linear)
    x = torch.randn(3, 7, 64)  # 21 rows: the scaled matmul needs no multiple of 16 there
    y = fp8(x)
    assert y.shape == (3, 7, 48) and y.dtype == torch.float32
    # per-token scales: a row's result does not depend on the rows beside it
    torch.testing.assert_close(y[1, 2], fp8(x[1, 2:3])[0], rtol=0, atol=1e-6)
    rel = (y - linear(x)).norm() / linear(x).norm()
    assert 1e-3 < rel < 0.06, rel  # e4m3 keeps 3 mantissa bits: a few percent, not zero
    bf16 = FP8Linear(linear.to(torch.bfloat16))(x.to(torch.bfloat16))
    assert bf16.dtype == torch.bfloat16
    assert device_problems(DecoderConfig(fp8=True), torch.device("cpu"), torch.float32) == []


def test_the_block_linears_are_converted_and_the_rest_is_not(tiny_model_dir):
    from diffusers import GlmImageTransformer2DModel

    dit = GlmImageTransformer2DModel.from_pretrained(tiny_model_dir / "transformer")
    names = [name for name, _ in fp8_targets(dit)]
    per_block = ["attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", "ff.net.0.proj", "ff.net.2"]
    assert names == [f"transformer_blocks.{b}.{n}" for b in range(len(dit.transformer_blocks)) for n in per_block]
    modules = dict(dit.named_modules())
    converted = sum(sum(p.numel() for p in modules[n].parameters()) for n in names)  # weights and biases
    before = sum(p.numel() for p in dit.parameters())
    assert not is_fp8(dit) and to_fp8(dit) == len(names) and is_fp8(dit)
    assert sum(p.numel() for p in dit.parameters()) == before - converted  # now buffers: fp8 weights, scales
    assert isinstance(dit.transformer_blocks[0].norm1.linear, torch.nn.Linear)  # the modulation stays
    assert not isinstance(dit.proj_out, FP8Linear)
    assert dit.transformer_blocks[0].attn1.to_q.weight.dtype == torch.float8_e4m3fn
    with pytest.raises(ValueError, match="has no transformer_blocks"):
        fp8_targets(torch.nn.Linear(16, 16))


def test_what_a_device_may_run():
    cpu, meta = torch.device("cpu"), torch.device("meta")
    assert "not supported on meta" in fp8_supported(meta)
    assert device_problems(DecoderConfig(attention="sdpa_math"), cpu, torch.float32) == []
    assert device_problems(DecoderConfig(attention="sdpa_cudnn"), cpu, torch.float32) == [
        "decoder.attention=sdpa_cudnn needs a CUDA GPU (this run decodes on cpu); use sdpa"
    ]
    problems = device_problems(DecoderConfig(fp8=True, attention="flash_attn"), meta, torch.float32)
    assert problems[0].startswith("decoder.attention=flash_attn needs a CUDA GPU")
    assert problems[1] == "decoder.fp8=true: FP8 matmuls (e4m3fn) are not supported on meta here; set decoder.fp8=false"
    with pytest.raises(ConfigError) as err:
        check_device(DecoderConfig(fp8=True, attention="sdpa_flash"), meta, torch.float32)
    assert len(str(err.value).splitlines()) == 2


def test_a_cpu_without_per_row_fp8_products_is_refused(monkeypatch):
    """torch 2.11's CPU scaled matmul (the floor's) takes one scale per tensor: decoder.fp8 on such a CPU is one line
    naming the torch, not a traceback from the first decode."""

    def per_tensor_only(*args, **kwargs):  # what torch 2.11 raises on the CPU (c10::Error is a RuntimeError)
        raise RuntimeError("INTERNAL ASSERT FAILED. Now _scaled_mm only supports per-tensor scaling for CPU backend.")

    monkeypatch.setattr(torch, "_scaled_mm", per_tensor_only)
    why = f"this torch ({torch.__version__}) multiplies FP8 with per-row scales on a GPU only, not on the CPU"
    assert fp8_supported(torch.device("cpu")) == why
    assert device_problems(DecoderConfig(fp8=True), torch.device("cpu"), torch.float32) == [
        f"decoder.fp8=true: {why}; set decoder.fp8=false"
    ]


def test_what_a_gpu_may_run(monkeypatch):
    """The GPU's refusals, its properties stood in for (this machine has none): FP8 below compute capability 8.9 or on
    ROCm, a GPU decoder not in bf16, flash kernels below their generation or without their package."""
    import importlib.util

    from glm_grpo_ds.decoder import compute

    gpu = torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "A100")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.version, "hip", None)
    assert (
        fp8_supported(gpu) == "A100 (compute capability 8.0) has no FP8 tensor cores; they need 8.9+ (L40S, H100, H200)"
    )
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert "not supported on ROCm" in fp8_supported(gpu)
    monkeypatch.setattr(compute, "fp8_supported", lambda device: None)  # an H100, say
    assert device_problems(DecoderConfig(fp8=True), gpu, torch.float16) == [
        "decoder.fp8=true on a GPU needs decoder.dtype bf16 (got fp16); set decoder.dtype=bf16"
    ]
    assert device_problems(DecoderConfig(fp8=True), gpu, torch.bfloat16) == []
    assert device_problems(DecoderConfig(attention="sdpa_cudnn"), gpu, torch.float32) == [
        "decoder.attention=sdpa_cudnn needs decoder.dtype bf16 or fp16 (got fp32); use sdpa"
    ]
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    assert device_problems(DecoderConfig(attention="sdpa_flash"), gpu, torch.bfloat16) == [
        "decoder.attention=sdpa_flash needs a GPU of compute capability 8.0+ (A100); use sdpa"
    ]
    assert device_problems(DecoderConfig(attention="sdpa_cudnn"), gpu, torch.bfloat16) == []
    if importlib.util.find_spec("flash_attn") is None:
        assert device_problems(DecoderConfig(attention="flash_attn"), gpu, torch.bfloat16) == [
            "decoder.attention=flash_attn but flash-attn is not installed; install it or use sdpa"
        ]
    monkeypatch.setattr(compute.importlib.util, "find_spec", lambda name: object())  # flash-attn 3 installed
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 9))
    assert device_problems(DecoderConfig(attention="flash_attn_3"), gpu, torch.bfloat16) == [
        "decoder.attention=flash_attn_3 needs a GPU of compute capability 9.0+ (A100); use sdpa"
    ]


def test_every_attention_choice_has_a_backend():
    import typing

    from glm_grpo_ds.decoder.compute import ATTENTION_BACKENDS

    choices = typing.get_args(typing.get_type_hints(DecoderConfig)["attention"])
    assert set(choices) == set(ATTENTION_BACKENDS)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the GPU's own kernel: a GPU run checks it")
def test_fp8_linear_on_the_gpu():
    """On a GPU (the CPU's scaled matmul skips the layout checks): an odd number of rows, a bias, bf16, close to
    F.linear; the device passes the refusals' probe."""
    gpu = torch.device("cuda")
    if fp8_supported(gpu):
        pytest.skip(fp8_supported(gpu))
    torch.manual_seed(0)
    linear = torch.nn.Linear(256, 512, device=gpu, dtype=torch.bfloat16)
    x = torch.randn(3, 37, 256, device=gpu, dtype=torch.bfloat16)
    y = FP8Linear(linear)(x)
    ref = linear(x)
    assert y.dtype == torch.bfloat16 and ((y - ref).float().norm() / ref.float().norm()) < 0.06
