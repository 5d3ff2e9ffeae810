"""Configuration dataclasses: the only place where defaults live.

A run is described by :class:`TrainConfig`, filled from a YAML file and dotted ``key=value``
command-line overrides::

    cfg = load_config("configs/tiny_cpu.yaml", ["max_steps=10", "lora.r=8", "lora=null"])

Unknown keys fail with a close-match suggestion, values are converted to the field's type, and
:meth:`TrainConfig.validate` reports every problem, one line each; a ``Literal[...]`` field's choices
come from its annotation (for the math variants, from the registries in grpo.py and
rewards/combine.py). Every field carries its help text (``_f``), from which
docs/config_reference.md is generated (glm_grpo_ds/config_docs.py). Command-line tools
(``verify-logprobs``, ``render``) take their defaults from the small dataclasses at the end.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from .grpo import ADVANTAGE_SCALE_REGISTRY, AGGREGATION_REGISTRY
from .rewards.combine import COMBINATION_REGISTRY


class ConfigError(ValueError):
    """A configuration problem; the message names the key and the fix."""


def _f(default=dataclasses.MISSING, help: str = "", *, factory=dataclasses.MISSING, **metadata):
    """A dataclass field with its help text in ``metadata["help"]`` (TRL-style), the one place it is
    written: docs/config_reference.md is generated from it (``python -m glm_grpo_ds.config_docs``).
    ``noun`` in ``metadata`` names a ``Literal`` field's values in its error (default: field name)."""
    return field(default=default, default_factory=factory, metadata={"help": help, **metadata})


# dtype names of model.dtype and decoder.dtype.
Dtype = Literal["auto", "bf16", "fp32", "fp16"]


@dataclass
class SamplingConfig:
    """How the AR policy samples visual tokens during a rollout (see glm_grpo_ds/sampling.py)."""

    temperature: float | None = _f(
        None,
        "Temperature of the policy distribution (codebook-masked) the visual tokens are drawn from; > 0. "
        "null = what the model itself samples with: its vision_language_encoder/generation_config.json, and "
        "transformers' generate() defaults for what that leaves unset (temperature 1, top_k 50, top_p 1); released "
        "GLM-Image: temperature 0.9, top_p 0.75, top_k 50 (policy.resolve_sampling). The resolved values are printed "
        "at startup and written to config.json.",
    )
    top_k: int | None = _f(
        None,
        "Draw tokens from the k most likely only (0 = off); null = the model's own (see temperature). Cuts only "
        "the drawing: every log-prob the loss uses (sampler record, teacher-forced, old, reference) is under the "
        "uncut policy distribution, never re-truncated.",
    )
    top_p: float | None = _f(
        None,
        "Draw tokens from the smallest set with probability mass >= top_p only, in (0, 1] (1.0 = off); null = the "
        "model's own (see temperature). Like top_k, cuts only the drawing, not the log-probs of the loss.",
    )

    def validate(self) -> None:
        if self.temperature is not None and not self.temperature > 0:
            raise ValueError(f"sampling.temperature must be > 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 0:
            raise ValueError(f"sampling.top_k must be >= 0 (0 = off), got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"sampling.top_p must be in (0, 1] (1 = off), got {self.top_p}")
        problems = _choice_problems(self, "sampling.")
        if problems:
            raise ValueError(problems[0])

    @property
    def resolved(self) -> bool:
        return None not in (self.temperature, self.top_k, self.top_p)


@dataclass
class DecoderConfig:
    """The frozen DiT + VAE + glyph encoder that render prior tokens to images."""

    num_inference_steps: int = _f(8, "DiT denoising steps per image (>= 1); decode time grows linearly with it.")
    guidance_scale: float = _f(1.5, "Classifier-free guidance scale of the DiT decode.")
    batch_size: int = _f(8, "Images per DiT forward (>= 1); bounds decode memory: smaller = less memory, more forwards.")
    offload: bool = _f(
        False,
        "Keep the decoder on the CPU between rollouts and move it to the accelerator only to decode: frees "
        "accelerator memory for the update, costs a transfer each step.",
    )
    dtype: Dtype = _f("auto", "Decoder weights dtype; auto = bf16 on GPU, fp32 on CPU.")
    seed: int = _f(
        0,
        "Decoder noise seed of a prompt: seed + dataset row index with fixed_seeds, else a fresh seed per "
        "(step, row) derived from it.",
    )
    fixed_seeds: bool = _f(
        False,
        "true = the same decoder noise for a prompt every step (seed + row index), as for evaluation or "
        "reference-likeness tasks; false = a fresh seed per (step, row).",
    )

    def validate(self) -> None:
        if self.num_inference_steps < 1:
            raise ValueError(f"decoder.num_inference_steps must be >= 1, got {self.num_inference_steps}")
        if self.batch_size < 1:
            raise ValueError(f"decoder.batch_size must be >= 1, got {self.batch_size}")
        problems = _choice_problems(self, "decoder.")
        if problems:
            raise ValueError(problems[0])


@dataclass
class ModelConfig:
    """The GLM-Image pipeline the AR policy is loaded from."""

    path: str = _f(
        "",
        "A GlmImagePipeline directory (required): AR in vision_language_encoder/, processor, DiT, VAE, glyph encoder.",
    )
    dtype: Dtype = _f("auto", "AR weights dtype; auto = bf16 on GPU, fp32 on CPU.")
    attn_implementation: Literal["auto", "sdpa", "eager", "flash_attention_2"] = _f(
        "auto",
        "Attention kernel of the AR; auto = flash_attention_2 if installed (GPU, bf16), else sdpa.",
        noun="attention implementation",
    )
    gradient_checkpointing: bool = _f(
        True,
        "Non-reentrant checkpointing of the AR's decoder layers (works with peft under ZeRO-3): less activation "
        "memory for a recomputed forward in the backward.",
    )
    trust_remote_code: bool = _f(
        False,
        "Let transformers run Python code shipped in the model directory; leave false for GLM-Image, which "
        "transformers implements itself.",
    )


@dataclass
class LoraConfig:
    """peft LoRA on the language model. ``lora: null`` in YAML = full fine-tuning."""

    r: int = _f(16, "LoRA rank (>= 1): more = more trainable parameters and optimizer memory.")
    alpha: int = _f(32, "LoRA scaling: the adapter's update is multiplied by alpha / r.")
    dropout: float = _f(0.0, "Dropout on the input of the LoRA adapters.")
    target_modules: list[str] = _f(
        help="Module names that get adapters (at least one): the attention and MLP projections of "
        "GlmImageTextDecoderLayer (the vision tower has other names only where it shares q/k/v; see "
        "policy.lora_target_regex, which restricts to the LM).",
        factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_up_proj", "down_proj"],
    )


@dataclass
class GRPOConfig:
    """The GRPO objective (glm_grpo_ds/grpo.py) and the rollout's sampling."""

    group_size: int = _f(
        8,
        "G completions per prompt (>= 2: advantages compare the samples of a prompt); larger = a less noisy group "
        "baseline, for G rollouts and decodes per prompt.",
    )
    beta: float = _f(0.04, "k3 KL coefficient towards the frozen reference policy (>= 0); 0 skips the reference pass.")
    epsilon_low: float = _f(0.2, "Ratio clip range below 1: [1 - epsilon_low, ...], in [0, 1).")
    epsilon_high: float = _f(
        0.2, "Ratio clip range above 1: [..., 1 + epsilon_high], >= 0; larger than epsilon_low = asymmetric clip-higher."
    )
    aggregation: Literal[tuple(AGGREGATION_REGISTRY)] = _f(
        "token_mean",
        "Loss normaliser (grpo.loss_normalizer): token_mean = number of loss tokens; seq_mean = per-sequence token "
        "mean, then mean over sequences; dr_grpo = sequences x padded length, a constant (Dr. GRPO).",
        noun="aggregation",
    )
    advantage_scale: Literal[tuple(ADVANTAGE_SCALE_REGISTRY)] = _f(
        "group",
        "group = (r - group mean) / (group std + eps); batch = (r - group mean) / (std of all rewards + eps), "
        "robust to near-constant groups (Dr. GRPO-style); none = r - group mean.",
        noun="advantage scale",
    )
    reward_combination: Literal[tuple(COMBINATION_REGISTRY)] = _f(
        "sum_then_normalize",
        "sum_then_normalize = advantages of the weighted reward sum; normalize_then_sum = weighted sum of each "
        "reward's group advantages, so an easy reward with a large spread cannot drown a hard one "
        "(see glm_grpo_ds/rewards/combine.py).",
        noun="reward combination",
    )
    num_iterations: int = _f(
        1, "Updates per rollout (mu, >= 1); > 1 stores the old (pre-update) log-probs and reuses each rollout."
    )
    preview_in_loss: bool = _f(
        True,
        "Train on the preview-grid tokens too (they condition the target grid, but the DiT renders only the target "
        "grid). false = loss on the target grid's tokens alone: less variance when the reward cannot depend on the "
        "preview (the tiny world), biased for the real model.",
    )
    logprob_chunk_size: int = _f(
        256, "Tokens per lm_head chunk (fp32 log-softmax) in the teacher-forced pass (>= 1): smaller = less peak memory."
    )
    sampling: SamplingConfig = _f(help="How the rollout samples visual tokens.", factory=SamplingConfig)


@dataclass
class OptimizerConfig:
    """The optimizer (a DeepSpeed client optimizer) and its learning-rate schedule."""

    name: Literal["adamw", "adamw_8bit", "paged_adamw_8bit"] = _f(
        "adamw_8bit",
        "adamw = torch AdamW (DeepSpeed CPU Adam with optimizer offload); adamw_8bit / paged_adamw_8bit = "
        "bitsandbytes 8-bit states, a quarter of AdamW's state memory (not with offload_optimizer).",
        noun="optimizer",
    )
    lr: float = _f(1e-5, "Peak learning rate (> 0).")
    betas: list[float] = _f(help="Adam betas (two numbers).", factory=lambda: [0.9, 0.999])
    eps: float = _f(1e-8, "Adam epsilon.")
    weight_decay: float = _f(0.0, "AdamW (decoupled) weight decay.")
    schedule: Literal["constant", "linear", "cosine"] = _f(
        "constant", "Learning rate after warmup: constant, or linear / cosine decay to 0 at the last optimizer step."
    )
    warmup_steps: int = _f(0, "Optimizer steps of linear warmup to lr (>= 0).")
    max_grad_norm: float = _f(1.0, "Gradient clipping by global norm (DeepSpeed gradient_clipping).")


@dataclass
class BatchConfig:
    """Sizes per rank and step."""

    prompts_per_rank: int = _f(1, "Prompts each rank samples per step (x G sequences), >= 1.")
    micro_batch_size: int = _f(
        4,
        "Sequences per forward/backward; must divide prompts_per_rank * G. Larger = fewer passes, more activation memory.",
    )


@dataclass
class RolloutConfig:
    """The size of the generated images."""

    height: int = _f(1024, "Image height in pixels: a positive multiple of 32 (GLM-Image tokens are 32x32 pixels).")
    width: int = _f(1024, "Image width in pixels: a positive multiple of 32.")
    gather_parameters: bool = _f(
        True,
        "ZeRO-3: gather the AR's parameters once per rollout (fast); false keeps them sharded during sampling, for "
        "models that cannot be gathered on one device (slow).",
    )


@dataclass
class RewardSpec:
    """One entry of ``rewards``."""

    name: str = _f(
        "",
        "A built-in reward name (see glm_grpo_ds/rewards), python:package.module:function or "
        "path/to/file.py:function (required).",
    )
    weight: float = _f(1.0, "Weight of this reward in the combination (see grpo.reward_combination).")
    args: dict = _f(help="Keyword arguments of the reward, e.g. {net: vgg} for lpips.", factory=dict)


@dataclass
class DataConfig:
    """The training prompts."""

    train_file: str = _f(
        "",
        ".txt (one prompt per line) or .jsonl (prompt, optional target_image relative to the file, optional text; "
        "extra keys are passed to the rewards); required.",
    )
    shuffle: bool = _f(True, "Shuffle the prompt order each epoch (seeded by seed); false = file order.")


# Experiment trackers ``logging.report_to`` may name (metrics.jsonl is always written).
TRACKERS = ("tensorboard", "wandb")


@dataclass
class LoggingConfig:
    """Rank-0 outputs besides ``metrics.jsonl`` (see glm_grpo_ds/tracking.py, gallery.py)."""

    progress_bar: bool = _f(True, "tqdm bar when stderr is a terminal, else one line every log_every steps.")
    log_every: int = _f(10, "Steps between progress lines when stderr is not a terminal (log files), >= 1.")
    plot: bool = _f(True, "Reward / KL / clip-fraction PNG at the end of training (reward_curve.png).")
    report_to: list[Literal[TRACKERS]] = _f(
        help="Experiment trackers, e.g. [tensorboard, wandb] (metrics.jsonl is always written); their packages are "
        "checked at config time: pip install 'glm-grpo-ds[tracking]'.",
        factory=list,
        noun="tracker",
    )
    wandb_project: str = _f("glm-grpo", "wandb project.")
    wandb_run_name: str | None = _f(None, "wandb run name; null = the output_dir's name.")
    wandb_mode: Literal["offline", "online"] = _f(
        "offline", "offline (no network; `wandb sync` later) or online (uploads during training)."
    )
    gallery_steps: int = _f(0, "Training gallery samples/step_N.png every N steps (0 = off).")
    gallery_max_prompts: int = _f(4, "Rows (prompts) per gallery, training and eval; >= 1.")
    gallery_thumbnail: int = _f(128, "Longest side of a gallery tile in pixels (never upscaled); >= 16.")


@dataclass
class EvalConfig:
    """Held-out evaluation (glm_grpo_ds/evaluate.py)."""

    file: str = _f("", '.txt / .jsonl prompts like data.train_file; "" = no evaluation.')
    steps: int = _f(0, "Evaluate every N training steps (0 = only before training and after the last step).")
    at_start: bool = _f(True, "Evaluate the initial policy (step 0) for comparison.")
    num_prompts: int = _f(0, "The first N prompts of the file (0 = all).")
    group_size: int = _f(4, "Samples per eval prompt, >= 1.")
    seed: int = _f(1234, "The sampler and decoder seeds of eval prompt i derive from (seed, i) only.")
    gallery: bool = _f(True, "samples/eval_step_N.png at every evaluation.")


@dataclass
class TrainConfig:
    """A training run: the sections below plus the top-level keys."""

    model: ModelConfig = _f(help="The GLM-Image pipeline the policy is loaded from.", factory=ModelConfig)
    lora: LoraConfig | None = _f(
        help="peft LoRA on the language model only (vision tower and VQ model frozen); null = full fine-tuning.",
        factory=LoraConfig,
    )
    grpo: GRPOConfig = _f(help="The GRPO objective and the rollout's sampling.", factory=GRPOConfig)
    optimizer: OptimizerConfig = _f(help="Optimizer and learning-rate schedule.", factory=OptimizerConfig)
    batch: BatchConfig = _f(help="Batch sizes per rank and step.", factory=BatchConfig)
    rollout: RolloutConfig = _f(help="Image size and parameter gathering of the rollout.", factory=RolloutConfig)
    decoder: DecoderConfig = _f(help="The frozen DiT decode of the sampled tokens.", factory=DecoderConfig)
    rewards: list[RewardSpec] = _f(
        help="The rewards, at least one: a list of {name, weight, args}, e.g. [{name: pixel_mse}].", factory=list
    )
    data: DataConfig = _f(help="The training prompts.", factory=DataConfig)
    logging: LoggingConfig = _f(help="Progress output, trackers, plots and galleries (rank 0).", factory=LoggingConfig)
    eval: EvalConfig = _f(
        help="Held-out evaluation with seeds that do not depend on the training step, rank count or seed: the same "
        "weights always get the same eval reward.",
        factory=EvalConfig,
    )
    output_dir: str = _f("outputs/run", "Where the run writes metrics, checkpoints, galleries and config.json.")
    max_steps: int = _f(100, "Training steps (one rollout and grpo.num_iterations updates each), >= 1.")
    seed: int = _f(
        42,
        "Base seed of the run's random streams (sampling, data order; glm_grpo_ds/seeding.py); the decoder noise "
        "and the evaluation have seeds of their own (decoder.seed, eval.seed).",
    )
    save_steps: int = _f(0, "Checkpoint every N steps (0 = never); see glm_grpo_ds/checkpoint.py.")
    save_total_limit: int = _f(0, "Keep the newest K checkpoints (0 = keep all).")
    resume_from: str | None = _f(
        None, '"latest" (newest complete checkpoint of output_dir) or a checkpoint path; null = start fresh.'
    )
    max_consecutive_skips: int = _f(
        3,
        "Stop (checkpoint + exit code 3) after this many steps in a row whose optimizer update was skipped for a "
        "non-finite loss/gradient; 0 = never stop.",
    )
    force_collectives: bool = _f(
        False,
        "Run every collective even at world size 1 (normally skipped): one GPU with NCCL then checks the multi-GPU "
        "communication path (device placement of every collective) - see glm_grpo_ds/dist.py.",
    )

    @property
    def sequences_per_rank(self) -> int:
        return self.batch.prompts_per_rank * self.grpo.group_size

    def validate(self) -> None:
        """Raise ConfigError listing every problem, one line each."""
        problems: list[str] = []

        def need(ok: bool, msg: str) -> None:
            if not ok:
                problems.append(msg)

        need(bool(self.model.path), "model.path is required: a GlmImagePipeline directory")
        problems.extend(_choice_problems(self))  # every Literal[...] field, choices from its annotation
        need(bool(self.data.train_file), "data.train_file is required: a .txt or .jsonl prompt file")
        need(self.max_steps >= 1, f"max_steps must be >= 1, got {self.max_steps}")
        need(self.save_steps >= 0, f"save_steps must be >= 0 (0 = no checkpoints), got {self.save_steps}")
        need(self.max_consecutive_skips >= 0, f"max_consecutive_skips must be >= 0 (0 = never stop), got {self.max_consecutive_skips}")
        need(self.save_total_limit >= 0, f"save_total_limit must be >= 0 (0 = keep all), got {self.save_total_limit}")
        g = self.grpo
        need(g.group_size >= 2, f"grpo.group_size must be >= 2 (advantages compare samples of a prompt), got {g.group_size}")
        need(g.beta >= 0, f"grpo.beta must be >= 0, got {g.beta}")
        need(0 <= g.epsilon_low < 1, f"grpo.epsilon_low must be in [0, 1), got {g.epsilon_low}")
        need(g.epsilon_high >= 0, f"grpo.epsilon_high must be >= 0, got {g.epsilon_high}")
        need(g.num_iterations >= 1, f"grpo.num_iterations must be >= 1, got {g.num_iterations}")
        need(g.logprob_chunk_size >= 1, f"grpo.logprob_chunk_size must be >= 1, got {g.logprob_chunk_size}")
        try:
            g.sampling.validate()
        except ValueError as err:
            problems.append(f"grpo.{err}")
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
            need(v > 0 and v % 32 == 0, f"{key}={v} must be a positive multiple of 32 (GLM-Image tokens are 32x32 pixels)")
        try:
            self.decoder.validate()
        except ValueError as err:
            problems.append(str(err))
        need(len(self.rewards) > 0, "rewards: at least one reward is required, e.g. rewards: [{name: pixel_mse}]")
        for i, r in enumerate(self.rewards):
            need(bool(r.name), f"rewards[{i}].name is required")
        self._validate_logging(need)
        if self.lora is not None:
            need(self.lora.r >= 1, f"lora.r must be >= 1, got {self.lora.r}")
            need(len(self.lora.target_modules) > 0, "lora.target_modules must name at least one module")
        if problems:
            raise ConfigError("\n".join(problems))


    def _validate_logging(self, need) -> None:
        lg, ev = self.logging, self.eval
        # Checked here, on every rank, so a missing package stops all ranks before training
        # instead of failing on rank 0 only while the others wait in a collective.
        import importlib.util

        for name in set(lg.report_to) & set(TRACKERS):
            need(
                importlib.util.find_spec(name) is not None,
                f"logging.report_to names {name} but the {name} package is not installed: pip install 'glm-grpo-ds[tracking]'",
            )
        need(lg.log_every >= 1, f"logging.log_every must be >= 1, got {lg.log_every}")
        need(lg.gallery_steps >= 0, f"logging.gallery_steps must be >= 0 (0 = off), got {lg.gallery_steps}")
        need(lg.gallery_max_prompts >= 1, f"logging.gallery_max_prompts must be >= 1, got {lg.gallery_max_prompts}")
        need(lg.gallery_thumbnail >= 16, f"logging.gallery_thumbnail must be >= 16 pixels, got {lg.gallery_thumbnail}")
        need(ev.steps >= 0, f"eval.steps must be >= 0 (0 = before training and at the end only), got {ev.steps}")
        need(ev.num_prompts >= 0, f"eval.num_prompts must be >= 0 (0 = all), got {ev.num_prompts}")
        need(ev.group_size >= 1, f"eval.group_size must be >= 1, got {ev.group_size}")


@dataclass
class VerifyConfig:
    """``glm-grpo verify-logprobs``: sampler vs teacher-forced log-prob parity check."""

    height: int = 64
    width: int = 96
    group_size: int = 3
    num_prompts: int = 2
    dtype: str = "fp32"
    attn: str = "sdpa"
    tolerance: float | None = None  # None = per-dtype default below
    seed: int = 0
    device: str = "auto"  # auto = cuda if available, else cpu

    # Max |sampler - teacher-forced| log-prob accepted by default. fp32 agrees to ~1e-6 on the
    # tiny model; bf16 differs because the KV-cached decode and the full forward round differently.
    DEFAULT_TOLERANCE = {"fp32": 1e-4, "bf16": 5e-2, "fp16": 1e-2}

    def resolved_tolerance(self) -> float:
        return self.tolerance if self.tolerance is not None else self.DEFAULT_TOLERANCE[self.dtype]


@dataclass
class MergeConfig:
    """``glm-grpo merge``: LoRA adapter -> merged GlmImagePipeline."""

    dtype: str = "fp32"  # dtype of the merged AR weights: fp32 | bf16


@dataclass
class RenderConfig:
    """``glm-grpo render``: prompts -> PNG through a GLM-Image pipeline."""

    height: int = 64
    width: int = 64
    num_inference_steps: int = 8
    guidance_scale: float = 1.5
    seed: int = 0
    out: str = "outputs/render"


@dataclass
class EstimateConfig:
    """``glm-grpo estimate-memory``: the per-GPU memory plan (see glm_grpo_ds/memory_plan.py)."""

    num_gpus: int = 8  # GPUs per node
    num_nodes: int = 1
    gpu_memory_gb: float = 80.0  # GiB per GPU to plan against
    prompt_tokens: int = 128  # longest prompt in tokens (chat template included); sizes the KV cache
    device: str = "cuda"  # cuda: model.dtype auto = bf16; cpu: auto = fp32 (to compare with CPU runs)


@dataclass
class BenchConfig:
    """``glm-grpo bench``: phase throughputs and side-by-side ratios (see glm_grpo_ds/bench.py)."""

    size: int = 256  # image height = width
    group_size: int = 16
    steps: int = 3  # timed training steps after one warm-up step
    repeats: int = 3  # repeats of each side-by-side comparison (median reported)
    out: str = "outputs/bench"


# ----------------------------------------------------------------------------- loading
def _unknown(key: str, known: typing.Iterable[str], where: str) -> ConfigError:
    close = difflib.get_close_matches(key, list(known), n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(repr(where + c) for c in close)}?" if close else f"known keys under it: {', '.join(sorted(known))}"
    return ConfigError(f"unknown config key {where + key!r}; {hint}")


def _choices(tp) -> tuple | None:
    """The values a ``Literal[...]`` annotation (or ``Literal[...] | None``) allows, else None."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        tp = args[0] if len(args) == 1 else tp
    return typing.get_args(tp) if typing.get_origin(tp) is typing.Literal else None


def _choice_error(value, choices: tuple, where: str, noun: str) -> str:
    """One line: the key, the bad value, a close match if any, the valid values."""
    known = [str(c) for c in choices]
    close = difflib.get_close_matches(str(value), known, n=1, cutoff=0.5)
    hint = f"did you mean {', '.join(repr(c) for c in close)}? known: " if close else "known: "
    return f"{where}: unknown {noun} {value!r}; {hint}{', '.join(known)}"


def _choice_problems(obj, prefix: str = "") -> list[str]:
    """One line per value of dataclass ``obj`` (nested sections and list items included) that its
    ``Literal[...]`` annotation does not allow. A nested section with a ``validate()`` of its own
    (decoder, grpo.sampling) is left to it."""
    problems: list[str] = []
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value, tp = getattr(obj, f.name), hints[f.name]
        if isinstance(value, list):
            tp = (typing.get_args(tp) or (typing.Any,))[0]
            items = [(f"{prefix}{f.name}[{i}]", v) for i, v in enumerate(value)]
        else:
            items = [(prefix + f.name, value)]
        choices = _choices(tp)
        for where, v in items:
            if dataclasses.is_dataclass(v):
                if not hasattr(v, "validate"):
                    problems += _choice_problems(v, where + ".")
            elif choices is not None and v is not None and v not in choices:
                problems.append(_choice_error(v, choices, where, f.metadata.get("noun", f.name.replace("_", " "))))
    return problems


def _dataclass_type(tp):
    """The dataclass inside ``tp`` (``X``, ``X | None``) or None."""
    if dataclasses.is_dataclass(tp):
        return tp
    if typing.get_origin(tp) not in (typing.Union, types.UnionType):
        return None
    for arg in typing.get_args(tp):
        if dataclasses.is_dataclass(arg):
            return arg
    return None


def _convert(value, tp, where: str):
    """Coerce a YAML/JSON value to the annotated type ``tp``."""
    optional = type(None) in typing.get_args(tp) and (typing.get_origin(tp) in (typing.Union, types.UnionType))
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{where} cannot be null")
    dc = _dataclass_type(tp)
    if dc is not None:
        if isinstance(value, dc):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a mapping of {dc.__name__} fields, got {value!r}")
        return _from_dict(dc, value, where + ".")
    base = [a for a in typing.get_args(tp) if a is not type(None)][0] if optional else tp
    origin = typing.get_origin(base)
    if origin is typing.Literal:
        # converted like its values (str); validate() checks the choice, with every other problem
        base, origin = type(typing.get_args(base)[0]), None
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where} must be a list, got {value!r}")
        (item,) = typing.get_args(base) or (typing.Any,)
        return [_convert(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if base is dict or origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a mapping, got {value!r}")
        return dict(value)
    if base is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
        raise ConfigError(f"{where} must be true or false, got {value!r}")
    if base in (int, float):
        if isinstance(value, bool):
            raise ConfigError(f"{where} must be a number, got {value!r}")
        try:
            number = float(value) if base is float else int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where} must be a{'n integer' if base is int else ' number'}, got {value!r}") from None
        if base is int and isinstance(value, float) and value != int(value):
            raise ConfigError(f"{where} must be an integer, got {value!r}")
        return number
    if base is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{where} must be a string, got {value!r}")
        return str(value)
    return value


def _from_dict(cls, data: dict, prefix: str = ""):
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        if key not in names:
            raise _unknown(key, names, prefix)
        kwargs[key] = _convert(value, hints[key], prefix + key)
    return cls(**kwargs)


def _parse_scalar(text: str):
    """A command-line value: YAML syntax (numbers, true/false, null, [lists], {maps})."""
    import yaml

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str):
        # PyYAML reads 1e-4 as a string (YAML 1.1); accept it as a number.
        try:
            return float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            return value
    return value


def apply_override(tree: dict, dotted: str, value, defaults: TrainConfig) -> None:
    """Set ``tree[a][b][c] = value`` for ``a.b.c``, checking every key against the dataclasses."""
    keys = dotted.split(".")
    cls, node = TrainConfig, tree
    for depth, key in enumerate(keys):
        names = {f.name for f in dataclasses.fields(cls)} if cls else set()
        where = ".".join(keys[:depth])
        if cls is not None and key not in names:
            raise _unknown(key, names, where + "." if where else "")
        if depth == len(keys) - 1:
            node[key] = value
            return
        tp = typing.get_type_hints(cls)[key] if cls else None
        sub = _dataclass_type(tp) if tp is not None else None
        if not isinstance(node.get(key), dict):
            if sub is None:
                node[key] = {}  # free-form mapping (e.g. rewards args)
            else:
                # start from the current value so sibling fields keep theirs (lora was null -> defaults)
                current = node.get(key)
                node[key] = {} if current is None else dict(current) if isinstance(current, dict) else {}
        cls, node = sub, node[key]


def load_config(path: str | None, overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """YAML file (optional) + ``key=value`` overrides -> validated TrainConfig."""
    import yaml

    tree: dict = {}
    if path:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {path} does not exist")
        try:
            loaded = yaml.safe_load(p.read_text(encoding="utf-8"))
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise ConfigError(f"config file {path}{where} is not valid YAML: {getattr(err, 'problem', err)}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping of config keys")
        tree = loaded or {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key=value (e.g. grpo.beta=0.0)")
        key, text = item.split("=", 1)
        apply_override(tree, key.strip(), _parse_scalar(text), TrainConfig())
    cfg = _from_dict(TrainConfig, tree)
    cfg.validate()
    return cfg


def to_dict(cfg) -> dict:
    """Plain dict (for saving the config a run used next to its outputs)."""
    return json.loads(json.dumps(dataclasses.asdict(cfg)))
