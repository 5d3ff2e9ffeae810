"""A two-layer net with real peft LoRA adapters on both linears, for the unit tests of what keeps or swaps adapter
weights (the reset reference: test_reference.py; the moving average: test_ema.py)."""

import torch
from peft import LoraConfig, get_peft_model


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def lora_net(target_modules=("up", "down"), dtype=torch.float32):
    """A peft model of :class:`Net` (r 2, alpha 4), cast to ``dtype`` after peft (which keeps adapters fp32 on a bf16
    base), as DeepSpeed's bf16 engine casts the whole module."""
    return get_peft_model(Net(), LoraConfig(r=2, lora_alpha=4, target_modules=list(target_modules))).to(dtype)


def move_adapters(model, scale=0.3):
    """Move every adapter weight, as an update would (peft starts B at 0: the adapters would change nothing)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.add_(scale * torch.randn_like(p))
