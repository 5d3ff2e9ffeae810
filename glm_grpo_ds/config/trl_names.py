"""TRL's GRPOConfig names and what they are here, so a config written with TRL's words gets an error that names
our key (and maps the value) instead of a list of close-looking keys that mean something else
(``num_generations`` is ``grpo.group_size``, not ``grpo.num_iterations``; TRL's ``loss_type: dapo`` is our
``aggregation: token_mean``, not ``dr_grpo``). docs/migrating.md carries the same table; a test checks every
TRL name here against trl.GRPOConfig's fields and every key against our config.

    hint = trl_key_hint("num_generations")          # "TRL's num_generations is grpo.group_size here: ..."
    hint = trl_value_hint("grpo.aggregation", "dapo")  # "TRL's loss_type 'dapo' is aggregation 'token_mean' here"
"""

from __future__ import annotations

# TRL GRPOConfig field -> (our dotted key, what to know)
TRL_KEYS: dict[str, tuple[str, str]] = {
    "num_generations": ("grpo.group_size", "G completions per prompt"),
    "loss_type": (
        "grpo.aggregation",
        "the loss normaliser: TRL's dapo / bnpo = token_mean, grpo = seq_mean, dr_grpo = dr_grpo; cispo and sapo "
        "are grpo.objective cispo / sapo (TRL sums them as token_mean / seq_mean), vespo is grpo.objective vespo "
        "(summed as token_mean); luspo, with every image's token count equal, is importance_sampling_level sequence "
        "with seq_mean times that count (the lr scaled by it)",
    ),
    "scale_rewards": ("grpo.advantage_estimator", "TRL's group / true = group, batch = batch, none / false = none"),
    "epsilon": ("grpo.epsilon_low", "the lower clip; grpo.epsilon_high is the upper one, as in TRL"),
    "vllm_importance_sampling_correction": (
        "grpo.sampler_correction",
        "false = none; true = one of token_truncate, token_mask, sequence_truncate, sequence_mask (TRL's "
        "vllm_importance_sampling_mode, the same names)",
    ),
    "vllm_importance_sampling_mode": ("grpo.sampler_correction", "the same names: token_truncate, ..."),
    "vllm_importance_sampling_cap": ("grpo.sampler_correction_max", "the upper cap of the correction weights"),
    "vllm_importance_sampling_clip_max": ("grpo.sampler_correction_max", "the upper cap of the correction weights"),
    "vllm_importance_sampling_clip_min": ("grpo.sampler_correction_min", "the lower cap of the correction weights"),
    "learning_rate": ("optimizer.lr", "the peak learning rate"),
    "lr_scheduler_type": ("optimizer.schedule", "constant, linear or cosine"),
    "per_device_train_batch_size": (
        "batch.micro_batch_size",
        "sequences per backward pass; the sequences a rank samples per step are batch.prompts_per_rank x "
        "grpo.group_size",
    ),
    "gradient_accumulation_steps": (
        "batch.micro_batch_size",
        "a mini-batch's sequences (a rank's rollout / batch.mini_batches) are one optimizer step in micro-batches of "
        "this size: there is no separate accumulation count",
    ),
    "steps_per_generation": (
        "batch.mini_batches",
        "optimizer steps per rollout: the k-th mini-batch holds the k-th K-th of every group's samples, the same ones "
        "on any number of ranks (TRL shuffles its generation batch first)",
    ),
    "max_completion_length": (
        "rollout.height",
        "the completion is an image's tokens: rollout.height x rollout.width / 32^2 of them, plus the preview grid",
    ),
    "reward_weights": ("rewards", "each reward's weight: rewards: [{name: ..., weight: ...}]"),
    "multi_objective_aggregation": (
        "grpo.reward_combination",
        "sum_then_normalize is TRL's; our normalize_then_sum is the weighted sum of each reward's group advantages, "
        "where TRL's (GDPO) normalises that sum over the batch again: ours keeps the weights' scale",
    ),
    "temperature": ("grpo.sampling.temperature", "the rollout's sampling temperature"),
    "top_k": ("grpo.sampling.top_k", "the rollout's top-k"),
    "top_p": ("grpo.sampling.top_p", "the rollout's top-p"),
    "logging_steps": ("logging.log_every", "console lines every N steps (metrics.jsonl has every step)"),
    "gradient_checkpointing": ("model.gradient_checkpointing", "the policy's activation checkpointing"),
    "bf16": ("model.dtype", "bf16, fp32, fp16 or auto"),
    "beta": ("grpo.beta", "the KL coefficient (TRL's default 0.0, ours 0.04)"),
    "num_iterations": ("grpo.num_iterations", "updates per rollout (mu)"),
    "importance_sampling_level": ("grpo.importance_sampling_level", "token or sequence (GSPO)"),
    "top_entropy_quantile": ("grpo.top_entropy_quantile", "the top-entropy token fraction"),
    "entropy_coef": ("grpo.entropy_coef", "the entropy bonus"),
    "use_adaptive_entropy": (
        "grpo.entropy_target",
        "set it (nats) to adapt entropy_coef each optimizer step; null = fixed (TRL's target default 0.2 is an LLM's "
        "scale, not a codebook's)",
    ),
    "entropy_target": ("grpo.entropy_target", "the entropy the coefficient steers to, in nats; null = no adapting"),
    "entropy_coef_delta": ("grpo.entropy_coef_delta", "the adaptive coefficient's change per optimizer step"),
    "entropy_coef_min": ("grpo.entropy_coef_min", "the adaptive coefficient's floor"),
    "entropy_coef_max": ("grpo.entropy_coef_max", "the adaptive coefficient's ceiling"),
    "delta": ("grpo.delta", "the two-sided clip's cap on the unclipped ratio (INTELLECT-2)"),
    "off_policy_mask_threshold": (
        "grpo.off_policy_mask_threshold",
        "off-policy sequence masking's KL bound, on the sampler's log-probs",
    ),
    "sync_ref_model": ("grpo.ref_sync_steps", "set it > 0 to reset the reference every N steps; 0 = never"),
    "ref_model_sync_steps": (
        "grpo.ref_sync_steps",
        "training steps here (TRL: optimizer steps; the same at num_iterations 1 and mini_batches 1)",
    ),
    "ref_model_mixup_alpha": (
        "grpo.ref_sync_alpha",
        "the policy's share of the reset reference (TRL's default 0.6, ours 1: a hard reset); LoRA takes 1 only, "
        "where TRL refuses sync_ref_model under PEFT",
    ),
    "use_bias_correction_kl": ("grpo.kl_bias_correction", "the KL term weighted by the importance ratio"),
    "sapo_temperature_pos": ("grpo.sapo_temperature_pos", "objective sapo: the gate's temperature for A > 0"),
    "sapo_temperature_neg": ("grpo.sapo_temperature_neg", "objective sapo: the gate's temperature for A <= 0"),
    "vespo_k_pos": ("grpo.vespo_k_pos", "objective vespo: the gamma weight's exponent for A >= 0"),
    "vespo_lambda_pos": ("grpo.vespo_lambda_pos", "objective vespo: the gamma weight's decay for A >= 0"),
    "vespo_k_neg": ("grpo.vespo_k_neg", "objective vespo: the gamma weight's exponent for A < 0"),
    "vespo_lambda_neg": ("grpo.vespo_lambda_neg", "objective vespo: the gamma weight's decay for A < 0"),
    "log_completions": ("logging.sample_records", "every N steps, a line per sample in samples.jsonl"),
    "num_generations_eval": ("eval.group_size", "samples per prompt at an evaluation"),
    "shuffle_dataset": ("data.shuffle", "the prompts' order each epoch"),
    "ds3_gather_for_generation": ("rollout.gather_parameters", "ZeRO-3: sample with the AR gathered (the default)"),
    "disable_dropout": ("lora.dropout", "0 here by default (dropout on the adapters' input only)"),
    "optim": ("optimizer.name", "adamw, adamw_8bit or paged_adamw_8bit"),
    "adam_beta1": ("optimizer.betas", "both betas in one list: [0.9, 0.999]"),
    "adam_beta2": ("optimizer.betas", "both betas in one list: [0.9, 0.999]"),
    "adam_epsilon": ("optimizer.eps", "Adam's epsilon"),
    "eval_steps": ("eval.steps", "evaluate every N steps"),
    "eval_on_start": ("eval.at_start", "evaluate the initial policy (step 0)"),
    "push_to_hub": ("hub.repo_id", "set it to upload the final weights (and the card)"),
    "hub_model_id": ("hub.repo_id", "the Hub repository"),
    "hub_private_repo": ("hub.private", "create the repository private"),
    "hub_revision": ("hub.revision", "the branch uploaded to"),
    "hub_strategy": ("hub.push_checkpoints", "also upload each checkpoint's adapter as it is saved"),
    "resume_from_checkpoint": ("resume_from", "latest, auto or a checkpoint's path"),
    "ddp_timeout": ("dist_timeout_minutes", "minutes here (TRL: seconds)"),
    "torch_compile": ("rollout.compile", "the sampler's decode step (decoder.compile: the DiT's)"),
    "fp16": ("model.dtype", "bf16, fp32, fp16 or auto"),
    "metric_for_best_model": ("save_best", "by eval/reward_mean: checkpoints/best, never pruned while the best"),
    "load_best_model_at_end": ("save_best", "the best is kept and named (checkpoints/best), not loaded at the end"),
}

# TRL GRPOConfig fields with no counterpart here, and why (the rest of its own fields are in TRL_KEYS, or are our
# keys' names: epsilon_high, trust_remote_code); a config that sets one is told this instead of close spellings
_NO_VLLM = (
    "no vLLM: the rollout samples in the training process from the policy's own weights, exactly (rollout.cuda_graph "
    "and rollout.fuse_lora make it fast; docs/memory-and-speed.md)"
)
_VLLM_KEYS = ("use_vllm", "vllm_mode", "vllm_model_impl", "vllm_enable_sleep_mode", "vllm_structured_outputs_regex")
_VLLM_KEYS += ("vllm_server_base_url", "vllm_server_host", "vllm_server_port", "vllm_server_timeout")
_VLLM_KEYS += ("vllm_group_port", "vllm_gpu_memory_utilization", "vllm_max_model_length", "vllm_tensor_parallel_size")
_NO_BATCHING = (
    "the rollout decodes its fixed-length batch with a static KV cache (in a CUDA graph with rollout.cuda_graph)"
)
TRL_ABSENT: dict[str, str] = {
    **dict.fromkeys(_VLLM_KEYS, _NO_VLLM),
    **dict.fromkeys(
        ("use_transformers_continuous_batching", "transformers_continuous_batching_config", "use_transformers_paged"),
        _NO_BATCHING,
    ),
    "cache_implementation": _NO_BATCHING,
    "model_init_kwargs": "the model loads with model.dtype, model.attn_implementation, model.revision and "
    "model.trust_remote_code",
    "generation_kwargs": "the draw takes grpo.sampling.temperature, top_k and top_p; GLM-Image's own where unset",
    "min_p": "the draw takes grpo.sampling.top_k and top_p",
    "repetition_penalty": "an image's tokens repeat by design; the draw takes grpo.sampling.top_k and top_p",
    "generation_batch_size": "a rank samples batch.prompts_per_rank x grpo.group_size sequences a step, all at once",
    "cast_lm_head_to_fp32": "always: the log-probs are an fp32 log-softmax, grpo.logprob_chunk_size tokens at a time",
    "pad_to_multiple_of": "an image's tokens are fixed grids: no padding",
    "mask_truncated_completions": "an image is never truncated: every sequence fills its grids",
    "router_aux_loss_coef": "GLM-Image's AR is dense: no router",
    "chat_template_kwargs": "the prompt is GLM-Image's text conditioning, not a chat",
    "max_tool_calling_iterations": "no tools",
    "log_multimodal": "the images are in the galleries (logging.gallery_steps), their scores in samples.jsonl",
    "num_completions_to_print": "the console prints none: samples.jsonl (logging.sample_records) has every sample",
    "log_unique_prompts": "samples.jsonl (logging.sample_records) names each sample's prompt",
    "log_completions_hub_repo": "samples stay in output_dir; hub.repo_id uploads the weights and the card",
}

# (our dotted key, a value TRL writes for the matching field) -> (TRL's field, what it is here)
TRL_VALUES: dict[tuple[str, str], tuple[str, str]] = {
    ("grpo.aggregation", "dapo"): ("loss_type", "aggregation 'token_mean'"),
    ("grpo.aggregation", "bnpo"): ("loss_type", "aggregation 'token_mean'"),
    ("grpo.aggregation", "grpo"): ("loss_type", "aggregation 'seq_mean'"),
    ("grpo.aggregation", "cispo"): ("loss_type", "grpo.objective 'cispo' (TRL sums it as aggregation 'token_mean')"),
    ("grpo.aggregation", "sapo"): ("loss_type", "grpo.objective 'sapo' (TRL sums it as aggregation 'seq_mean')"),
    ("grpo.aggregation", "vespo"): ("loss_type", "grpo.objective 'vespo' (TRL sums it as aggregation 'token_mean')"),
    ("grpo.advantage_estimator", "true"): ("scale_rewards", "advantage_estimator 'group'"),
    ("grpo.advantage_estimator", "false"): ("scale_rewards", "advantage_estimator 'none'"),
}


def trl_key_hint(key: str) -> str | None:
    """``"TRL's KEY is OURS here: NOTE"`` when ``key`` (the last part of an unknown dotted key) is a TRL
    GRPOConfig name this config spells differently or places elsewhere, ``"TRL's KEY has no counterpart here: WHY"``
    for one of :data:`TRL_ABSENT`; else None."""
    if key in TRL_ABSENT:
        return f"TRL's {key} has no counterpart here: {TRL_ABSENT[key]}"
    if key not in TRL_KEYS:
        return None
    ours, note = TRL_KEYS[key]
    return f"TRL's {key} is {ours} here: {note}"


def trl_value_hint(where: str, value) -> str | None:
    """``"TRL's FIELD 'VALUE' is KEY 'OURS' here"`` for a TRL value of one of our choice keys, else None."""
    found = TRL_VALUES.get((where, str(value).lower()))
    if found is None:
        return None
    field, ours = found
    shown = str(value).lower() if str(value).lower() in ("true", "false") else value  # YAML's false reads False
    return f"TRL's {field} {shown!r} is {ours} here"


def trl_table() -> str:
    """The Markdown table docs/migrating.md carries (a test keeps the two equal): the mapped names, then those
    with no counterpart (the vLLM ones in one row)."""
    rows = [f"| `{trl}` | `{ours}` | {note} |" for trl, (ours, note) in TRL_KEYS.items()]
    absent = {key: why for key, why in TRL_ABSENT.items() if key not in _VLLM_KEYS}
    rows += [f"| `use_vllm`, `vllm_*` | - | {_NO_VLLM} |"]
    rows += [f"| `{trl}` | - | {why} |" for trl, why in absent.items()]
    return "\n".join(["| TRL GRPOConfig | here | what to know |", "|---|---|---|", *rows])
