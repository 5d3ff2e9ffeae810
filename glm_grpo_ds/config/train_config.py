"""A whole training run's config: the sections plus the top-level keys, and the validation of their
combinations (one line per problem)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .checks import need
from .fields import ConfigError, choice_problems, setting
from .grpo_section import GRPOConfig
from .model_sections import DecoderConfig, LoraConfig, ModelConfig, RolloutConfig
from .run_sections import DataConfig, EvalConfig, HubConfig, LoggingConfig, MonitorConfig
from .training_sections import BatchConfig, OptimizerConfig, RewardSpec


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
        help="Progress output, trackers, plots and galleries (rank 0); every rank's hang watchdog.",
        factory=LoggingConfig,
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
    max_steps: int = setting(
        100, "Training steps (one rollout and grpo.num_iterations x batch.mini_batches updates each), >= 1."
    )
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
    save_best: bool = setting(
        False,
        "Keep the checkpoint with the highest eval/reward_mean among those saved at an evaluated step, named by "
        "checkpoints/best (best.json: its step and reward) and never pruned while it is the best; needs eval.file "
        "and a save step that is an evaluation step (save_steps a multiple of eval.steps, or the last step).",
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
    allow_batch_change: bool = setting(
        False,
        "A resume on another world size whose prompts per step (world size x batch.prompts_per_rank) differ from the "
        "checkpoint's: false = refused, naming the batch.prompts_per_rank that keeps them; true = go on with the new "
        'global batch (docs/checkpoints.md, "Resume on another cluster shape").',
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
        "passed to deepspeed.init_distributed, where it overrides DEEPSPEED_TIMEOUT, and the default of every "
        "group DeepSpeed creates). Rank 0's long work (Hub downloads, a checkpoint's conversion, uploads, "
        "pruning) does not count against it; fractions are allowed (0.5 = 30 s).",
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
        """LoRA with ``beta > 0``: the reference log-probs (the policy with its adapters off, plus the copy of the
        last reference reset) are computed inside the rollout's parameter gather (glm_grpo_ds/update.py
        ``logprobs_before_update``). Not one step off with resets: that rollout runs before the previous step's reset,
        so the update computes them."""
        resets_after = self.grpo.ref_sync_steps > 0 and self.rollout.one_step_off
        return self.lora is not None and self.grpo.beta > 0 and not resets_after

    @property
    def logprobs_in_rollout(self) -> bool:
        """Teacher-forced passes inside the rollout's gather: the LoRA reference, and the old log-probs where the
        rollout's weights are the update's (:attr:`old_logprobs_in_rollout`)."""
        return self.reference_in_rollout or self.old_logprobs_in_rollout

    @property
    def old_logprobs_in_rollout(self) -> bool:
        """More than one update per rollout, on-policy: the rollout's gather computes the pre-update log-probs. One
        step off policy, the rollout ran before the previous update: the update computes them from its own weights."""
        return self.updates_per_step > 1 and not self.rollout.one_step_off

    @property
    def updates_per_step(self) -> int:
        """Optimizer steps per training step: ``grpo.num_iterations`` passes over ``batch.mini_batches`` each."""
        return self.grpo.num_iterations * self.batch.mini_batches

    @property
    def total_optimizer_steps(self) -> int:
        """Optimizer steps of the whole run, the length of the lr schedule: :attr:`updates_per_step` per step."""
        return self.max_steps * self.updates_per_step

    def validate(self) -> None:
        """Raise ConfigError listing every problem, one line each: each section's own (its ``problems()``), the
        top-level keys', and the rules that tie sections together, which no section can check alone."""
        problems = self.model.problems("model.")
        problems += choice_problems(self)  # the top-level Literal[...] fields; each section checks its own
        problems += self.data.problems("data.")
        problems += self._top_level_problems()
        problems += self._grpo_problems()
        problems += self._rollout_problems()
        problems += self.optimizer.problems("optimizer.")
        problems += self._batch_problems()
        problems += self.decoder.problems("decoder.")
        problems += self.eval.problems("eval.")
        problems += self.monitor.problems("monitor.", [r.name for r in self.rewards])
        need(
            problems,
            not (self.monitor.stop_on_alarm and self.monitor.alarms and self.eval.file and self.eval.steps == 0),
            "monitor.stop_on_alarm checks the alarms at each evaluation when the run evaluates, and eval.steps=0 "
            "evaluates only before training and after the last step: set eval.steps=N to check every N steps",
        )
        need(
            problems,
            len(self.rewards) > 0,
            "rewards: at least one reward is required, e.g. rewards: [{name: pixel_mse}]",
        )
        for i, r in enumerate(self.rewards):
            problems += r.problems(f"rewards[{i}].")
        problems += self.logging.problems("logging.")
        problems += self._hub_problems()
        if self.lora is not None:
            problems += self.lora.problems("lora.")
        if problems:
            raise ConfigError("\n".join(problems))

    def _grpo_problems(self) -> list[str]:
        """The grpo section's own problems, and what its settings need of the rollout's size and the rewards."""
        g, rollout = self.grpo, self.rollout
        problems = g.problems("grpo.")
        need(
            problems,
            self.lora is None or g.ref_sync_alpha == 1,
            f"grpo.ref_sync_alpha={g.ref_sync_alpha}: a LoRA run's reference resets take the adapters whole (1.0): "
            "a mix of two adapters' factors is not a mix of their updates; set it to 1 (or fine-tune the whole "
            "model, lora: null)",
        )
        # a fraction that keeps under one token of a sequence trains (almost) nothing: 0 keeps the single
        # highest-entropy token of a micro-batch (TRL's meaning), and grad_norm reads ~0
        grid = (rollout.height // 32) * (rollout.width // 32)  # the target grid's tokens
        if 0 <= g.top_entropy_quantile < 1 and grid > 0:
            need(
                problems,
                g.top_entropy_quantile * grid >= 1,
                f"grpo.top_entropy_quantile={g.top_entropy_quantile} keeps {g.top_entropy_quantile * grid:.3g} of the "
                f"{grid} target-grid tokens of a sequence at {rollout.height}x{rollout.width}: (almost) "
                f"nothing to train on; use >= {1 / grid:.3g} (the paper's 0.2, or 1 = every token)",
            )
        need(
            problems,
            g.disagreement_gate is None or len(self.rewards) > 1,
            f"grpo.disagreement_gate={g.disagreement_gate} compares several rewards, but rewards has "
            f"{len(self.rewards)}: add the auxiliary rewards or set it to null",
        )
        return problems

    def _batch_problems(self) -> list[str]:
        """The batch section's own problems, and that its micro-batches divide a rank's sequences of a step."""
        b = self.batch
        problems = b.problems("batch.")
        if b.micro_batch_size >= 1 and b.prompts_per_rank >= 1 and b.mini_batches >= 1:
            need(
                problems,
                self.sequences_per_rank % b.micro_batch_size == 0,
                f"batch.micro_batch_size={b.micro_batch_size} must divide the sequences per rank per step "
                f"(batch.prompts_per_rank x grpo.group_size = {self.sequences_per_rank})",
            )
            need(
                problems,
                b.mini_batches == 1 or self.sequences_per_rank % (b.mini_batches * b.micro_batch_size) == 0,
                f"batch.mini_batches={b.mini_batches} x batch.micro_batch_size={b.micro_batch_size} must divide the "
                f"sequences per rank per step (batch.prompts_per_rank x grpo.group_size = {self.sequences_per_rank})",
            )
        return problems

    def _hub_problems(self) -> list[str]:
        """The hub section's own problems, and what pushing checkpoints needs (LoRA, checkpoints saved)."""
        h = self.hub
        problems = h.problems("hub.")
        if h.push_checkpoints and h.repo_id is not None:
            need(
                problems,
                self.lora is not None,
                "hub.push_checkpoints=true needs LoRA: full fine-tuning checkpoints hold DeepSpeed shards only "
                "(glm-grpo merge turns one into a pipeline); set hub.push_checkpoints=false",
            )
            need(
                problems,
                self.save_steps > 0,
                "hub.push_checkpoints=true but save_steps=0 saves no checkpoint: set save_steps=N",
            )
        return problems

    def _rollout_problems(self) -> list[str]:
        """The rollout section's own problems, and what its settings need of the others (LoRA; one step off)."""
        problems: list[str] = []
        rollout = self.rollout
        if self.lora is None:  # LoRA-only rollout settings: refused rather than silently ignored
            need(
                problems,
                not rollout.adapters_in_model_dtype,
                "rollout.adapters_in_model_dtype casts LoRA adapters, but this config fine-tunes the whole model "
                "(lora: null): drop the setting",
            )
            for key, verb in (("merge_lora", "merges"), ("fuse_lora", "fuses")):
                need(
                    problems,
                    not getattr(rollout, key),
                    f"rollout.{key} {verb} LoRA adapters, but this config fine-tunes the whole model (lora: null), "
                    "whose rollout already runs the plain model: drop the setting",
                )
        problems += rollout.problems("rollout.")
        return problems + self._one_step_off_problems()

    def _one_step_off_problems(self) -> list[str]:
        """What ``rollout.one_step_off`` needs of the other sections (ZeRO-3 is refused with the DeepSpeed config:
        ds/ds_config.py)."""
        problems: list[str] = []
        if self.rollout.one_step_off:
            need(
                problems,
                self.grpo.sampler_correction != "none",
                "rollout.one_step_off samples with the weights one update old: set grpo.sampler_correction (e.g. "
                "token_truncate) so the update reweighs each token by the current policy over the sampling one",
            )
            need(
                problems,
                self.data.dead_prompt_skip_prob == 0,
                "rollout.one_step_off draws step t+1's prompts before step t's dead groups are known: set "
                "data.dead_prompt_skip_prob=0 or rollout.one_step_off=false",
            )
        return problems

    def _top_level_problems(self) -> list[str]:
        """The problems of the top-level keys (max_steps, save_steps, ...), one line each."""
        problems = []
        if not self.max_steps >= 1:
            problems.append(f"max_steps must be >= 1, got {self.max_steps}")
        if not self.output_dir.strip():  # "" would be the working directory: its config.json, logs/, checkpoints/
            problems.append("output_dir is empty: give the run's directory, e.g. output_dir=outputs/my_run")
        if not self.save_steps >= 0:
            problems.append(f"save_steps must be >= 0 (0 = no checkpoints), got {self.save_steps}")
        if not self.max_consecutive_skips >= 0:
            problems.append(f"max_consecutive_skips must be >= 0 (0 = never stop), got {self.max_consecutive_skips}")
        if self.overwrite_output_dir and self.resume_from not in (None, "auto"):
            problems.append(
                f"overwrite_output_dir=true starts over but resume_from={self.resume_from} continues a run: pick one"
            )
        if not 0 < self.dist_timeout_minutes < math.inf:  # torch's timedelta cannot hold inf
            problems.append(
                f"dist_timeout_minutes must be > 0 and finite (minutes; fractions allowed), got "
                f"{self.dist_timeout_minutes}"
            )
        if not self.save_total_limit >= 0:
            problems.append(f"save_total_limit must be >= 0 (0 = keep all), got {self.save_total_limit}")
        if self.save_best and not self._best_can_be_kept():
            problems.append(
                "save_best=true keeps the best evaluated checkpoint, and this run has none: give eval.file, and "
                f"save_steps (now {self.save_steps}) a multiple of eval.steps (now {self.eval.steps}) within max_steps"
            )
        return problems

    def _best_can_be_kept(self) -> bool:
        """Whether some step is both evaluated (every eval.steps, and the last) and checkpointed (every save_steps)."""
        if not self.eval.file or not self.save_steps:
            return False
        saves = range(self.save_steps, self.max_steps + 1, self.save_steps)
        return any(self.eval.evaluates(s, self.max_steps) for s in saves)
