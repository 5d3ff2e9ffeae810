"""``rollout.adapters_in_model_dtype`` (glm_grpo_ds/model/adapters.py ``adapters_in_base_dtype``) on the tiny GLM-Image
in bf16 with LoRA: peft's fp32 adapters are cast to bf16 for the rollout only, the rollout then samples exactly what
a model with bf16 adapters samples, and afterwards the very same fp32 tensors are back, bitwise; the training
rollout (the engine sampler, glm_grpo_ds/rollout/backends.py) casts for the rollout and not for the trainer's passes
inside its gather."""

import contextlib
import copy
from types import SimpleNamespace

import pytest
import torch

from glm_grpo_ds.config import SamplingConfig, load_config
from glm_grpo_ds.model.adapters import adapters_in_base_dtype
from glm_grpo_ds.model.glm_image import load_processor
from glm_grpo_ds.rollout import rollout
from glm_grpo_ds.testing.tiny import lora_policy

PROMPTS = ["a red cube", "a sign that says 'OPEN'"]


@pytest.fixture(scope="module")
def bf16_policy(tiny_model_dir):
    return lora_policy(tiny_model_dir, torch.bfloat16, b_std=0.5).eval()


def lora_params(model) -> dict[str, torch.nn.Parameter]:
    return {name: p for name, p in model.named_parameters() if "lora_" in name}


def sample(model, processor, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return rollout(model, processor, PROMPTS, 4, 64, 64, SamplingConfig(temperature=1.0), gen)


def test_the_rollout_samples_with_bf16_adapters_and_gets_its_fp32_ones_back(bf16_policy, tiny_model_dir):
    processor = load_processor(tiny_model_dir)
    params = lora_params(bf16_policy)
    assert params and all(p.dtype == torch.float32 for p in params.values())  # peft upcast them: the case at hand
    before = {name: (p.data_ptr(), p.detach().clone()) for name, p in params.items()}

    with adapters_in_base_dtype(bf16_policy) as swapped:
        assert swapped == len(params)
        assert all(p.dtype == torch.bfloat16 for p in params.values())
        cast = sample(bf16_policy, processor)

    for name, p in params.items():
        storage, values = before[name]
        assert p.data_ptr() == storage and p.dtype == torch.float32 and torch.equal(p.detach(), values), name

    # what a model whose adapters are bf16 for good samples, to the bit
    rounded = copy.deepcopy(bf16_policy)
    for p in lora_params(rounded).values():
        p.data = p.data.to(torch.bfloat16)
    reference = sample(rounded, processor)
    assert torch.equal(cast.completion_ids, reference.completion_ids)
    assert torch.equal(cast.sampler_logps, reference.sampler_logps)
    # and not what the fp32 adapters give (the test would pass vacuously otherwise)
    assert not torch.equal(sample(bf16_policy, processor).sampler_logps, cast.sampler_logps)


def test_nothing_is_cast_where_the_adapters_already_have_the_models_dtype(tiny_model_dir):
    with adapters_in_base_dtype(lora_policy(tiny_model_dir, b_std=0)) as swapped:
        assert swapped == 0


@pytest.mark.parametrize("enabled", [True, False])
def test_training_rollout_casts_for_sampling_only(bf16_policy, tiny_model_dir, enabled):
    """The engine sampler (rollout/backends.py): the rollout samples with bf16 adapters when the option is on, and
    the trainer's passes inside the same gather (``before_update``) see the fp32 adapters either way. The engine is
    a stand-in holding the model (ZeRO-2 shape: no gather); what is tested is the cast around the rollout."""
    from glm_grpo_ds.rollout.backends import EngineSampler

    processor = load_processor(tiny_model_dir)
    cfg = load_config(
        None,
        [
            f"model.path={tiny_model_dir}",
            "data.train_file=/d.jsonl",
            "rewards=[{name: pixel_mse}]",
            "rollout.height=64",
            "rollout.width=64",
            "grpo.group_size=4",
            "grpo.sampling.temperature=1.0",
            f"rollout.adapters_in_model_dtype={str(enabled).lower()}",
        ],
    )
    engine = SimpleNamespace(module=bf16_policy, zero_optimization_stage=lambda: 2)
    seen = {}

    def before_update(policy, batch):
        seen["dtypes"] = {p.dtype for p in lora_params(policy).values()}
        return None, None

    sampler = EngineSampler(engine, processor, cfg, torch.device("cpu"), before_update=before_update)
    batch = sampler.sample(PROMPTS, [0], cfg.grpo.group_size).batch
    assert seen["dtypes"] == {torch.float32}
    with adapters_in_base_dtype(bf16_policy) if enabled else contextlib.nullcontext():
        expected = sample(bf16_policy, processor)
    assert torch.equal(batch.sampler_logps, expected.sampler_logps)
