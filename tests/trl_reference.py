"""TRL's own GRPO loss on given tensors, for parity tests: ``trl.GRPOTrainer._compute_loss`` runs unchanged on a
stand-in ``self`` that holds the settings it reads, one process, no model. Its forward
(``_get_per_token_logps_and_entropies``) returns the log-probs and entropies the test passes, so what is compared
is TRL's loss arithmetic, not a copy of it."""

from __future__ import annotations

import types
from collections import defaultdict

import torch
from trl import GRPOTrainer


class _OneProcess:
    """The accelerate calls ``_compute_loss`` makes, for a single process."""

    sync_gradients = True
    num_processes = 1

    @staticmethod
    def pad_across_processes(tensor, dim=0, pad_index=0):
        return tensor

    @staticmethod
    def gather(tensor):
        return tensor

    gather_for_metrics = gather

    @staticmethod
    def reduce(tensor, reduction="sum"):
        return tensor


def _adaptive_args(adaptive: dict) -> dict:
    keys = {"target": "entropy_target", "delta": "entropy_coef_delta", "min": "entropy_coef_min"}
    return {"entropy_coef_max": adaptive["max"], **{trl: adaptive[ours] for ours, trl in keys.items()}}


def trl_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_type: str = "bnpo",
    beta: float = 0.0,
    ref_logp: torch.Tensor | None = None,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    importance_sampling_level: str = "token",
    top_entropy_quantile: float = 1.0,
    entropies: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    importance_sampling_ratio: torch.Tensor | None = None,
    delta: float | None = None,
    off_policy_mask_threshold: float | None = None,
    sampling_logp: torch.Tensor | None = None,
    use_bias_correction_kl: bool = False,
    sapo_temperatures: tuple[float, float] = (1.0, 1.05),
    vespo: tuple[float, float, float, float] = (2.0, 3.0, 3.0, 2.0),
    adaptive: dict | None = None,
    metrics: dict | None = None,
) -> torch.Tensor:
    """TRL 1.16's loss for one micro-batch (gradient accumulation 1, train mode). TRL's loss types: ``bnpo`` = our
    token_mean, ``grpo`` = our seq_mean, ``dr_grpo`` = ours with T = the completion length; ``cispo`` = our objective
    cispo (its cap TRL's ``epsilon_high``) with token_mean, ``sapo`` = our objective sapo (``sapo_temperatures``:
    positive, negative) with seq_mean, ``vespo`` = our objective vespo (``vespo``: its k_pos, lambda_pos, k_neg,
    lambda_neg) with token_mean. ``metrics``: filled with what TRL logs for the call (its
    ``_metrics["train"]``: ``kl``, ``entropy``, ``clip_ratio/low_mean``, ...). ``adaptive``: TRL's adaptive entropy
    coefficient (``use_adaptive_entropy``) across calls, one optimizer step each: ``coef`` and ``last`` (its
    ``entropy_coef`` and ``_last_world_entropy``, read and written back), ``target``, ``delta``, ``min``, ``max``."""
    n, t = logp.shape
    entropies = torch.zeros_like(logp) if entropies is None else entropies
    fake = types.SimpleNamespace(
        aux_loss_enabled=False,
        top_entropy_quantile=top_entropy_quantile,
        accelerator=_OneProcess(),
        off_policy_mask_threshold=off_policy_mask_threshold,
        get_off_policy_mask=GRPOTrainer.get_off_policy_mask,  # a staticmethod: TRL's own, unchanged
        get_gamma_weights=GRPOTrainer.get_gamma_weights,  # vespo's weights, a staticmethod too
        importance_sampling_level=importance_sampling_level,
        beta=beta,
        args=types.SimpleNamespace(
            use_bias_correction_kl=use_bias_correction_kl,
            delta=delta,
            sapo_temperature_pos=sapo_temperatures[0],
            sapo_temperature_neg=sapo_temperatures[1],
            **dict(zip(("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg"), vespo)),
            steps_per_generation=1,
            **({} if adaptive is None else _adaptive_args(adaptive)),
        ),
        loss_type=loss_type,
        epsilon_low=epsilon_low,
        epsilon_high=epsilon_high,
        use_vllm=importance_sampling_ratio is not None,
        vllm_importance_sampling_correction=importance_sampling_ratio is not None,
        model=types.SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        max_completion_length=t,
        _entropy_bonus_enabled=entropy_coef != 0.0 or adaptive is not None,
        entropy_coef=entropy_coef if adaptive is None else adaptive["coef"],
        use_adaptive_entropy=adaptive is not None,
        _last_world_entropy=None if adaptive is None else adaptive["last"],
        _entropy_window_stats=None,
        _metrics=defaultdict(lambda: defaultdict(list)),
        _get_per_token_logps_and_entropies=lambda *args, **kwargs: (logp, entropies, None),
    )
    fake.get_high_entropy_mask = types.MethodType(GRPOTrainer.get_high_entropy_mask, fake)
    inputs = {
        "prompt_ids": torch.zeros(n, 1, dtype=torch.long),
        "prompt_mask": torch.ones(n, 1, dtype=torch.long),
        "completion_ids": torch.zeros(n, t, dtype=torch.long),
        "completion_mask": mask,
        "advantages": advantages,
        "old_per_token_logps": old_logp,
        "num_items_in_batch": mask.sum(),  # cispo's, vespo's normaliser: the masked tokens (one process, one step)
    }
    if ref_logp is not None:
        inputs["ref_per_token_logps"] = ref_logp
    if importance_sampling_ratio is not None:
        inputs["importance_sampling_ratio"] = importance_sampling_ratio
    if sampling_logp is not None:  # the sampler's log-probs (TRL's vLLM ones), which its off-policy mask reads
        inputs["sampling_per_token_logps"] = sampling_logp
    loss = GRPOTrainer._compute_loss(fake, None, inputs)
    if adaptive is not None:
        adaptive.update(coef=fake.entropy_coef, last=fake._last_world_entropy)
    if metrics is not None:
        metrics.update({key: values[-1] for key, values in fake._metrics["train"].items()})
    return loss
