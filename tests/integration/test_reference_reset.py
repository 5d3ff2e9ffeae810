"""grpo.ref_sync_steps under full fine-tuning on 2 CPU ranks at ZeRO-3: each reset mixes the policy into the
reference engine as TRL's own SyncRefModelCallback mixes two models, a checkpoint keeps the mixed reference, and a
resume mixes the next reset into that one, not into the starting model. (LoRA's hard resets: the KL after a reset
in tests/integration/test_checkpoint_resume.py and test_one_step_off.py, the copy in tests/unit/test_reference.py.)"""

import pytest
import torch
from launching import common, launch, train_args  # noqa: E402  (tests/integration/launching.py)
from run_files import metrics  # noqa: E402  (tests/run_files.py)
from safetensors.torch import load_file

from glm_grpo_ds.model.policy import load_ar

pytestmark = [pytest.mark.slow, pytest.mark.distributed]  # training runs on 2 ranks

ALPHA = 0.6  # TRL's default ref_model_mixup_alpha


def _train(args) -> None:
    launch(2, train_args(*args, ds_config="zero3.json"), 600, launcher=False)


@pytest.fixture(scope="module")
def run(tiny_model_dir, data64, tmp_path_factory):
    out = tmp_path_factory.mktemp("reference_reset") / "run"
    extra = ["lora=null", "optimizer.name=adamw", "optimizer.lr=1e-3", "grpo.beta=0.1", "rollout.height=64"]
    extra += ["rollout.width=64", "logging.progress_bar=false", "logging.plot=false", "save_steps=2"]
    extra += ["grpo.ref_sync_steps=2", f"grpo.ref_sync_alpha={ALPHA}"]
    first = common(tiny_model_dir, data64, out, "max_steps=2", *extra)
    _train(first)
    policy_2 = out / "final_model.step2"
    (out / "final_model").rename(policy_2)  # the policy the first reset mixed in
    _train(common(tiny_model_dir, data64, out, "max_steps=4", "resume_from=latest", *extra))
    return out, policy_2


def _trl_mix(policy: dict, reference: dict) -> dict:
    """TRL's SyncRefModelCallback._sync_target_model(policy, reference, ALPHA) over these parameters."""
    from trl.trainer.callbacks import SyncRefModelCallback

    def module(tensors):
        m = torch.nn.Module()
        m.params = torch.nn.ParameterList([torch.nn.Parameter(tensors[n].clone()) for n in sorted(tensors)])
        return m

    target = module(reference)
    SyncRefModelCallback._sync_target_model(module(policy), target, ALPHA)
    return dict(zip(sorted(reference), (p.data for p in target.params)))


def _trained(path) -> dict:
    """The parameters full fine-tuning trains (language model and head), as loaded."""
    ar = load_ar(path, torch.float32)
    return {n: p.detach() for n, p in ar.named_parameters() if n.startswith(("model.language_model.", "lm_head."))}


def test_each_reset_mixes_the_policy_into_the_reference_as_trl_does_and_a_resume_continues_it(run, tiny_model_dir):
    out, policy_2 = run
    saved_2 = load_file(out / "checkpoints" / "step_000002" / "reference-00000.safetensors")
    saved_4 = load_file(out / "checkpoints" / "step_000004" / "reference-00000.safetensors")
    start = _trained(tiny_model_dir)
    assert set(saved_2) == set(start)  # every trained parameter, nothing frozen
    want_2 = _trl_mix(_trained(policy_2), start)
    assert all(torch.equal(saved_2[n], want_2[n]) for n in start)
    # the resumed launch read step 2's reference back and mixed step 4's policy into it
    want_4 = _trl_mix(_trained(out / "final_model"), saved_2)
    assert all(torch.equal(saved_4[n], want_4[n]) for n in start)
    assert not all(torch.equal(saved_4[n], _trl_mix(_trained(out / "final_model"), start)[n]) for n in start)
    kl = [r["kl"] for r in metrics(out)]  # step 1: the starting model on both sides
    assert kl[0] == 0.0 and 0 < kl[2] < kl[1] / 4, kl  # after step 2's reset: nearer the policy, a mix not a copy
