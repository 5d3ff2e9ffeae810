"""Adapter files the integration tests need without training one (test_adapters.py, test_quiet_tools.py).

from adapter_files import write_adapter   # a test module in tests/integration/
"""

import torch

from glm_grpo_ds.config import LoraConfig
from glm_grpo_ds.model.adapters import peft_lora_config
from glm_grpo_ds.model.policy import load_ar


def write_adapter(base_dir, out, seed=0, **lora):
    """A peft adapter with random (non-zero) A and B: it changes the model."""
    from peft import get_peft_model

    torch.manual_seed(seed)
    cfg = peft_lora_config(LoraConfig(**lora))
    cfg.init_lora_weights = False
    get_peft_model(load_ar(base_dir), cfg).save_pretrained(out)
    return out
