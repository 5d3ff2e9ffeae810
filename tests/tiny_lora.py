"""A LoRA policy on the tiny GLM-Image whose adapters change the logits (peft starts B at zero): the tests of the
rollout, the adapter dtype and evaluate share it."""

import torch

from glm_grpo_ds.config import LoraConfig
from glm_grpo_ds.policy import load_policy


def lora_policy(model_dir, dtype: torch.dtype = torch.float32, b_std: float = 0.05):
    """The tiny AR with r=4 adapters, each lora_B drawn from N(0, b_std) with a seed of its own (its name's
    length); ``b_std`` 0 keeps peft's zero B."""
    model = load_policy(model_dir, dtype, "sdpa", LoraConfig(r=4, alpha=8), False)
    if b_std:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, b_std, generator=torch.Generator().manual_seed(len(name)))
    return model
