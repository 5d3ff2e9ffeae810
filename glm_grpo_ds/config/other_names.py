"""Other trainers' names for our config keys, so a config written in their words gets an error that names our key
instead of a close-looking key that means something else (``kl_coef`` is ``grpo.beta``, not
``grpo.entropy_coef``; ``num_samples`` is ``grpo.group_size``, not ``grpo.sampling``). Three sources: the design
this project was made from (the seeds' plan: docs/training.md "From the seeds' plan"), OpenRLHF and verl. TRL's
GRPOConfig names have their own table (trl_names.py, checked against TRL itself) and are asked first.

    hint = other_key_hint("kl_coef")   # "kl_coef (the seeds' plan, verl) is grpo.beta here: the KL coefficient ..."

A test checks every key here against our config and that each listed name is not one of ours.
"""

from __future__ import annotations

SEEDS = "the seeds' plan"

# their key (the last part of a dotted key, or a section name) -> (our dotted key, whose name it is, what to know)
OTHER_KEYS: dict[str, tuple[str, str, str]] = {
    "num_samples": ("grpo.group_size", SEEDS, "images sampled per prompt (G)"),
    "clip_range": (
        "grpo.epsilon_low",
        SEEDS,
        "the ratio clip below 1; grpo.epsilon_high is the one above (give both the same value for the seeds' "
        "symmetric clip)",
    ),
    "kl_coef": ("grpo.beta", f"{SEEDS}, verl", "the KL coefficient (k3 estimator, docs/training.md)"),
    "normalize_advantages": (
        "grpo.advantage_estimator",
        SEEDS,
        "true = group (z-score within each group), false = none (reward minus the group mean)",
    ),
    # the seeds' `reward: {metrics: [...]}` section: its section name and its key
    "reward": ("rewards", SEEDS, "a list of {name, weight, args}: rewards: [{name: lpips, weight: 0.4}, ...]"),
    "metrics": ("rewards", SEEDS, "a list of {name, weight, args}: rewards: [{name: lpips, weight: 0.4}, ...]"),
    "init_kl_coef": ("grpo.beta", "OpenRLHF", "the KL coefficient"),
    "kl_loss_coef": ("grpo.beta", "verl", "the KL coefficient of the loss"),
    "n_samples_per_prompt": ("grpo.group_size", "OpenRLHF", "images sampled per prompt (G)"),
    "eps_clip": ("grpo.epsilon_low", "OpenRLHF", "the ratio clip below 1; grpo.epsilon_high is the one above"),
    "clip_ratio": ("grpo.epsilon_low", "verl", "the ratio clip below 1; grpo.epsilon_high is the one above"),
    "entropy_coeff": ("grpo.entropy_coef", "verl", "the entropy bonus"),
    "max_epochs": ("grpo.num_iterations", "OpenRLHF", "updates per rollout (mu)"),
    "ppo_epochs": ("grpo.num_iterations", "verl", "updates per rollout (mu)"),
    "actor_learning_rate": ("optimizer.lr", "OpenRLHF", "the peak learning rate"),
    "micro_train_batch_size": ("batch.micro_batch_size", "OpenRLHF", "sequences per backward pass"),
    "ppo_micro_batch_size_per_gpu": ("batch.micro_batch_size", "verl", "sequences per backward pass"),
    "ppo_mini_batch_size": (
        "batch.mini_batches",
        "verl",
        "a count here, not a size: each rank's sequences split into this many mini-batches, one optimizer step each",
    ),
    "lora_rank": ("lora.r", "OpenRLHF, verl", "the LoRA rank"),
    "lora_alpha": ("lora.alpha", "OpenRLHF, verl", "the LoRA scaling numerator"),
}


def other_key_hint(key: str) -> str | None:
    """``"KEY (whose) is OURS here: NOTE"`` when ``key`` is another trainer's name for one of our keys, else
    None."""
    if key not in OTHER_KEYS:
        return None
    ours, whose, note = OTHER_KEYS[key]
    return f"{key} ({whose}) is {ours} here: {note}"
