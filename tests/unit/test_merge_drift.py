"""benchmarks/merge_drift.py's arithmetic (issue #51 item 4a) against hand-computed values: the adapter delta it
reads from a peft adapter directory, and the part of that delta a bf16 merge keeps. The runs themselves are a
benchmark (docs/memory-and-speed.md#merged-sampling-at-the-real-widths)."""

import json

import pytest
import torch
from benchmark_scripts import load_benchmark  # noqa: E402  (tests/benchmark_scripts.py)
from safetensors.torch import save_file

md = load_benchmark("merge_drift")
NAME = "model.language_model.layers.0.self_attn.q_proj.weight"


def test_a_delta_below_the_bf16_spacing_is_lost_and_one_on_the_spacing_is_kept():
    """W = 1 in bf16 has the spacing 2**-7 above it: W + 2**-9 rounds back to 1 (nothing kept, error 1), W + 2**-7
    is exact (all kept, error 0); half of each gives kept 2**-7 * 2**-7 / (2**-18 + 2**-14)."""
    w = torch.ones(2, 2, dtype=torch.bfloat16)
    small, exact = torch.full((2, 2), 2.0**-9), torch.full((2, 2), 2.0**-7)
    assert md.kept_fraction({NAME: w}, {NAME: small}) == (0.0, 1.0)
    assert md.kept_fraction({NAME: w}, {NAME: exact}) == (1.0, 0.0)
    mixed = torch.tensor([[2.0**-9, 2.0**-9], [2.0**-7, 2.0**-7]])
    kept, error = md.kept_fraction({NAME: w}, {NAME: mixed})
    dd = 2 * 2.0**-18 + 2 * 2.0**-14
    assert kept == pytest.approx(2 * 2.0**-14 / dd)
    assert error == pytest.approx((2 * 2.0**-18 / dd) ** 0.5)


def test_adapter_deltas_are_alpha_over_r_times_b_at_a_under_the_base_weights_name(tmp_path):
    a, b = torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0], [4.0]])  # r=1, in 2, out 2
    prefix = "base_model.model.model.language_model.layers.0.self_attn.q_proj"
    save_file({f"{prefix}.lora_A.weight": a, f"{prefix}.lora_B.weight": b}, tmp_path / "adapter_model.safetensors")
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 1, "lora_alpha": 4}))
    (delta,) = md.adapter_deltas(tmp_path).items()
    assert delta[0] == NAME
    assert torch.equal(delta[1], torch.tensor([[12.0, 24.0], [16.0, 32.0]]))  # 4 * [[3], [4]] @ [[1, 2]]
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 4, "use_rslora": True}))
    assert torch.equal(md.adapter_deltas(tmp_path)[NAME], 2 * b @ a)  # rsLoRA: alpha / sqrt(r)
