"""benchmarks/dit_roofline.py's counts against hand-computed values on a small block (2 heads x 16, batch 2, 64²:
16 image + 4 glyph tokens): the matmul and attention FLOPs, the attention's bytes as one fused kernel, the FP8
linears, and the report's per guided image-step arithmetic. The full-width figures are a benchmark
(docs/memory-and-speed.md "The DiT decode")."""

from benchmark_scripts import load_benchmark  # noqa: E402  (tests/benchmark_scripts.py)

roof = load_benchmark("dit_roofline")
DIMS = {"heads": 2, "head_dim": 16, "time_embed_dim": 32}
B, IMAGE, GLYPH, HIDDEN = 2, 16, 4, 32  # 64² -> (64 / 16)² image tokens
S = IMAGE + GLYPH


def test_a_blocks_matmul_and_attention_flops_and_bytes_by_hand():
    c = roof.count_block(batch=B, size=64, glyph=GLYPH, dims=DIMS)
    qkvo = 4 * 2 * (B * S) * HIDDEN * HIDDEN  # q, k, v, out over text and image tokens together
    ff = 2 * 2 * (B * S) * HIDDEN * 4 * HIDDEN  # up and down, image and text tokens apart (the same rows in all)
    modulation = 2 * B * 32 * 12 * HIDDEN  # norm1.linear: temb -> 12 shifts, scales and gates
    assert c.flops["addmm"] == qkvo + ff + modulation == 1_032_192 and c.calls["addmm"] == 9
    assert c.flops[roof.ATTENTION] == 4 * B * 2 * S * S * 16 == 102_400 and c.calls[roof.ATTENTION] == 1
    assert c.bytes[roof.ATTENTION] == 4 * B * 2 * S * 16 * 2  # q, k, v read, the output written, bf16
    assert all(c.flops[name] == 0 for name in c.calls if name not in roof.MATMULS | {roof.ATTENTION})
    assert c.calls["gelu"] == 2 and c.calls["native_layer_norm"] == 6  # ff on each stream; 2 + 2 (q, k) + 2
    assert "bmm" not in c.calls and "_safe_softmax" not in c.calls  # the attention whole, not its math


def test_fp8_moves_the_token_linears_to_scaled_matmuls_with_their_quantization():
    bf16 = roof.count_block(batch=B, size=64, glyph=GLYPH, dims=DIMS)
    fp8 = roof.count_block(batch=B, size=64, glyph=GLYPH, dims=DIMS, fp8=True)
    assert fp8.calls["_scaled_mm"] == 8 and fp8.calls["addmm"] == 1  # the modulation stays in bf16
    assert fp8.flops["_scaled_mm"] + fp8.flops["addmm"] == bf16.flops["addmm"]
    assert fp8.calls["linalg_vector_norm"] == 8  # each input's per-token scale


def test_the_report_scales_a_block_to_a_guided_image_step():
    """30 blocks x 2 forwards / batch 2 = 30 block forwards per image-step; the floors' total = matmuls + attention +
    the rest; fusing the rest away leaves matmuls + attention."""
    c = roof.Counts()
    c.add("addmm", 989_000_000_000, 0)  # 1 ms at 989 TFLOP/s -> 30 ms
    c.add(roof.ATTENTION, 0, 4_800_000)  # 1 us at 4.8 TB/s -> 0.03 ms
    c.add("mul", 0, 48_000_000)  # 10 us -> 0.3 ms
    lines = roof.report(c, batch=2, layers=30, measured_s=0.0606)
    assert [line.split()[0] for line in lines[1:4]] == ["addmm", "mul", roof.ATTENTION]  # slowest first
    assert lines[1].split()[-2:] == ["30.00", "compute"] and lines[3].split()[-2:] == ["0.03", "memory"]
    assert lines[-3].endswith(
        "matmuls 30.0 ms + attention 0.0 ms + the other operators 0.3 ms (memory-bound, unfused) = 30.3 ms"
    )
    assert lines[-2].endswith(": 30.0 ms") and lines[-1].endswith("61 ms = 2.00x this floor")
