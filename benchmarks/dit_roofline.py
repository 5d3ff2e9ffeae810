"""The floor of the frozen DiT decode on one H200, computed from its operators: how far the measured 0.289 s per
guided image-step lies above it, and how much of it fusing the memory-bound operators (``decoder.compile``) or FP8
matmuls (``decoder.fp8``) could remove at most (issue #52; docs/memory-and-speed.md "The DiT decode").

One GLM-Image DiT block at its real width (32 heads x 128, diffusers' ``GlmImageTransformerBlock``) runs one forward
on the ``meta`` device, eager as diffusers runs it (no memory, no arithmetic: shapes only), at ``--batch`` rows of
``--size``² (image tokens (size/16)², plus ``--glyph`` glyph tokens). A dispatch mode records every operator that
does work (views and allocations left out, as glm-grpo profile decode-counts does): its FLOPs (torch's own formulas of
``torch.utils.flop_counter`` for the matmuls) and the bytes it reads and writes (each tensor argument and result
once, at most its storage). The attention is taken whole, as a fused kernel runs it (FlashAttention / cuDNN: reads
q, k, v, writes the output; 4 x batch x heads x S² x 128 FLOPs), not as the meta device's math decomposition. Each
operator's floor is the longer of its FLOPs at the card's peak and its bytes at the card's bandwidth; per guided
image-step a block's floor counts 30 blocks x 2 forwards (conditional and unconditional) / batch rows. Left out: the
operators outside the blocks (the patch and prior projections, the output layer; <= 1 % of the matmul FLOPs) and
the scheduler step.

    python benchmarks/dit_roofline.py                 # batch 8, 1024², 16 glyph tokens: the issue's setting
    python benchmarks/dit_roofline.py --fp8           # the block's linears as decoder.fp8 makes them (eager)
    python benchmarks/dit_roofline.py --batch 1 --size 512
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry, sdpa_flop_count

from glm_grpo_ds.memory.gpu_figures import CARD, CARD_BYTES_PER_S
from glm_grpo_ds.memory.gpu_figures import GUIDED_IMAGE_STEP_S as MEASURED_S  # eager sdpa, batch 8, 1024², the H200
from glm_grpo_ds.memory.sizes import BUILTIN_DIT
from glm_grpo_ds.memory.step_time import CARD_FLOPS
from glm_grpo_ds.profiling.decode_counters import METADATA_OPS, is_view

FP8_FLOPS = 1979e12  # the H200's dense FP8 peak (twice its bf16 one)
ATTENTION = "attention"
MATMULS = frozenset({"mm", "addmm", "bmm", "_scaled_mm"})


@dataclass
class Counts:
    """Per operator name: calls, FLOPs, bytes and floor seconds of one block forward."""

    calls: collections.Counter = field(default_factory=collections.Counter)
    flops: collections.Counter = field(default_factory=collections.Counter)
    bytes: collections.Counter = field(default_factory=collections.Counter)
    floor_s: collections.Counter = field(default_factory=collections.Counter)

    def add(self, name: str, flops: int, nbytes: int) -> None:
        peak = FP8_FLOPS if name == "_scaled_mm" else CARD_FLOPS
        self.calls[name] += 1
        self.flops[name] += flops
        self.bytes[name] += nbytes
        self.floor_s[name] += max(flops / peak, nbytes / CARD_BYTES_PER_S)


def tensor_bytes(values) -> int:
    """The bytes of every tensor among ``values`` (nested), each at most its storage (a slice of a larger tensor
    reads its own elements; an expanded one its storage's)."""
    total = 0
    for t in tree_leaves(values):
        if isinstance(t, torch.Tensor):
            total += min(t.numel() * t.element_size(), t.untyped_storage().nbytes())
    return total


class _Attention(TorchFunctionMode):
    """``F.scaled_dot_product_attention`` counted as one fused kernel and answered with its output's shape."""

    def __init__(self, counts: Counts):
        super().__init__()
        self.counts = counts

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            named = dict(zip(("query", "key", "value"), args)) | kwargs  # diffusers passes them by name
            q, k, v = named["query"], named["key"], named["value"]
            out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)
            self.counts.add(ATTENTION, sdpa_flop_count(q.shape, k.shape, v.shape), tensor_bytes((q, k, v, out)))
            return out
        return func(*args, **kwargs)


class _Operators(TorchDispatchMode):
    """Every operator that does work: its FLOPs (matmuls, torch's formulas) and bytes."""

    def __init__(self, counts: Counts):
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        if not (is_view(func) or name in METADATA_OPS):
            formula = flop_registry.get(func.overloadpacket)
            flops = formula(*args, **kwargs, out_val=out) if name in MATMULS and formula else 0
            self.counts.add(name, flops, tensor_bytes((args, kwargs, out)))
        return out


def count_block(batch: int = 8, size: int = 1024, glyph: int = 16, fp8: bool = False, dims: dict | None = None):
    """One forward of one DiT block at ``dims`` (heads, head_dim, time_embed_dim; default GLM-Image's) on the meta
    device in bf16: its :class:`Counts`."""
    from diffusers.models.transformers.transformer_glm_image import GlmImageTransformerBlock

    from glm_grpo_ds.decoder.fp8 import to_fp8

    dims = dims or {"heads": BUILTIN_DIT["num_attention_heads"], "head_dim": BUILTIN_DIT["attention_head_dim"]}
    heads, head_dim, time_dim = dims["heads"], dims["head_dim"], dims.get("time_embed_dim", 512)
    hidden, tokens = heads * head_dim, (size // 16) ** 2
    counts = Counts()
    with torch.device("meta"):
        block = GlmImageTransformerBlock(hidden, heads, head_dim, time_dim).to(torch.bfloat16).eval()
        if fp8:
            holder = torch.nn.Module()  # to_fp8 converts the linears of a DiT's transformer_blocks
            holder.transformer_blocks = torch.nn.ModuleList([block])
            to_fp8(holder)
        image = torch.empty(batch, tokens, hidden, dtype=torch.bfloat16)
        text = torch.empty(batch, glyph, hidden, dtype=torch.bfloat16)
        temb = torch.empty(batch, time_dim, dtype=torch.bfloat16)
        rope = (torch.empty(tokens, head_dim), torch.empty(tokens, head_dim))  # fp32, as the DiT's rope makes them
        with torch.no_grad(), _Attention(counts), _Operators(counts):
            block(image, text, temb, rope)
    return counts


def report(
    counts: Counts, batch: int, layers: int = BUILTIN_DIT["num_layers"], measured_s: float | None = MEASURED_S
) -> list[str]:
    """The table per operator (per guided image-step: ``layers`` blocks x 2 forwards / ``batch``) and the totals."""
    per_step = layers * 2 / batch
    ms = {name: 1e3 * s * per_step for name, s in counts.floor_s.items()}
    lines = [f"{'operator':<26}{'calls':>6}{'GFLOP':>10}{'GB':>9}{'floor ms':>10}  bound"]
    for name in sorted(ms, key=ms.get, reverse=True):
        memory_bound = counts.bytes[name] / CARD_BYTES_PER_S >= counts.floor_s[name] * (1 - 1e-9)
        lines.append(
            f"{name:<26}{counts.calls[name]:>6}{counts.flops[name] * per_step / 1e9:>10.1f}"
            f"{counts.bytes[name] * per_step / 1e9:>9.2f}{ms[name]:>10.2f}  {'memory' if memory_bound else 'compute'}"
        )
    matmul = sum(v for k, v in ms.items() if k in MATMULS)
    attention = ms.get(ATTENTION, 0.0)
    memory = sum(ms.values()) - matmul - attention
    total = matmul + attention + memory
    lines += [
        f"per guided image-step ({layers} blocks x 2 forwards / {batch} rows), floors on {CARD}: matmuls "
        f"{matmul:.1f} ms + attention {attention:.1f} ms + the other operators {memory:.1f} ms (memory-bound, "
        f"unfused) = {total:.1f} ms",
        f"fusing every other operator away (the most decoder.compile could remove at these floors): "
        f"{matmul + attention:.1f} ms",
    ]
    if measured_s:
        lines.append(
            f"measured (eager sdpa, batch 8, 1024², H200, issue #52): {1e3 * measured_s:.0f} ms = "
            f"{1e3 * measured_s / total:.2f}x this floor"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=8, help="rows of one prompt per DiT forward (decoder.batch_size)")
    p.add_argument("--size", type=int, default=1024, help="image height = width in pixels (a multiple of 32)")
    p.add_argument("--glyph", type=int, default=16, help="glyph (quoted text) tokens beside the image tokens")
    p.add_argument("--fp8", action="store_true", help="the block's linears in float8 e4m3 (decoder.fp8, eager)")
    a = p.parse_args(argv)
    if a.batch < 1 or a.glyph < 0 or a.size < 32 or a.size % 32:
        print("dit_roofline: give --batch >= 1, --glyph >= 0 and --size a positive multiple of 32", file=sys.stderr)
        return 2
    counts = count_block(a.batch, a.size, a.glyph, a.fp8)
    print(
        f"The DiT's blocks on {CARD}, computed: batch {a.batch}, {a.size}² ({(a.size // 16) ** 2} image + {a.glyph} "
        f"glyph tokens), bf16{' with FP8 linears' if a.fp8 else ''}, eager (diffusers' operators)"
    )
    measured = MEASURED_S if (a.batch, a.size, a.fp8) == (8, 1024, False) else None
    print("\n".join(report(counts, a.batch, measured_s=measured)))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    raise SystemExit(main())
