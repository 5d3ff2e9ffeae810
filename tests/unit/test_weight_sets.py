"""model/weight_sets.py: several full sets of a model's weights, one in use at a time, copied into the model's own
Parameters (so what holds them, peft's layers or a device copy made by .to(), sees the set in use)."""

import pytest
import torch

from glm_grpo_ds.config import ConfigError
from glm_grpo_ds.model.weight_sets import WeightSets


def _net(seed: int, width: int = 4) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(width, 3), torch.nn.Linear(3, 2))


def test_the_set_in_use_is_the_one_computed_with_and_the_base_comes_back():
    base, other = _net(0), _net(1)
    x = torch.randn(5, 4)
    want_base, want_other = base(x).detach(), other(x).detach()
    sets = WeightSets(base)
    sets.add("full", other, "--adapter X")
    held = base[0].weight  # the Parameter object: kept through the swaps and .to()
    sets.use("full")
    assert torch.equal(base(x), want_other) and base[0].weight is held
    sets.use("adapter_1")  # a name without a set (a LoRA adapter's): the base's weights
    assert torch.equal(base(x), want_base)
    base.to(torch.float64)  # .to() replaces the Parameters' data, not them: the swaps still reach the model
    sets.use("full")
    assert torch.allclose(base(x.double()), want_other.double())
    sets.use(None)
    assert torch.allclose(base(x.double()), want_base.double())
    assert sets.names == ["full"]
    other[0].weight.data.zero_()  # a copy was kept, not the other model's tensors
    sets.use("full")
    assert torch.allclose(base(x.double()), want_other.double())


def test_a_set_of_other_shapes_or_names_is_one_line_naming_it():
    sets = WeightSets(_net(0))
    with pytest.raises(ConfigError, match=r"^--adapter X does not fit the base model's AR: its 0.weight is \[3, 5\], "):
        sets.add("full", _net(1, width=5), "--adapter X")
    with pytest.raises(ConfigError, match=r"its 1.bias is missing, the base's \[2\]"):
        sets.add("full", torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2, bias=False)), "--adapter X")
    assert sets.names == []
