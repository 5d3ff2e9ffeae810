"""grpo.ref_sync_steps' LoRA reference (glm_grpo_ds/model/reference.py) on a real peft model: the base model until a
reset, the policy as it was at the reset after it (not as it is later), and the copy a checkpoint keeps."""

import pytest
import torch
from peft_net import lora_net, move_adapters  # noqa: E402  (tests/unit/peft_net.py)

from glm_grpo_ds.lifecycle.checkpoint import CheckpointError
from glm_grpo_ds.model.reference import LoraReference, files

CPU = torch.device("cpu")


def _policy(seed=0):
    torch.manual_seed(seed)
    model = lora_net()
    _train(model)
    return model


_train = move_adapters


def _out(model, x):
    with torch.no_grad():
        return model(x)


def test_the_reference_is_the_base_model_until_a_reset_then_the_policy_of_that_reset():
    model, x = _policy(), torch.randn(5, 8)
    reference = LoraReference(model, CPU, zero3=False)
    with model.disable_adapter():
        base = _out(model, x)
    with reference.forward():
        assert torch.equal(_out(model, x), base)  # never reset: the adapters off
    at_reset = _out(model, x)
    assert not torch.allclose(at_reset, base)
    reference.reset(7)
    assert reference.step == 7
    with reference.forward():
        assert torch.equal(_out(model, x), at_reset)  # the KL to the policy right after a reset is exactly 0
    _train(model)  # the policy moves on; the reference keeps the copy
    assert not torch.allclose(_out(model, x), at_reset)
    with reference.forward():
        assert torch.equal(_out(model, x), at_reset)
    assert not torch.allclose(_out(model, x), at_reset)  # the hooks are gone after the block


def test_a_checkpoint_keeps_the_copy_and_a_foreign_or_damaged_one_is_one_line(tmp_path):
    model, x = _policy(), torch.randn(3, 8)
    reference = LoraReference(model, CPU, zero3=False)
    reference.write(tmp_path, rank=0)
    assert files(tmp_path) == []  # never reset: nothing to keep, a resume takes the base model
    reference.reset(4)
    with reference.forward():
        expected = _out(model, x)
    (tmp_path / "other").mkdir()
    reference.write(tmp_path / "other", rank=1)
    assert files(tmp_path / "other") == []  # rank 0 writes it: every rank holds the same copy
    reference.write(tmp_path, rank=0)
    assert [f.name for f in files(tmp_path)] == ["reference-00000.safetensors"]
    _train(model)
    restored = LoraReference(model, CPU, zero3=False)
    restored.read(tmp_path)
    assert restored.step == 4
    with restored.forward():
        assert torch.equal(_out(model, x), expected)
    restored.read(tmp_path / "other")  # a checkpoint saved before any reset
    assert (restored.step, restored.copy) == (0, {})
    other = lora_net(target_modules=["up"])
    with pytest.raises(
        CheckpointError, match=r"safetensors: does not fit this model: missing \[\], unknown \['base_model.model.down"
    ):
        LoraReference(other, CPU, zero3=False).read(tmp_path)
    files(tmp_path)[0].write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match=r"reference-\*.safetensors: .*; resume from another checkpoint$"):
        restored.read(tmp_path)


def test_a_resume_says_where_the_checkpoints_resets_and_this_launchs_disagree(tmp_path, caplog):
    """A checkpoint with a reset reference resumed with ref_sync_steps=0 goes back to the base model: a warning; one
    without, resumed with resets after the first reset was due, keeps the base model until the next one: a line."""
    import logging
    from types import SimpleNamespace

    from glm_grpo_ds.config import TrainConfig
    from glm_grpo_ds.lifecycle.run import RunLife

    model = _policy()
    reference = LoraReference(model, CPU, zero3=False)
    reference.reset(10)
    reference.write(tmp_path, rank=0)
    life = SimpleNamespace(cfg=TrainConfig())  # ref_sync_steps 0
    with caplog.at_level(logging.INFO, logger="glm_grpo_ds"):
        RunLife._restore_reference(life, None, tmp_path, 10)
    assert f"{tmp_path.name} holds a reset reference, but grpo.ref_sync_steps=0 now: the KL's reference" in caplog.text
    caplog.clear()
    life.cfg.grpo.ref_sync_steps = 4
    with caplog.at_level(logging.INFO, logger="glm_grpo_ds"):
        RunLife._restore_reference(life, LoraReference(model, CPU, zero3=False), tmp_path / "none", 10)
    assert "the KL's reference is the starting model until the reset after step 12" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="glm_grpo_ds"):
        RunLife._restore_reference(life, reference, tmp_path, 10)  # it holds one: read back, nothing said
    assert reference.step == 10 and caplog.text == ""


def test_full_fine_tunings_reference_is_mixed_and_kept_in_shards(tmp_path, monkeypatch):
    """ModelReference without DeepSpeed (stage 0): alpha x policy + (1 - alpha) x reference on the trained parameters
    only, written in files of at most SHARD_BYTES (here 500 bytes: two) and read back into a fresh reference."""
    from types import SimpleNamespace

    from peft_net import Net

    from glm_grpo_ds.model import reference as reference_module

    def engine(module):
        return SimpleNamespace(module=module, zero_optimization_stage=lambda: 0)

    torch.manual_seed(0)
    policy, ref = Net(), Net()
    policy.down.requires_grad_(False)  # frozen in the policy: left alone in the reference
    start = {n: p.detach().clone() for n, p in ref.named_parameters()}
    mixed = reference_module.ModelReference(engine(ref), engine(policy), alpha=0.25)
    mixed.reset(3)
    for name, p in ref.named_parameters():
        want = (
            start[name]
            if name.startswith("down.")
            else 0.75 * start[name] + 0.25 * dict(policy.named_parameters())[name]
        )
        assert torch.allclose(p, want, rtol=0, atol=1e-7), name
    monkeypatch.setattr(reference_module, "SHARD_BYTES", 500)  # up.weight (512 B, alone: larger) and up.bias apart
    mixed.write(tmp_path, rank=0)
    assert [f.name for f in files(tmp_path)] == ["reference-00000.safetensors", "reference-00001.safetensors"]
    fresh_ref = Net()
    back = reference_module.ModelReference(engine(fresh_ref), engine(policy), alpha=0.25)
    back.read(tmp_path)
    assert back.step == 3
    assert all(
        torch.equal(dict(fresh_ref.named_parameters())[n], p) for n, p in ref.named_parameters() if n.startswith("up.")
    )
