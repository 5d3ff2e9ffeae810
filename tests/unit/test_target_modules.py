"""``lora.target_modules`` must name linears of the language model's layers (glm_grpo_ds/model/adapters.py): peft
adapts the names that match and drops the others without a word, so ``[q_proj, qkv]`` would train q_proj alone and
a Llama-style ``gate_proj`` nothing. Checked on one decoder layer built on the meta device (before any model
loads) and again in make_trainable (the trainer and the memory planner)."""

from pathlib import Path

import pytest
from transformers import GlmImageConfig

from glm_grpo_ds.config import ConfigError, load_config
from glm_grpo_ds.config.model_sections import LoraConfig
from glm_grpo_ds.memory.sizes import model_sizes
from glm_grpo_ds.model.adapters import check_target_modules, text_layer_linear_names

GLM_LINEARS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_up_proj", "down_proj"]


def test_the_real_glm_image_layer_has_these_linears_and_the_default_names_them_all():
    names = text_layer_linear_names(GlmImageConfig().text_config.to_dict())
    assert names == GLM_LINEARS
    check_target_modules(LoraConfig().target_modules, names)  # the default: quiet


@pytest.mark.parametrize(
    "targets, missing",
    [(["q_proj", "qkv"], "'qkv'"), (["gate_proj", "up_proj", "down_proj"], "'gate_proj', 'up_proj'")],
)
def test_a_name_that_matches_nothing_is_one_line(targets, missing):
    with pytest.raises(ConfigError) as err:
        check_target_modules(targets, GLM_LINEARS)
    message = str(err.value)
    assert message.startswith(f"lora.target_modules: {missing} names no linear layer of the language model's layers")
    assert "q_proj, k_proj, v_proj, o_proj, gate_up_proj, down_proj" in message
    assert ("one fused gate_up_proj here" in message) == ("gate_proj" in missing)


def test_the_memory_planner_refuses_it_too():
    lora_config = Path(__file__).resolve().parents[2] / "launch" / "configs" / "glm_image_lora.yaml"
    cfg = load_config(str(lora_config), ["lora.target_modules=[q_proj,qkv]"])
    with pytest.raises(ConfigError, match="lora.target_modules: 'qkv' names no linear layer"):
        model_sizes(cfg)
