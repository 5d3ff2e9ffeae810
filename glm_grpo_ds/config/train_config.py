"""A whole training run's config: the sections plus the top-level keys, and the validation of their
combinations (one line per problem)."""

from __future__ import annotations

from dataclasses import dataclass

from .fields import ConfigError, choice_error, choice_problems, is_repo_id, setting
from .sections import (
    TRACKER_PIP,
    TRACKERS,
    BatchConfig,
    DataConfig,
    DecoderConfig,
    EvalConfig,
    GRPOConfig,
    HubConfig,
    LoggingConfig,
    LoraConfig,
    ModelConfig,
    MonitorConfig,
    OptimizerConfig,
    RewardSpec,
    RolloutConfig,
    tracker_installed,
)


@dataclass
class TrainConfig:
    """A training run: the sections below plus the top-level keys."""

    model: ModelConfig = setting(help="The GLM-Image pipeline the policy is loaded from.", factory=ModelConfig)
    lora: LoraConfig | None = setting(
        help="peft LoRA on the language model only (vision tower and VQ model frozen); null = full fine-tuning.",
        factory=LoraConfig,
    )
    grpo: GRPOConfig = setting(help="The GRPO objective and the rollout's sampling.", factory=GRPOConfig)
    optimizer: OptimizerConfig = setting(help="Optimizer and learning-rate schedule.", factory=OptimizerConfig)
    batch: BatchConfig = setting(help="Batch sizes per rank and step.", factory=BatchConfig)
    rollout: RolloutConfig = setting(help="Image size and parameter gathering of the rollout.", factory=RolloutConfig)
    decoder: DecoderConfig = setting(help="The frozen DiT decode of the sampled tokens.", factory=DecoderConfig)
    rewards: list[RewardSpec] = setting(
        help="The rewards, at least one: a list of {name, weight, args}, e.g. [{name: pixel_mse}].", factory=list
    )
    data: DataConfig = setting(help="The training prompts.", factory=DataConfig)
    logging: LoggingConfig = setting(
        help="Progress output, trackers, plots and galleries (rank 0).", factory=LoggingConfig
    )
    eval: EvalConfig = setting(
        help="Held-out evaluation with seeds that do not depend on the training step, rank count or seed: the same "
        "weights always get the same eval reward.",
        factory=EvalConfig,
    )
    monitor: MonitorConfig = setting(
        help="Image statistics, within-group diversity and the alarms on them (docs/monitoring.md).",
        factory=MonitorConfig,
    )
    hub: HubConfig = setting(
        help="The model card of the final weights and pushing them to the Hugging Face Hub (docs/sharing.md).",
        factory=HubConfig,
    )
    output_dir: str = setting("outputs/run", "Where the run writes metrics, checkpoints, galleries and config.json.")
    max_steps: int = setting(100, "Training steps (one rollout and grpo.num_iterations updates each), >= 1.")
    seed: int = setting(
        42,
        "Base seed of the run's random streams (sampling, data order; glm_grpo_ds/runtime/seeding.py); the decoder "
        "noise and the evaluation have seeds of their own (decoder.seed, eval.seed).",
    )
    save_steps: int = setting(0, "Checkpoint every N steps (0 = never); see glm_grpo_ds/lifecycle/checkpoint.py.")
    save_total_limit: int = setting(
        0,
        "Keep this run's newest K checkpoints (0 = keep all); never deletes the one `latest` names, nor another run's.",
    )
    resume_from: str | None = setting(
        None,
        '"auto" (resume from output_dir\'s latest checkpoint when it has one, else start fresh: what the launch '
        'scripts pass, so a requeued job continues), "latest" (output_dir\'s newest complete checkpoint, which must '
        "exist) or a checkpoint path; null = start fresh.",
    )
    overwrite_output_dir: bool = setting(
        False,
        "A fresh run (no resume_from, or auto finding no checkpoint) in an output_dir that holds an earlier run's "
        "checkpoints, metrics.jsonl or final weights: false = refused (resume it, or pick another output_dir); "
        "true = start over: the earlier run's checkpoints/, metrics.jsonl, eval.jsonl, final_adapter/, final_model/, "
        "samples/ and tensorboard/ are deleted first. Not with resume_from=latest or a path.",
    )
    max_consecutive_skips: int = setting(
        3,
        "Stop (checkpoint + exit code 3) after this many steps in a row whose optimizer update was skipped for a "
        "non-finite loss/gradient or rewards undefined for every sample; 0 = never stop.",
    )
    force_collectives: bool = setting(
        False,
        "Run every collective even at world size 1 (normally skipped): one GPU with NCCL then checks the multi-GPU "
        "communication path (device placement of every collective) - see glm_grpo_ds/ds/dist.py.",
    )
    dist_timeout_minutes: float = setting(
        60.0,
        "How long a collective may wait for the slowest rank before the run fails (the process group's timeout, "
        "passed to deepspeed.init_distributed; it overrides DEEPSPEED_TIMEOUT). Rank 0's long work (Hub "
        "downloads, checkpoint uploads, pruning) does not count against it; fractions are allowed (0.5 = 30 s).",
    )

    @property
    def sequences_per_rank(self) -> int:
        return self.batch.prompts_per_rank * self.grpo.group_size

    @property
    def needs_reference_model(self) -> bool:
        """A frozen copy of the AR for the KL term: full fine-tuning with ``beta > 0`` (LoRA's reference is the
        policy with its adapters disabled; ``beta = 0`` skips the reference pass)."""
        return self.lora is None and self.grpo.beta > 0

    @property
    def reference_in_rollout(self) -> bool:
        """LoRA with ``beta > 0``: the reference log-probs (the policy with its adapters off) are computed inside
        the rollout's parameter gather (glm_grpo_ds/update.py ``logprobs_before_update``)."""
        return self.lora is not None and self.grpo.beta > 0

    @property
    def logprobs_in_rollout(self) -> bool:
        """Teacher-forced passes inside the rollout's gather: the LoRA reference, and the old log-probs of
        ``num_iterations > 1`` (the policy has not changed since it sampled)."""
        return self.reference_in_rollout or self.grpo.num_iterations > 1

    @property
    def total_optimizer_steps(self) -> int:
        """Optimizer steps of the whole run, the length of the lr schedule: ``num_iterations`` per step."""
        return self.max_steps * self.grpo.num_iterations

    def validate(self) -> None:
        """Raise ConfigError listing every problem, one line each."""
        problems: list[str] = []

        def need(ok: bool, msg: str) -> None:
            if not ok:
                problems.append(msg)

        need(bool(self.model.path), "model.path is required: a GlmImagePipeline directory or a Hub id (org/name)")
        problems.extend(choice_problems(self))  # every Literal[...] field, choices from its annotation
        need(
            bool(self.data.train_file),
            "data.train_file is required: a prompt file (.txt, .jsonl, .parquet, .csv, .json), a dataset directory "
            "or a Hub dataset id",
        )
        keys = {"data.prompt_key": self.data.prompt_key, "data.target_image_key": self.data.target_image_key}
        keys["data.text_key"] = self.data.text_key
        need(all(keys.values()), f"{', '.join(keys)} must not be empty")
        need(len(set(keys.values())) == 3, f"{', '.join(keys)} must name three different columns, got {keys}")
        need(self.max_steps >= 1, f"max_steps must be >= 1, got {self.max_steps}")
        need(self.save_steps >= 0, f"save_steps must be >= 0 (0 = no checkpoints), got {self.save_steps}")
        need(
            self.max_consecutive_skips >= 0,
            f"max_consecutive_skips must be >= 0 (0 = never stop), got {self.max_consecutive_skips}",
        )
        need(
            not (self.overwrite_output_dir and self.resume_from not in (None, "auto")),
            f"overwrite_output_dir=true starts over but resume_from={self.resume_from} continues a run: pick one",
        )
        need(
            self.dist_timeout_minutes > 0,
            f"dist_timeout_minutes must be > 0 (minutes; fractions allowed), got {self.dist_timeout_minutes}",
        )
        need(self.save_total_limit >= 0, f"save_total_limit must be >= 0 (0 = keep all), got {self.save_total_limit}")
        g = self.grpo
        need(
            g.group_size >= 2,
            f"grpo.group_size must be >= 2 (advantages compare samples of a prompt), got {g.group_size}",
        )
        need(g.beta >= 0, f"grpo.beta must be >= 0, got {g.beta}")
        need(0 <= g.epsilon_low < 1, f"grpo.epsilon_low must be in [0, 1), got {g.epsilon_low}")
        need(g.epsilon_high >= 0, f"grpo.epsilon_high must be >= 0, got {g.epsilon_high}")
        need(g.num_iterations >= 1, f"grpo.num_iterations must be >= 1, got {g.num_iterations}")
        need(g.logprob_chunk_size >= 1, f"grpo.logprob_chunk_size must be >= 1, got {g.logprob_chunk_size}")
        need(
            0 <= g.top_entropy_quantile <= 1,
            f"grpo.top_entropy_quantile must be in [0, 1], got {g.top_entropy_quantile}",
        )
        # a fraction that keeps under one token of a sequence trains (almost) nothing: 0 keeps the single
        # highest-entropy token of a micro-batch (TRL's meaning), and grad_norm reads ~0
        grid = (self.rollout.height // 32) * (self.rollout.width // 32)  # the target grid's tokens
        if 0 <= g.top_entropy_quantile < 1 and grid > 0:
            need(
                g.top_entropy_quantile * grid >= 1,
                f"grpo.top_entropy_quantile={g.top_entropy_quantile} keeps {g.top_entropy_quantile * grid:.3g} of the "
                f"{grid} target-grid tokens of a sequence at {self.rollout.height}x{self.rollout.width}: (almost) "
                f"nothing to train on; use >= {1 / grid:.3g} (the paper's 0.2, or 1 = every token)",
            )
        need(g.entropy_coef >= 0, f"grpo.entropy_coef must be >= 0, got {g.entropy_coef}")
        need(0 <= g.preview_weight <= 1, f"grpo.preview_weight must be in [0, 1], got {g.preview_weight}")
        need(g.rank_tie_tolerance >= 0, f"grpo.rank_tie_tolerance must be >= 0, got {g.rank_tie_tolerance}")
        need(g.sampler_correction_max > 0, f"grpo.sampler_correction_max must be > 0, got {g.sampler_correction_max}")
        low = g.sampler_correction_min
        need(
            low is None or 0 <= low < g.sampler_correction_max,
            f"grpo.sampler_correction_min must be null or in [0, sampler_correction_max), got {low}",
        )
        need(g.mismatch_threshold > 0, f"grpo.mismatch_threshold must be > 0, got {g.mismatch_threshold}")
        gate = g.disagreement_gate
        need(gate is None or gate > 0, f"grpo.disagreement_gate must be null or > 0, got {gate}")
        need(
            gate is None or len(self.rewards) > 1,
            f"grpo.disagreement_gate={gate} compares several rewards, but rewards has {len(self.rewards)}: add the "
            "auxiliary rewards or set it to null",
        )
        # settings that would do nothing with the others as they are: refused rather than silently ignored
        need(
            g.preview_in_loss or g.preview_weight == 1.0,
            f"grpo.preview_weight={g.preview_weight} weighs preview tokens that grpo.preview_in_loss=false takes out "
            "of the loss: set one of them",
        )
        need(
            g.rank_tie_tolerance == 0 or g.reward_combination.startswith("win_rate"),
            f"grpo.rank_tie_tolerance={g.rank_tie_tolerance} applies to the win_rate combinations only, but "
            f"grpo.reward_combination={g.reward_combination}: set reward_combination=win_rate or the tolerance to 0",
        )
        need(
            g.sampler_correction != "none" or low is None,
            f"grpo.sampler_correction_min={low} caps weights that grpo.sampler_correction=none never computes: "
            "choose a sampler_correction or drop the cap",
        )
        need(
            not self.rollout.adapters_in_model_dtype or self.lora is not None,
            "rollout.adapters_in_model_dtype casts LoRA adapters, but this config fine-tunes the whole model "
            "(lora: null): drop the setting",
        )
        need(
            not self.rollout.merge_lora or self.lora is not None,
            "rollout.merge_lora merges LoRA adapters, but this config fine-tunes the whole model (lora: null), "
            "whose rollout already runs the plain model: drop the setting",
        )
        need(
            not self.rollout.fuse_lora or self.lora is not None,
            "rollout.fuse_lora fuses LoRA adapters, but this config fine-tunes the whole model (lora: null), "
            "whose rollout already runs the plain model: drop the setting",
        )
        need(
            not (self.rollout.fuse_lora and self.rollout.merge_lora),
            "rollout.fuse_lora samples the adapters unmerged, rollout.merge_lora merged: choose one (fuse_lora is "
            "exact, merge_lora rounds the adapter into the weights' dtype); to sample merged set "
            "rollout.fuse_lora=false",
        )
        need(
            self.rollout.compile or self.rollout.compile_scope == "step",
            f"rollout.compile_scope={self.rollout.compile_scope} chooses what rollout.compile=false never compiles: "
            "set rollout.compile=true or drop compile_scope",
        )
        need(
            self.rollout.merge_lora or self.rollout.merge_copy == "auto",
            f"rollout.merge_copy={self.rollout.merge_copy} places a copy that rollout.merge_lora=false never makes: "
            "set rollout.merge_lora=true or drop merge_copy",
        )
        problems.extend(g.sampling.problems("grpo.sampling."))
        o = self.optimizer
        need(o.lr > 0, f"optimizer.lr must be > 0, got {o.lr}")
        need(len(o.betas) == 2, f"optimizer.betas must be two numbers, got {o.betas}")
        need(o.warmup_steps >= 0, f"optimizer.warmup_steps must be >= 0, got {o.warmup_steps}")
        b = self.batch
        need(b.prompts_per_rank >= 1, f"batch.prompts_per_rank must be >= 1, got {b.prompts_per_rank}")
        need(b.micro_batch_size >= 1, f"batch.micro_batch_size must be >= 1, got {b.micro_batch_size}")
        if b.micro_batch_size >= 1 and b.prompts_per_rank >= 1:
            need(
                self.sequences_per_rank % b.micro_batch_size == 0,
                f"batch.micro_batch_size={b.micro_batch_size} must divide the sequences per rank per step "
                f"(batch.prompts_per_rank x grpo.group_size = {self.sequences_per_rank})",
            )
        for key, v in (("rollout.height", self.rollout.height), ("rollout.width", self.rollout.width)):
            need(
                v > 0 and v % 32 == 0,
                f"{key}={v} must be a positive multiple of 32 (GLM-Image tokens are 32x32 pixels)",
            )
        problems.extend(self.decoder.problems("decoder."))
        problems.extend(self.eval.problems("eval."))
        problems.extend(self.monitor.problems("monitor.", [r.name for r in self.rewards]))
        problems.extend(self.data.problems("data."))
        need(len(self.rewards) > 0, "rewards: at least one reward is required, e.g. rewards: [{name: pixel_mse}]")
        for i, r in enumerate(self.rewards):
            need(bool(r.name), f"rewards[{i}].name is required")
        self._validate_logging(need)
        self._validate_hub(need)
        if self.lora is not None:
            need(self.lora.r >= 1, f"lora.r must be >= 1, got {self.lora.r}")
            need(len(self.lora.target_modules) > 0, "lora.target_modules must name at least one module")
        if problems:
            raise ConfigError("\n".join(problems))

    def _validate_logging(self, need) -> None:
        lg = self.logging
        # Checked here, on every rank, so a missing package stops all ranks before training
        # instead of failing on rank 0 only while the others wait in a collective.
        alone = [name for name in ("all", "none") if name in lg.report_to]
        need(
            not alone or len(lg.report_to) == 1,
            f"logging.report_to: {alone[0] if alone else ''} stands alone, got {lg.report_to}; "
            "list the trackers instead, e.g. [tensorboard, wandb]",
        )
        if "all" not in lg.report_to:
            for name in lg.trackers():
                need(
                    tracker_installed(name),
                    f"logging.report_to names {name} but the {name} package is not installed: "
                    f"pip install {TRACKER_PIP[name]}",
                )
        for name, kwargs in lg.tracker_kwargs.items():
            need(name in TRACKERS, choice_error(name, TRACKERS, "logging.tracker_kwargs", "tracker"))
            need(
                isinstance(kwargs, dict),
                f"logging.tracker_kwargs.{name} must be a mapping of keyword arguments, got {kwargs!r}",
            )
        need(lg.log_every >= 1, f"logging.log_every must be >= 1, got {lg.log_every}")
        need(
            lg.status_interval_s >= 0,
            f"logging.status_interval_s must be >= 0 seconds (0 = a status line at every change), got "
            f"{lg.status_interval_s}",
        )
        need(lg.gallery_steps >= 0, f"logging.gallery_steps must be >= 0 (0 = off), got {lg.gallery_steps}")
        need(lg.gallery_max_prompts >= 1, f"logging.gallery_max_prompts must be >= 1, got {lg.gallery_max_prompts}")
        need(lg.gallery_thumbnail >= 16, f"logging.gallery_thumbnail must be >= 16 pixels, got {lg.gallery_thumbnail}")

    def _validate_hub(self, need) -> None:
        h = self.hub
        if h.repo_id is not None:
            need(
                is_repo_id(h.repo_id),
                f"hub.repo_id={h.repo_id!r} is not a Hub repo id: write namespace/name (your user or organisation, "
                "then the repo name: letters, digits, '-', '_', '.'), or null for no upload",
            )
        if h.base_model is not None:
            need(
                is_repo_id(h.base_model),
                f"hub.base_model={h.base_model!r} is not a Hub model id: write namespace/name, e.g. zai-org/GLM-Image",
            )
        for key, value in (("push_checkpoints", h.push_checkpoints), ("revision", h.revision)):
            need(
                not value or h.repo_id is not None,
                f"hub.{key} is set but hub.repo_id is null: set hub.repo_id=namespace/name to upload",
            )
        if h.push_checkpoints and h.repo_id is not None:
            need(
                self.lora is not None,
                "hub.push_checkpoints=true needs LoRA: full fine-tuning checkpoints hold DeepSpeed shards only "
                "(glm-grpo merge turns one into a pipeline); set hub.push_checkpoints=false",
            )
            need(
                self.save_steps > 0,
                "hub.push_checkpoints=true but save_steps=0 saves no checkpoint: set save_steps=N",
            )
