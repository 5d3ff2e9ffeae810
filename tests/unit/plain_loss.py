"""The policy loss's settings the unit tests start from (glm_grpo_ds/grpo.py LossSettings): plain GRPO."""

from glm_grpo_ds.grpo import LossSettings


def plain(**given) -> LossSettings:
    """The loss's settings: ``given``, the rest plain GRPO (no KL, the ratio clipped to [0.8, 1.2], token mean,
    token-level ratios, no entropy bonus, no two-sided clip, no off-policy mask, the KL uncorrected)."""
    base = dict(
        beta=0.0, epsilon_low=0.2, epsilon_high=0.2, aggregation="token_mean", importance_sampling_level="token",
        entropy_coef=0.0, delta=None, off_policy_mask_threshold=None, kl_bias_correction=False, objective="clip",
        cispo_max=5.0, sapo_temperature_pos=1.0, sapo_temperature_neg=1.05, vespo_k_pos=2.0,
        vespo_lambda_pos=3.0, vespo_k_neg=3.0, vespo_lambda_neg=2.0,
    )  # fmt: skip
    return LossSettings(**{**base, **given})
