"""The ``grpo`` section: the GRPO objective (glm_grpo_ds/grpo.py, objectives.py, corrections.py, advantages.py) and
the rollout's sampling. It checks its own fields (``problems()``): each setting's range, then the settings the others
make ineffective (refused rather than silently ignored), then an objective's settings given with another;
TrainConfig.validate adds the rules that tie it to the other sections."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from ..advantages import COMBINATIONS, ESTIMATORS
from ..corrections import SAMPLER_CORRECTIONS
from ..grpo import AGGREGATIONS, IMPORTANCE_LEVELS
from ..objectives import OBJECTIVES
from .checks import need
from .fields import choice_problems, default_of, setting
from .model_sections import SamplingConfig
from .objective_rules import objective_number_problems, objective_problems


@dataclass
class GRPOConfig:
    """The GRPO objective (glm_grpo_ds/grpo.py, advantages.py) and the rollout's sampling."""

    group_size: int = setting(
        8,
        "G completions per prompt (>= 2: advantages compare the samples of a prompt); larger = a less noisy group "
        "baseline, for G rollouts and decodes per prompt.",
    )
    beta: float = setting(
        0.04, "k3 KL coefficient towards the frozen reference policy (>= 0); 0 skips the reference pass."
    )
    ref_sync_steps: int = setting(
        0,
        "Reset the KL term's reference to the policy every N training steps, after the step's update (ProRL's "
        "reference resets; TRL's sync_ref_model + ref_model_sync_steps, which TRL refuses under PEFT; glm_grpo_ds/"
        "model/reference.py), >= 0; 0 = never (LoRA: the base model, the adapters off). LoRA: the adapters' "
        "weights are copied (whole, on every rank) and the reference pass adds their update to the base weights; full "
        "fine-tuning: the reference model becomes ref_sync_alpha x policy + (1 - ref_sync_alpha) x reference. Each "
        "checkpoint keeps the reference. Needs beta > 0.",
    )
    ref_sync_alpha: float = setting(
        1.0,
        "ref_sync_steps: the policy's share of the reset reference, in (0, 1] (TRL's ref_model_mixup_alpha, 0.6 "
        "there); 1 = a hard reset, the only one LoRA takes (a mix of two adapters' factors is not a mix of their "
        "updates).",
    )
    objective: Literal[tuple(OBJECTIVES)] = setting(
        "clip",
        "The policy term (glm_grpo_ds/objectives.py): clip = PPO's clipped surrogate (GRPO); cispo = the importance "
        "weight capped at cispo_max and detached, times A log pi, so no token loses its gradient (MiniMax-M1, TRL's "
        "loss_type: cispo); sapo = a smooth sigmoid gate instead of the hard clip (TRL's loss_type: sapo); vespo = a "
        "whole sequence's A log pi weighted by a smooth gamma function of its importance weight (TRL's loss_type: "
        "vespo; token-level ratios only). The aggregation stays grpo.aggregation (TRL's cispo and vespo sum like "
        "token_mean, its sapo like seq_mean).",
        noun="objective",
    )
    epsilon_low: float = setting(0.2, "Ratio clip range below 1: [1 - epsilon_low, ...], in [0, 1).")
    epsilon_high: float = setting(
        0.2,
        "Ratio clip range above 1: [..., 1 + epsilon_high], >= 0; larger than epsilon_low = asymmetric clip-higher.",
    )
    aggregation: Literal[tuple(AGGREGATIONS)] = setting(
        "token_mean",
        "Loss normaliser (loss_normalizer in grpo.py): token_mean = number of loss tokens; seq_mean = per-sequence "
        "token mean, then mean over sequences; dr_grpo = sequences x padded length, a constant (Dr. GRPO).",
        noun="aggregation",
    )
    advantage_estimator: Literal[tuple(ESTIMATORS)] = setting(
        "group",
        "The advantage estimator (glm_grpo_ds/advantages.py): group = (r - group mean) / (group std + eps); "
        "batch = (r - group mean) / (std of all rewards + eps), robust to near-constant groups (Dr. GRPO-style); "
        "none = r - group mean; rloo = r - mean of the other rewards of its group (leave-one-out, RLOO). Was "
        "grpo.advantage_scale (still read, with a warning).",
        noun="advantage estimator",
    )
    reward_combination: Literal[tuple(COMBINATIONS)] = setting(
        "sum_then_normalize",
        "sum_then_normalize = advantages of the weighted reward sum; normalize_then_sum = weighted sum of each "
        "reward's group advantages, so an easy reward with a large spread cannot drown a hard one; win_rate = "
        "advantages of each sample's within-group win rate on the weighted sum (the order counts, not the gaps; "
        "Pref-GRPO); win_rate_per_reward = the weighted sum of each reward's win rates (see "
        "glm_grpo_ds/advantages.py).",
        noun="reward combination",
    )
    rank_tie_tolerance: float = setting(
        0.0,
        "win_rate combinations: rewards this close count as a tie (half a win), so score gaps smaller than the "
        "reward's noise do not order samples (>= 0).",
    )
    disagreement_gate: float | None = setting(
        None,
        "With several rewards: a sample whose other rewards disagree with the first one by more than this (the "
        "largest gap of their within-group z-scores, rewards/disagreement in metrics.jsonl; 0 = they agree, ~2 = "
        "opposite ends of the group) gets advantage 0, as GARDO gates uncertain samples (> 0); null = no gate.",
    )
    diversity_features: str | None = setting(
        None,
        "GARDO's diversity-aware advantage shaping (arXiv:2512.24138; glm_grpo_ds/advantages.py): after the "
        "estimator and the disagreement gate, a sample with a positive advantage has it multiplied by its image's "
        "cosine distance to the nearest other image of its group, over the group's mean of those distances, so good "
        "images unlike the rest teach more and good near-copies less (a group of copies keeps its advantages; GARDO "
        "shapes r - mean: advantage_estimator none). The features compared: pixels (the image box-averaged to 32 x "
        "32, its mean taken out: no model, blind to content) or a transformers vision backbone, a local directory or "
        "a Hub id (DINOv2, e.g. facebook/dinov2-large, or a transformers DINOv3 checkpoint; rewards/"
        "image_features.py); null = off.",
    )
    num_iterations: int = setting(
        1, "Updates per rollout (mu, >= 1); > 1 stores the old (pre-update) log-probs and reuses each rollout."
    )
    preview_in_loss: bool = setting(
        True,
        "Train on the preview-grid tokens too (they condition the target grid, but the DiT renders only the target "
        "grid). false = loss on the target grid's tokens alone: less variance when the reward cannot depend on the "
        "preview (the tiny world), biased for the real model.",
    )
    importance_sampling_level: Literal[tuple(IMPORTANCE_LEVELS)] = setting(
        "token",
        "token = a ratio (and its clip) per token (GRPO); sequence = one ratio per sequence, the geometric mean of its "
        "tokens' (GSPO, TRL's importance_sampling_level: sequence): for ~1 300 visual tokens and one reward per image.",
        noun="importance sampling level",
    )
    top_entropy_quantile: float = setting(
        1.0,
        "Train the policy term on the tokens whose policy entropy is in this top fraction of each micro-batch's tokens "
        "on all ranks (TRL's top_entropy_quantile, arXiv:2506.01939), in [0, 1]; 1 = every token. The KL term keeps "
        "all tokens. Below 1 the tokens that train move with batch.micro_batch_size and the rank count, as TRL's.",
    )
    preview_weight: float = setting(
        1.0,
        "Weight of the preview grid's tokens in the policy term (the target grid's: 1), in [0, 1]: a position "
        "weighting between training on every token (1) and on the target grid's alone; unlike preview_in_loss: "
        "false, the preview tokens still count in the loss normaliser and the KL term.",
    )
    entropy_coef: float = setting(
        0.0,
        "Entropy bonus: the loss gets -entropy_coef x the mean policy entropy of the trained tokens (>= 0; TRL's "
        "entropy_coef); a guard against entropy collapse, off at 0. The `entropy` metric is the mean over every "
        "loss token (with top_entropy_quantile < 1 or preview_weight != 1 the bonus acts on the selected, weighted "
        "ones). With entropy_target set: the starting coefficient.",
    )
    entropy_target: float | None = setting(
        None,
        "Adaptive entropy coefficient (Skywork-OR1, TRL's use_adaptive_entropy + entropy_target; glm_grpo_ds/"
        "entropy_control.py), in nats: after each optimizer step the coefficient grows by entropy_coef_delta while "
        "the trained tokens' mean entropy (all ranks) is at or below this, else shrinks, within [entropy_coef_min, "
        "entropy_coef_max]; the bonus applies only while the last step's entropy is at or below the target (>= 0); "
        "null = entropy_coef stays fixed.",
    )
    entropy_coef_delta: float = setting(0.005, "entropy_target: the coefficient's change per optimizer step (> 0).")
    entropy_coef_min: float = setting(0.0, "entropy_target: the coefficient's floor (>= 0).")
    entropy_coef_max: float = setting(1.0, "entropy_target: the coefficient's ceiling (>= entropy_coef_min).")
    sampler_correction: Literal[tuple(SAMPLER_CORRECTIONS)] = setting(
        "none",
        "Importance-sampling correction for the sampler's numbers differing from the trainer's (pi_old / "
        "pi_sampler, TRL's vllm_importance_sampling_mode): token_/sequence_truncate clamp the weights into "
        "[sampler_correction_min, sampler_correction_max] (TIS), token_/sequence_mask drop tokens / sequences "
        "outside; none = off.",
        noun="sampler correction",
    )
    sampler_correction_max: float = setting(3.0, "Upper cap of the sampler-correction weights (> 0).")
    sampler_correction_min: float | None = setting(
        None, "Lower cap of the sampler-correction weights (null = none; 0 <= min < max)."
    )
    delta: float | None = setting(
        None,
        "Two-sided clip (INTELLECT-2, TRL's delta): the unclipped ratio is capped at delta, so a negative "
        "advantage's loss stops growing with a ratio far above 1 + epsilon_high (> 1 + epsilon_high); null = off.",
    )
    cispo_max: float = setting(
        5.0,
        "objective cispo: the cap of the detached importance weight (> 0; ScaleRL's epsilon_max, TRL's epsilon_high "
        "under loss_type cispo).",
    )
    sapo_temperature_pos: float = setting(
        1.0, "objective sapo: the gate's temperature for a positive advantage (> 0; TRL's, the same default)."
    )
    sapo_temperature_neg: float = setting(
        1.05,
        "objective sapo: the gate's temperature for a zero or negative advantage (> 0; larger = the gate closes "
        "sooner as the ratio leaves 1; TRL's, the same default).",
    )
    vespo_k_pos: float = setting(
        2.0,
        "objective vespo: the exponent k of the weight phi(w) = e^lambda w^k e^(-lambda w) of a sequence with A >= 0 "
        "(>= 0; w = the product of its tokens' ratios; phi peaks at w = k / lambda; TRL's, the same default).",
    )
    vespo_lambda_pos: float = setting(
        3.0, "objective vespo: the decay lambda of phi for A >= 0 (> 0; larger = a narrower weight; TRL's default)."
    )
    vespo_k_neg: float = setting(3.0, "objective vespo: the exponent k of phi for A < 0 (>= 0; TRL's default).")
    vespo_lambda_neg: float = setting(2.0, "objective vespo: the decay lambda of phi for A < 0 (> 0; TRL's default).")
    off_policy_mask_threshold: float | None = setting(
        None,
        "Off-policy sequence masking (DeepSeek-V3.2, TRL's off_policy_mask_threshold): a sequence with a negative "
        "advantage whose mean KL from the sampler to the policy (log pi_sampler - log pi_theta over its tokens) "
        "exceeds this leaves the policy term: stale samples (rollout.one_step_off, num_iterations > 1) (>= 0); "
        "null = off.",
    )
    kl_bias_correction: bool = setting(
        False,
        "Weight the k3 KL term by the importance ratio pi_theta / pi_old (TRL's use_bias_correction_kl, "
        "DeepSeek-V3.2): the KL estimated under the policy, not the one that sampled; needs beta > 0.",
    )
    mismatch_threshold: float = setting(
        0.1,
        "The `mismatch/frac_beyond` metric counts tokens whose sampler and trainer log-probs differ by more than this.",
    )
    logprob_chunk_size: int = setting(
        256,
        "Tokens per lm_head chunk (fp32 log-softmax) in the teacher-forced pass (>= 1): smaller = less peak memory.",
    )
    sampling: SamplingConfig = setting(help="How the rollout samples visual tokens.", factory=SamplingConfig)

    def problems(self, prefix: str = "grpo.") -> list[str]:
        """One line per problem, keys written ``<prefix>key``: an unknown choice first (the checks below read
        reward_combination and sampler_correction), then each setting's range, then the settings the others make
        ineffective, then ``<prefix>sampling``."""
        problems = choice_problems(self, prefix) + self._range_problems(prefix) + self._ineffective_problems(prefix)
        return problems + objective_problems(self, prefix) + self.sampling.problems(f"{prefix}sampling.")

    def _range_problems(self, prefix: str) -> list[str]:
        """Each setting out of its range, one line each."""
        problems: list[str] = []
        need(
            problems,
            self.group_size >= 2,
            f"{prefix}group_size must be >= 2 (advantages compare samples of a prompt), got {self.group_size}",
        )
        need(problems, 0 <= self.beta < math.inf, f"{prefix}beta must be >= 0 and finite, got {self.beta}")
        need(problems, self.ref_sync_steps >= 0, f"{prefix}ref_sync_steps must be >= 0, got {self.ref_sync_steps}")
        need(
            problems,
            0 < self.ref_sync_alpha <= 1,
            f"{prefix}ref_sync_alpha must be in (0, 1], got {self.ref_sync_alpha}",
        )
        need(problems, 0 <= self.epsilon_low < 1, f"{prefix}epsilon_low must be in [0, 1), got {self.epsilon_low}")
        need(problems, self.epsilon_high >= 0, f"{prefix}epsilon_high must be >= 0, got {self.epsilon_high}")
        need(problems, self.num_iterations >= 1, f"{prefix}num_iterations must be >= 1, got {self.num_iterations}")
        need(
            problems,
            self.logprob_chunk_size >= 1,
            f"{prefix}logprob_chunk_size must be >= 1, got {self.logprob_chunk_size}",
        )
        need(
            problems,
            0 <= self.top_entropy_quantile <= 1,
            f"{prefix}top_entropy_quantile must be in [0, 1], got {self.top_entropy_quantile}",
        )
        need(
            problems,
            0 <= self.entropy_coef < math.inf,
            f"{prefix}entropy_coef must be >= 0 and finite, got {self.entropy_coef}",
        )
        need(
            problems,
            0 <= self.preview_weight <= 1,
            f"{prefix}preview_weight must be in [0, 1], got {self.preview_weight}",
        )
        need(
            problems,
            self.rank_tie_tolerance >= 0,
            f"{prefix}rank_tie_tolerance must be >= 0, got {self.rank_tie_tolerance}",
        )
        high, low = self.sampler_correction_max, self.sampler_correction_min
        need(problems, high > 0, f"{prefix}sampler_correction_max must be > 0, got {high}")
        need(
            problems,
            low is None or 0 <= low < high,
            f"{prefix}sampler_correction_min must be null or in [0, sampler_correction_max), got {low}",
        )
        need(
            problems,
            self.mismatch_threshold > 0,
            f"{prefix}mismatch_threshold must be > 0, got {self.mismatch_threshold}",
        )
        features = self.diversity_features
        bad_features = f"{prefix}diversity_features must be null, pixels or a model's directory or Hub id, got ''"
        need(problems, features is None or features.strip() != "", bad_features)
        gate = self.disagreement_gate
        need(problems, gate is None or gate > 0, f"{prefix}disagreement_gate must be null or > 0, got {gate}")
        need(
            problems,
            self.delta is None or 1 + self.epsilon_high < self.delta < math.inf,
            f"{prefix}delta must be null or above 1 + epsilon_high = {1 + self.epsilon_high}, got {self.delta}",
        )
        bound = self.off_policy_mask_threshold
        need(
            problems,
            bound is None or 0 <= bound < math.inf,
            f"{prefix}off_policy_mask_threshold must be null or >= 0 and finite, got {bound}",
        )
        return problems + self._entropy_control_problems(prefix) + objective_number_problems(self, prefix)

    def _entropy_control_problems(self, prefix: str) -> list[str]:
        """The adaptive coefficient's settings: each in range, the start inside [min, max], none without a target."""
        problems: list[str] = []
        target, delta = self.entropy_target, self.entropy_coef_delta
        low, high, start = self.entropy_coef_min, self.entropy_coef_max, self.entropy_coef
        bad_target = f"{prefix}entropy_target must be null or >= 0 and finite, got {target}"
        need(problems, target is None or 0 <= target < math.inf, bad_target)
        need(problems, 0 < delta < math.inf, f"{prefix}entropy_coef_delta must be > 0 and finite, got {delta}")
        bad_range = f"{prefix}entropy_coef_min / _max must satisfy 0 <= min <= max < inf, got {low} / {high}"
        need(problems, 0 <= low <= high < math.inf, bad_range)
        if target is not None:
            outside = f"{prefix}entropy_coef={start} starts the adaptive coefficient outside [entropy_coef_min, "
            need(problems, low <= start <= high, f"{outside}entropy_coef_max] = [{low}, {high}]")
            return problems
        for key in ("entropy_coef_delta", "entropy_coef_min", "entropy_coef_max"):
            value = getattr(self, key)
            fixed = f"{prefix}{key}={value} moves an adaptive coefficient that {prefix}entropy_target=null leaves fixed"
            need(problems, value == default_of(self, key), f"{fixed}: set entropy_target")
        return problems

    def _ineffective_problems(self, prefix: str) -> list[str]:
        """The settings that would do nothing with the others as they are: refused rather than silently ignored."""
        problems: list[str] = []
        low = self.sampler_correction_min
        need(
            problems,
            self.preview_in_loss or self.preview_weight == 1.0,
            f"{prefix}preview_weight={self.preview_weight} weighs preview tokens that {prefix}preview_in_loss=false "
            "takes out of the loss: set one of them",
        )
        need(
            problems,
            self.rank_tie_tolerance == 0 or self.reward_combination.startswith("win_rate"),
            f"{prefix}rank_tie_tolerance={self.rank_tie_tolerance} applies to the win_rate combinations only, but "
            f"{prefix}reward_combination={self.reward_combination}: set reward_combination=win_rate or the tolerance "
            "to 0",
        )
        need(
            problems,
            self.sampler_correction != "none" or low is None,
            f"{prefix}sampler_correction_min={low} caps weights that {prefix}sampler_correction=none never computes: "
            "choose a sampler_correction or drop the cap",
        )
        high = self.sampler_correction_max
        need(
            problems,
            self.sampler_correction != "none" or high == default_of(self, "sampler_correction_max"),
            f"{prefix}sampler_correction_max={high} caps weights that {prefix}sampler_correction=none never computes: "
            "choose a sampler_correction or drop the cap",
        )
        need(
            problems,
            self.ref_sync_steps == 0 or self.beta > 0,
            f"{prefix}ref_sync_steps={self.ref_sync_steps} resets the reference of a KL term that {prefix}beta=0 "
            "leaves out: set beta > 0 or ref_sync_steps=0",
        )
        need(
            problems,
            self.ref_sync_steps > 0 or self.ref_sync_alpha == default_of(self, "ref_sync_alpha"),
            f"{prefix}ref_sync_alpha={self.ref_sync_alpha} mixes a reference that {prefix}ref_sync_steps=0 never "
            "resets: set ref_sync_steps=N",
        )
        need(
            problems,
            not self.kl_bias_correction or self.beta > 0,
            f"{prefix}kl_bias_correction=true weights a KL term that {prefix}beta=0 leaves out: set beta > 0 or "
            "drop the correction",
        )
        return problems
