"""glm_grpo_ds/ds/portable.py without DeepSpeed engines: bitsandbytes' 8-bit Adam state through fp32 and back, and the
converted folder's check against its source. The conversion and load themselves run under real DeepSpeed in
tests/integration/test_reshape_resume.py."""

import json

import pytest
import torch

from glm_grpo_ds.ds import portable

bnb = pytest.importorskip("bitsandbytes")


def _stepped_8bit_state(steps=3, numel=5000):
    """A real AdamW8bit state after ``steps`` steps (8-bit from 4,096 elements), with gradients of both signs and
    magnitudes over 6 orders, so some blocks' largest magnitude is negative."""
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(numel))
    opt = bnb.optim.AdamW8bit([p], lr=1e-2)
    for _ in range(steps):
        p.grad = torch.randn(numel) * torch.logspace(-6, 0, numel)[torch.randperm(numel)]
        opt.step()
    return opt.state[p]


def test_8bit_moments_dequantized_and_quantized_on_the_same_blocks_get_their_codes_back():
    state = _stepped_8bit_state()
    assert state["state1"].dtype == torch.uint8
    moments = portable._dequantized(state)
    for key, name in (("1", "exp_avg"), ("2", "exp_avg_sq")):
        codes, scales = portable.quantize_blocks(moments[name], state[f"qmap{key}"])
        assert torch.equal(codes, state[f"state{key}"]) and torch.equal(scales, state[f"absmax{key}"]), key
    assert moments["step"] == 3


def test_bitsandbytes_own_quantize_does_not_so_the_blocks_scale_is_chosen_here():
    """The control: bitsandbytes' quantize_blockwise scales a block by its largest magnitude, and the signed map ends
    at -0.993: a block whose extreme is negative comes back with another scale and codes one off."""
    import bitsandbytes.functional as F

    state = _stepped_8bit_state()
    exp_avg = portable._dequantized(state)["exp_avg"]
    codes, quant = F.quantize_blockwise(exp_avg, code=state["qmap1"], blocksize=portable.BNB_BLOCK)
    assert not torch.equal(quant.absmax, state["absmax1"]) or not torch.equal(codes, state["state1"])


def test_the_packed_state_of_newer_bitsandbytes_dequantizes_alike():
    state = _stepped_8bit_state()
    packed = {"step": state["step"], portable.BNB_PACKED: {k: v for k, v in state.items() if k != "step"}}
    a, b = portable._dequantized(state), portable._dequantized(packed)
    assert torch.equal(a["exp_avg"], b["exp_avg"]) and torch.equal(a["exp_avg_sq"], b["exp_avg_sq"])


def test_a_converted_folder_is_checked_against_its_source(tmp_path):
    ds_dir, universal = tmp_path / "ds", tmp_path / portable.UNIVERSAL
    ds_dir.mkdir()
    (ds_dir / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"x" * 10)
    assert portable.check_converted(universal, ds_dir) is False  # nothing converted yet
    universal.mkdir()
    (universal / portable.SOURCE).write_text(json.dumps(portable.source_record(ds_dir)))
    assert portable.check_converted(universal, ds_dir) is True
    (ds_dir / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"y" * 11)  # another save copied over it
    with pytest.raises(portable.ConversionError, match="was not converted from .*; delete .* to convert the"):
        portable.check_converted(universal, ds_dir)
    # a conversion run by hand into it (the failed conversion's hint named this folder): the resume converted again
    # and its rename into the non-empty folder failed with a raw OSError, at every resume
    (universal / portable.SOURCE).unlink()
    (universal / "zero").mkdir()
    with pytest.raises(portable.ConversionError, match="was not made by glm-grpo's conversion .*; delete"):
        portable.check_converted(universal, ds_dir)


def test_the_engine_config_asks_for_the_universal_load_and_keeps_the_rest():
    ds = {"zero_optimization": {"stage": 2}, "checkpoint": {"tag_validation": "Warn"}}
    assert portable.universal_config(ds) == {
        "zero_optimization": {"stage": 2},
        "checkpoint": {"tag_validation": "Warn", "load_universal": True},
    }
    assert "load_universal" not in ds["checkpoint"]


def test_nvme_optimizer_offload_is_named_as_what_cannot_take_another_shapes_checkpoint():
    assert "offload_optimizer.device=nvme cannot load" in portable.cannot_load(
        {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/local"}}}
    )
    assert portable.cannot_load({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}) is None
