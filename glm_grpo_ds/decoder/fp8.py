"""FP8 linear layers for the frozen DiT (``decoder.fp8``): half the weight bytes, Hopper's FP8 tensor cores.

Each selected ``nn.Linear`` becomes an :class:`FP8Linear`: its weight stored once as float8 e4m3 with one fp32
scale per output row (per channel), and at every call the input scaled per row (per token) to e4m3, the two
multiplied by torch's scaled matmul (fp32 accumulation, the output in the input's dtype, the bias added by the
kernel). This is the "dynamic activation, per-row weight" recipe of torchao's float8 inference, on torch's own op
(``torch._scaled_mm``), which runs on a CPU too: the numerics a GPU run has are then measurable anywhere, e.g. by
``glm-grpo decode-agreement --candidate 8:1.5+fp8``; only a GPU with FP8 tensor cores makes it fast.

Which layers: every linear of the DiT's transformer blocks that a token stream passes through (the attention's
q/k/v/out projections and the feed-forward's two), with both sides a multiple of 16 (what the scaled matmul needs of
the weight and of the input's width; the number of rows is free).
Not the blocks' AdaLN modulation (``norm1.linear``: one row per image, nothing to gain, and it sets every scale and
gate of the block), nor anything outside the blocks (patch and timestep embeddings, the output projection).

Imports only torch.

    n = to_fp8(pipe.transformer)        # in place; the number of linears replaced
"""

from __future__ import annotations

import torch
from torch import nn

E4M3 = torch.float8_e4m3fn
E4M3_MAX = torch.finfo(E4M3).max  # 448
QUANTIZE_BYTES = 5  # per input element while an input is quantized: its fp32 copy and the e4m3 result
TILE = 16  # the scaled matmul needs both sides of the weight (so the input's width too) in multiples of this
SKIPPED = ("norm1.linear",)  # inside a block, not converted (see the module docstring)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [R, K]`` -> (e4m3 ``[R, K]``, fp32 scale ``[R, 1]``) with ``x ~= q * scale``: each row's largest
    magnitude maps to e4m3's largest finite value (448). An all-zero row gets a tiny scale and zeros."""
    x = x.detach()
    # eager, each pass is a trip through memory: the inf-norm reads x once (no |x| copy), the division by the fp32
    # scale writes the fp32 result directly (no separate fp32 copy of x), clamped in place: 21 bytes of traffic per
    # bf16 element instead of 33; at the peak an fp32 result and its e4m3 cast, 5 bytes (the memory plan counts them)
    amax = torch.linalg.vector_norm(x, float("inf"), dim=-1, keepdim=True).float().clamp(min=1e-12)
    scale = amax / E4M3_MAX
    q = torch.div(x, scale).clamp_(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return q, scale


class FP8Linear(nn.Module):
    """A frozen ``nn.Linear`` in float8 e4m3: ``y = (q(x) * s_x) @ (q(W) * s_W)^T + b``, per-row scales."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight, scale = quantize_rows(linear.weight)
        self.register_buffer("weight", weight)  # [N, K] row-major, so weight.t() is the column-major operand
        self.register_buffer("weight_scale", scale.reshape(1, -1))  # [1, N]: one per output column of y
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, scale = quantize_rows(x.reshape(-1, self.in_features))
        bias = None if self.bias is None else self.bias.to(x.dtype)
        y = torch._scaled_mm(q, self.weight.t(), scale_a=scale, scale_b=self.weight_scale, bias=bias, out_dtype=x.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, e4m3"


def fp8_targets(transformer: nn.Module) -> list[tuple[str, nn.Linear]]:
    """``(name, linear)`` of every layer :func:`to_fp8` converts in ``transformer`` (a DiT with
    ``transformer_blocks``; works on the ``meta`` device, so the memory plan counts the same set)."""
    blocks = getattr(transformer, "transformer_blocks", None)
    if blocks is None:
        raise ValueError(f"{type(transformer).__name__} has no transformer_blocks to convert to fp8")
    return [
        (f"transformer_blocks.{name}", module)
        for name, module in blocks.named_modules()
        if isinstance(module, nn.Linear)
        and not name.endswith(SKIPPED)
        and module.in_features % TILE == 0
        and module.out_features % TILE == 0
    ]


def to_fp8(transformer: nn.Module) -> int:
    """Replace :func:`fp8_targets` by :class:`FP8Linear` in place (the bf16 weights freed); returns how many."""
    # names, not modules: each bf16 weight is freed as soon as its layer is replaced, so converting a loaded DiT
    # never holds both copies of more than one layer
    names = [name for name, _ in fp8_targets(transformer)]
    for name in names:
        parent, _, child = name.rpartition(".")
        owner = transformer.get_submodule(parent)
        setattr(owner, child, FP8Linear(getattr(owner, child)))
    return len(names)


def is_fp8(transformer: nn.Module) -> bool:
    """Whether :func:`to_fp8` has converted ``transformer``."""
    return any(isinstance(m, FP8Linear) for m in transformer.modules())


def fp8_supported(device: torch.device) -> str | None:
    """None where FP8 matmuls run on ``device``, else why not (for a one-line refusal). A CPU runs them where this
    torch's CPU scaled matmul takes per-row scales (slowly: for measuring their numerics; torch 2.11's takes one
    scale per tensor only); a CUDA GPU needs compute capability 8.9 (Ada, Hopper and later) and a torch build whose
    per-row scaled matmul runs there. One 16 x 16 product settles the build (ROCm GPUs use another e4m3)."""
    if device.type == "cpu":
        if _product_fails(device, torch.float32):
            return f"this torch ({torch.__version__}) multiplies FP8 with per-row scales on a GPU only, not on the CPU"
        return None
    if device.type != "cuda" or torch.version.hip:
        return f"FP8 matmuls (e4m3fn) are not supported on {'ROCm' if torch.version.hip else device.type} here"
    major, minor = torch.cuda.get_device_capability(device)
    name = torch.cuda.get_device_name(device)
    if (major, minor) < (8, 9):
        return f"{name} (compute capability {major}.{minor}) has no FP8 tensor cores; they need 8.9+ (L40S, H100, H200)"
    failure = _product_fails(device, torch.bfloat16)
    if failure:
        return f"this torch's per-row FP8 matmul fails on {name}: {failure}"
    return None


def _product_fails(device: torch.device, dtype: torch.dtype) -> str | None:
    """The first line of the error one small :class:`FP8Linear` product raises on ``device``, or None."""
    try:
        FP8Linear(nn.Linear(TILE, TILE, device=device, dtype=dtype))(torch.ones(3, TILE, device=device, dtype=dtype))
    except torch.OutOfMemoryError:  # a full GPU, not a missing kernel: the run's own line (memory/oom.py)
        raise
    except RuntimeError as err:
        return (str(err).strip().splitlines() or ["RuntimeError"])[0]
    return None
