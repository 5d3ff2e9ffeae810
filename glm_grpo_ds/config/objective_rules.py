"""The rules that tie ``grpo.objective`` to the other ``grpo`` settings (config/grpo_section.py calls them): another
objective's settings given with it are refused, naming the keys it reads instead, and vespo's sequence weight takes
token-level ratios and token-level sampler corrections only; each objective's numbers are checked for range."""

from __future__ import annotations

import math

from .checks import need
from .fields import default_of

# what cispo, sapo and vespo read in place of the clip's range: said where another objective's settings are refused
# (GRPOConfig) or noted (config/notes.py)
OBJECTIVE_READS = {
    "cispo": "its weight's cap, grpo.cispo_max (TRL's epsilon_high under loss_type cispo)",
    "sapo": "its gate's temperatures, grpo.sapo_temperature_pos / _neg",
    "vespo": "its gamma weight's exponents and decays, grpo.vespo_k_pos / _neg and grpo.vespo_lambda_pos / _neg",
}


def objective_number_problems(grpo, prefix: str) -> list[str]:
    """Each objective's numbers out of range, one line each (whatever the objective: a default is in range)."""
    problems: list[str] = []
    for key in ("cispo_max", "sapo_temperature_pos", "sapo_temperature_neg", "vespo_lambda_pos", "vespo_lambda_neg"):
        value = getattr(grpo, key)
        need(problems, 0 < value < math.inf, f"{prefix}{key} must be > 0 and finite, got {value}")
    for key in ("vespo_k_pos", "vespo_k_neg"):
        value = getattr(grpo, key)
        need(problems, 0 <= value < math.inf, f"{prefix}{key} must be >= 0 and finite, got {value}")
    return problems


def objective_problems(grpo, prefix: str) -> list[str]:
    """The settings of one objective given with another: refused, with the key that objective reads (the clip range
    only noted, config/notes.py: the shipped configs set it)."""
    reads = {"clip": ("delta",), "cispo": ("cispo_max",)}
    reads["sapo"] = ("sapo_temperature_pos", "sapo_temperature_neg")
    reads["vespo"] = ("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg")
    instead = {name: f"it reads {what}" for name, what in OBJECTIVE_READS.items()}
    instead["clip"] = "set grpo.objective to the one that reads it"
    problems: list[str] = []
    if grpo.objective not in instead:  # an unknown choice: said by choice_problems
        return problems
    for objective, keys in reads.items():
        for key in keys:
            value = getattr(grpo, key)
            need(
                problems,
                objective == grpo.objective or value == default_of(grpo, key),
                f"{prefix}{key}={value} is read by objective {objective} only, but {prefix}objective="
                f"{grpo.objective}: {instead[grpo.objective]}",
            )
    if grpo.objective == "vespo":  # its weight is the product of token ratios, times token correction weights
        sequence = f"{prefix}objective=vespo weighs each sequence by the product of its tokens' ratios"
        level = grpo.importance_sampling_level
        need(problems, level == "token", f"{sequence}: set {prefix}importance_sampling_level=token, not {level}")
        correction = grpo.sampler_correction
        need(
            problems,
            not correction.startswith("sequence"),
            f"{sequence} and takes the sampler correction's token weights into it: set {prefix}sampler_correction="
            f"token_truncate or token_mask, not {correction} (TRL refuses it too)",
        )
    return problems
