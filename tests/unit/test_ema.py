"""lora.ema_decay's moving average of the adapter (glm_grpo_ds/model/ema.py) on a real peft model: diffusers'
warmed-up decay by hand, the average in the adapters only inside the block (their own weights back bitwise), fp32
whatever the adapters' dtype, and the copy a checkpoint keeps."""

import pytest
import torch
from peft_net import lora_net, move_adapters  # noqa: E402  (tests/unit/peft_net.py)

from glm_grpo_ds.lifecycle.checkpoint import CheckpointError
from glm_grpo_ds.model.ema import AdapterEMA
from glm_grpo_ds.model.kept import kept_files


def _policy(dtype=torch.float32):
    torch.manual_seed(0)
    return lora_net(dtype=dtype)


def _adapters(model) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


_move = move_adapters


def test_the_average_by_hand_and_in_the_adapters_only_inside_the_block():
    model = _policy()
    ema = AdapterEMA(model, decay=0.2, zero3=False)
    with ema.in_adapters():  # no update yet: the average is the weights themselves
        assert all(torch.equal(p, _adapters(model)[n]) for n, p in _adapters(model).items())
    seen = []
    for _ in range(4):
        _move(model)
        seen.append(_adapters(model))
        ema.update()
    # diffusers' EMAModel: the first update copies, the n-th decays by min(0.2, n / (9 + n))
    want = dict(seen[0])
    for n, weights in enumerate(seen[1:], start=1):
        d = min(0.2, (1 + n) / (10 + n))
        want = {k: v - (1 - d) * (v - weights[k]) for k, v in want.items()}
    assert ema.step == 4
    own = _adapters(model)
    with ema.in_adapters():
        inside = _adapters(model)
    assert all(torch.allclose(inside[k], want[k], rtol=0, atol=1e-7) for k in want)
    assert not all(torch.equal(inside[k], own[k]) for k in own)
    assert all(torch.equal(p, own[n]) for n, p in _adapters(model).items())  # the adapters' own, bitwise


def test_a_bf16_adapter_is_averaged_in_fp32():
    """A bf16 average would round each update's share of a change to bf16's resolution (~3 digits)."""
    model = _policy(torch.bfloat16)
    ema = AdapterEMA(model, decay=0.9, zero3=False)
    seen = []
    for _ in range(4):
        _move(model, 1e-2)
        seen.append({k: v.float() for k, v in _adapters(model).items()})
        ema.update()
    want = dict(seen[0])
    for n, weights in enumerate(seen[1:], start=1):
        d = min(0.9, (1 + n) / (10 + n))
        want = {k: v - (1 - d) * (v - weights[k]) for k, v in want.items()}
    got = dict(zip(ema.names, ema.average.shadow_params))
    assert {t.dtype for t in got.values()} == {torch.float32}
    assert all(torch.allclose(got[k], want[k], rtol=0, atol=1e-7) for k in want)


def test_a_checkpoint_keeps_the_average_and_its_update_count(tmp_path):
    model = _policy()
    ema = AdapterEMA(model, decay=0.5, zero3=False)
    ema.write(tmp_path, rank=0)
    assert kept_files(tmp_path, "ema-*.safetensors") == []  # no update yet: nothing to keep
    for _ in range(3):
        _move(model)
        ema.update()
    ema.write(tmp_path, rank=0)
    with ema.in_adapters():
        average = _adapters(model)
    _move(model)
    restored = AdapterEMA(model, decay=0.5, zero3=False)
    restored.read(tmp_path)
    assert restored.step == 3
    with restored.in_adapters():
        assert all(torch.equal(p, average[n]) for n, p in _adapters(model).items())
    fresh = AdapterEMA(model, decay=0.5, zero3=False)
    fresh.read(tmp_path / "none")  # a checkpoint saved without an average: its first update takes the weights
    assert fresh.step == 0
    other = lora_net(target_modules=["up"])
    with pytest.raises(CheckpointError, match=r"ema-\*.safetensors: does not fit this model: missing \[\], unknown"):
        AdapterEMA(other, decay=0.5, zero3=False).read(tmp_path)
