"""The sections of a training config (``model``, ``lora``, ``grpo``, ``optimizer``, ...): every default and
every help text lives here, once; docs/config_reference.md is generated from them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..advantages import COMBINATIONS, ESTIMATORS
from ..grpo import AGGREGATIONS, IMPORTANCE_LEVELS, SAMPLER_CORRECTIONS
from ..monitoring.alarms import RuleError, parse_rules
from ..monitoring.image_stats import NEEDS_DISTANCE, STATISTICS
from .fields import Dtype, choice_problems, setting


def raise_problems(problems: list[str]) -> None:
    """The one way a config section reports problems: ValueError with one line per problem (TrainConfig.validate
    raises its ConfigError, a ValueError, the same way for the whole config)."""
    if problems:
        raise ValueError("\n".join(problems))


def guided_steps(num_inference_steps: int, guidance_scale: float, guidance_steps: int | None) -> int:
    """The DiT steps of a decode that run the unconditional pass too: none at guidance <= 1, else the first
    ``guidance_steps`` (None: all). A decode runs steps + guided steps DiT forwards per image."""
    if guidance_scale <= 1:
        return 0
    return num_inference_steps if guidance_steps is None else guidance_steps


def decode_problems(
    num_inference_steps: int | None, guidance_scale: float | None, prefix: str, guidance_steps: int | None = None
) -> list[str]:
    """The problems of a decode's settings (decoder.*, eval.*; None = the pipeline's own, fine)."""
    problems = []
    if num_inference_steps is not None and num_inference_steps < 1:
        problems.append(f"{prefix}num_inference_steps must be >= 1, got {num_inference_steps}")
    if guidance_scale is not None and not guidance_scale > 0:
        problems.append(f"{prefix}guidance_scale must be > 0 (<= 1: no guidance pass), got {guidance_scale}")
    if guidance_steps is not None:
        steps = num_inference_steps
        if guidance_steps < 1 or (steps is not None and guidance_steps > steps):
            problems.append(
                f"{prefix}guidance_steps must be between 1 and num_inference_steps ({steps}), got {guidance_steps} "
                "(null = guidance on every step; guidance_scale 1 = on none)"
            )
        elif guidance_scale is not None and guidance_scale <= 1:
            problems.append(
                f"{prefix}guidance_steps={guidance_steps} limits a guidance that guidance_scale={guidance_scale:g} "
                "turns off: set guidance_scale > 1 or drop guidance_steps"
            )
    return problems


@dataclass
class SamplingConfig:
    """How the AR policy samples visual tokens during a rollout (see glm_grpo_ds/sampling.py)."""

    temperature: float | None = setting(
        None,
        "Temperature of the policy distribution (codebook-masked) the visual tokens are drawn from; > 0. "
        "null = what the model itself samples with: its vision_language_encoder/generation_config.json, and "
        "transformers' generate() defaults for what that leaves unset (temperature 1, top_k 50, top_p 1); released "
        "GLM-Image: temperature 0.9, top_p 0.75, top_k 50 (glm_image.resolve_sampling). The resolved values are "
        "printed at startup and written to config.json.",
    )
    top_k: int | None = setting(
        None,
        "Draw tokens from the k most likely only (0 = off); null = the model's own (see temperature). Cuts only "
        "the drawing: every log-prob the loss uses (sampler record, teacher-forced, old, reference) is under the "
        "uncut policy distribution, never re-truncated.",
    )
    top_p: float | None = setting(
        None,
        "Draw tokens from the smallest set with probability mass >= top_p only, in (0, 1] (1.0 = off); null = the "
        "model's own (see temperature). Like top_k, cuts only the drawing, not the log-probs of the loss.",
    )

    def problems(self, prefix: str = "sampling.") -> list[str]:
        """One line per problem, keys written ``<prefix>key`` (TrainConfig.validate passes ``grpo.sampling.``)."""
        problems = []
        if self.temperature is not None and not self.temperature > 0:
            problems.append(f"{prefix}temperature must be > 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 0:
            problems.append(f"{prefix}top_k must be >= 0 (0 = off), got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            problems.append(f"{prefix}top_p must be in (0, 1] (1 = off), got {self.top_p}")
        return problems + choice_problems(self, prefix)

    def validate(self) -> None:
        """For the tools that take sampling settings alone: ValueError listing every problem, one line each."""
        raise_problems(self.problems())

    @property
    def resolved(self) -> bool:
        return None not in (self.temperature, self.top_k, self.top_p)


@dataclass
class DecoderConfig:
    """The frozen DiT + VAE + glyph encoder that render prior tokens to images."""

    num_inference_steps: int = setting(
        8,
        "DiT denoising steps of the decode that feeds the training rewards (>= 1); its time grows linearly with "
        "them. Evaluation decodes with eval.num_inference_steps. `glm-grpo decode-agreement` shows whether fewer "
        "steps still rank a group's samples like the full decode.",
    )
    guidance_scale: float = setting(
        1.5,
        "Classifier-free guidance of the training decode (> 0); <= 1 skips the DiT's unconditional pass (about "
        "half the decode time). Evaluation uses eval.guidance_scale.",
    )
    guidance_steps: int | None = setting(
        None,
        "Guide only the first N of the num_inference_steps (1..num_inference_steps; null = every step): the later "
        "steps skip the DiT's unconditional pass, so the decode runs steps + N forwards instead of 2 x steps. "
        "Changes the images: check with `glm-grpo decode-agreement --candidate STEPS:GUIDANCE:N` that it still "
        "ranks a group's samples like the evaluation decode.",
    )
    batch_size: int = setting(
        8, "Images per DiT forward (>= 1); bounds decode memory: smaller = less memory, more forwards."
    )
    compile: bool = setting(
        False,
        "Compile the DiT's transformer blocks with torch.compile (regional: one graph for the block type that "
        "every layer shares, diffusers' compile_repeated_blocks): the same images to float rounding, fewer "
        "kernels per block. Costs a compile at the first decode and one more when the glyph text's length first "
        "changes (~1 min each on a CPU, cached on disk across runs). Needs a C++ compiler on a CPU. Off until "
        "measured on a GPU.",
    )
    stream_rewards: bool = setting(
        False,
        "Score each DiT batch's images on a background thread while the next batch decodes, instead of scoring "
        "all images after the decode: a slow reward (remote server, OCR) then waits behind the decode. Same "
        "rewards; time/reward becomes the wait after the last batch.",
    )
    offload: bool = setting(
        False,
        "Keep the decoder on the CPU between rollouts and move it to the accelerator only to decode: frees "
        "accelerator memory for the update, costs a transfer each step.",
    )
    dtype: Dtype = setting("auto", "Decoder weights dtype; auto = bf16 on GPU, fp32 on CPU.")
    seed: int = setting(
        0,
        "Decoder noise seed of a prompt: seed + dataset row index with fixed_seeds, else a fresh seed per "
        "(step, row) derived from it.",
    )
    fixed_seeds: bool = setting(
        False,
        "true = the same decoder noise for a prompt every step (seed + row index), as for evaluation or "
        "reference-likeness tasks; false = a fresh seed per (step, row).",
    )

    def problems(self, prefix: str = "decoder.") -> list[str]:
        """One line per problem, keys written ``<prefix>key``."""
        problems = []
        problems += decode_problems(self.num_inference_steps, self.guidance_scale, prefix, self.guidance_steps)
        if self.batch_size < 1:
            problems.append(f"{prefix}batch_size must be >= 1, got {self.batch_size}")
        return problems + choice_problems(self, prefix)

    def validate(self) -> None:
        """For the decoder used alone (render, tests): ValueError listing every problem, one line each."""
        raise_problems(self.problems())


@dataclass
class ModelConfig:
    """The GLM-Image pipeline the AR policy is loaded from."""

    path: str = setting(
        "",
        "The GlmImagePipeline (required): a local directory (AR in vision_language_encoder/, processor, DiT, VAE, "
        "glyph encoder), used as is, or a Hugging Face Hub id such as zai-org/GLM-Image, downloaded once into the "
        "Hugging Face cache (HF_HOME / HF_HUB_CACHE; rank 0 downloads, the other ranks wait) and read from it after; "
        "with HF_HUB_OFFLINE=1 the cache only (glm_grpo_ds/model/source.py).",
    )
    revision: str | None = setting(
        None,
        "Hub revision of a model.path Hub id: a commit sha, branch or tag; null = main. The commit used is "
        "recorded in config.json (model_source) and in the adapter's adapter_config.json. Not allowed with a "
        "local directory.",
    )
    dtype: Dtype = setting("auto", "AR weights dtype; auto = bf16 on GPU, fp32 on CPU.")
    attn_implementation: Literal["auto", "sdpa", "eager", "flash_attention_2"] = setting(
        "auto",
        "Attention kernel of the AR; auto = flash_attention_2 if it imports (GPU, bf16/fp16), else sdpa (an installed "
        "but broken flash-attn warns once).",
        noun="attention implementation",
    )
    gradient_checkpointing: bool = setting(
        True,
        "Non-reentrant checkpointing of the AR's decoder layers (works with peft under ZeRO-3): less activation "
        "memory for a recomputed forward in the backward.",
    )
    trust_remote_code: bool = setting(
        False,
        "Let transformers run Python code shipped in the model directory; leave false for GLM-Image, which "
        "transformers implements itself.",
    )


@dataclass
class LoraConfig:
    """peft LoRA on the language model. ``lora: null`` in YAML = full fine-tuning."""

    r: int = setting(16, "LoRA rank (>= 1): more = more trainable parameters and optimizer memory.")
    alpha: int = setting(32, "LoRA scaling: the adapter's update is multiplied by alpha / r.")
    dropout: float = setting(0.0, "Dropout on the input of the LoRA adapters.")
    target_modules: list[str] = setting(
        help="Module names that get adapters (at least one): the attention and MLP projections of "
        "GlmImageTextDecoderLayer (the vision tower has other names only where it shares q/k/v; see "
        "adapters.lora_target_regex, which restricts to the LM).",
        factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_up_proj", "down_proj"],
    )
    init_from: str | None = setting(
        None,
        "Start from this peft LoRA adapter instead of a fresh one: an adapter directory or one holding it (a "
        "run's final_adapter/, a checkpoint's adapter/). Its r, alpha and target modules must equal this "
        "section's (else one line names the key to set); the KL reference stays the base model. A resumed run "
        "takes its checkpoint's weights instead.",
    )


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
    epsilon_low: float = setting(0.2, "Ratio clip range below 1: [1 - epsilon_low, ...], in [0, 1).")
    epsilon_high: float = setting(
        0.2,
        "Ratio clip range above 1: [..., 1 + epsilon_high], >= 0; larger than epsilon_low = asymmetric clip-higher.",
    )
    aggregation: Literal[tuple(AGGREGATIONS)] = setting(
        "token_mean",
        "Loss normaliser (grpo.loss_normalizer): token_mean = number of loss tokens; seq_mean = per-sequence token "
        "mean, then mean over sequences; dr_grpo = sequences x padded length, a constant (Dr. GRPO).",
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
        "all tokens.",
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
        "entropy_coef); a guard against entropy collapse, off at 0. The `entropy` metric shows what it acts on.",
    )
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
    mismatch_threshold: float = setting(
        0.1,
        "The `mismatch/frac_beyond` metric counts tokens whose sampler and trainer log-probs differ by more than this.",
    )
    logprob_chunk_size: int = setting(
        256,
        "Tokens per lm_head chunk (fp32 log-softmax) in the teacher-forced pass (>= 1): smaller = less peak memory.",
    )
    sampling: SamplingConfig = setting(help="How the rollout samples visual tokens.", factory=SamplingConfig)


@dataclass
class OptimizerConfig:
    """The optimizer (a DeepSpeed client optimizer) and its learning-rate schedule."""

    name: Literal["adamw", "adamw_8bit", "paged_adamw_8bit"] = setting(
        "adamw_8bit",
        "adamw = torch AdamW (DeepSpeed CPU Adam with optimizer offload); adamw_8bit / paged_adamw_8bit = "
        "bitsandbytes 8-bit states, a quarter of AdamW's state memory (not with offload_optimizer).",
        noun="optimizer",
    )
    lr: float = setting(1e-5, "Peak learning rate (> 0).")
    betas: list[float] = setting(help="Adam betas (two numbers).", factory=lambda: [0.9, 0.999])
    eps: float = setting(1e-8, "Adam epsilon.")
    weight_decay: float = setting(0.0, "AdamW (decoupled) weight decay.")
    schedule: Literal["constant", "linear", "cosine"] = setting(
        "constant", "Learning rate after warmup: constant, or linear / cosine decay to 0 at the last optimizer step."
    )
    warmup_steps: int = setting(0, "Optimizer steps of linear warmup to lr (>= 0).")
    max_grad_norm: float = setting(1.0, "Gradient clipping by global norm (DeepSpeed gradient_clipping).")


@dataclass
class BatchConfig:
    """Sizes per rank and step."""

    prompts_per_rank: int = setting(1, "Prompts each rank samples per step (x G sequences), >= 1.")
    micro_batch_size: int = setting(
        4,
        "Sequences per forward/backward; must divide prompts_per_rank * G. Larger = fewer passes, more activation "
        "memory.",
    )


@dataclass
class RolloutConfig:
    """The size of the generated images."""

    height: int = setting(
        1024, "Image height in pixels: a positive multiple of 32 (GLM-Image tokens are 32x32 pixels)."
    )
    width: int = setting(1024, "Image width in pixels: a positive multiple of 32.")
    gather_parameters: bool = setting(
        True,
        "ZeRO-3: gather the AR's parameters once per rollout (fast); false keeps them sharded during sampling, for "
        "models that cannot be gathered on one device (slow).",
    )
    compile: bool = setting(
        False,
        "Run the rollout's decode step through torch.compile (glm_grpo_ds/rollout/decode_loop.py): 2.1-2.3x the "
        "tokens/s of the eager loop on the tiny model (CPU), the same tokens and log-probs; costs a compile per "
        "(rows, cache length), ~15-25 s on a CPU, cached on disk across runs. Needs a C++ compiler on a CPU; under "
        "ZeRO-3 needs gather_parameters: true. Off until measured on a GPU.",
    )
    compile_scope: Literal["step", "layers"] = setting(
        "step",
        "With compile: step = the whole decode step as one graph (the fastest on a CPU, where Python overhead "
        "dominates; compiles all layers: minutes at 40 layers); layers = each decoder layer's norms and MLP, one "
        "graph per module type shared by every layer (cold start in seconds; the rest eager, which a cuda_graph "
        "capture makes launch-free anyway).",
    )
    cuda_graph: bool = setting(
        False,
        "Capture one decode step as a CUDA graph after a few warm-up steps and replay it per token "
        "(glm_grpo_ds/rollout/step_graph.py): removes the per-kernel launch cost that bounds the eager step on a "
        "GPU; the same tokens and log-probs as the eager loop. Captured once per rollout (a few steps' cost). "
        "On a CPU the same static-buffer loop runs uncaptured. Under ZeRO-3 needs gather_parameters: true.",
    )
    merge_lora: bool = setting(
        False,
        "LoRA: sample with the adapters merged into the base weights (W + scale * B @ A) and peft's wrappers out of "
        "the call path, so a decode step runs the plain model's kernels (glm_grpo_ds/rollout/merged_lora.py). The "
        "base weights are restored bitwise after each rollout from a copy made once per run (see merge_copy); "
        "the trainer's log-probs stay unmerged (first-iteration ratio exactly 1), so the sampler draws from "
        "weights rounded once more (mismatch/* shows it; grpo.sampler_correction corrects it). Measured (issue #51): "
        "safe where the adapter's delta is large against bf16's spacing of W (the tiny world, whose delta grows to "
        "11-69 % of W, learned within noise of the exact sampler over 5 seeds at lr 3e-3 and 3e-4), not at the "
        "real widths and the GPU configs' lr 1e-5, where the merge keeps 4 % of the delta after 1 step and 28 % "
        "after 40 (benchmarks/merge_drift.py): sample with "
        "fuse_lora there. Under ZeRO-3 needs gather_parameters: true.",
    )
    fuse_lora: bool = setting(
        False,
        "LoRA: in the decode step, each layer's adapted projections run one fused low-rank path instead of peft's "
        "wrappers (glm_grpo_ds/rollout/fused_lora.py): one shrink GEMM for the concatenated A's of the "
        "projections that share an input (q/k/v), one expand GEMM with the scale folded in, the delta added in "
        "fp32 and rounded once, as peft does. The adapter stays unmerged, so the sampler samples the trainer's "
        "policy (tokens equal the peft loop's in fp32); fewer kernels per step, which a cuda_graph replay and "
        "compile make the speed-up. Excludes merge_lora. Under ZeRO-3 needs gather_parameters: true.",
    )
    merge_copy: Literal["auto", "device", "host"] = setting(
        "auto",
        "merge_lora: where the copy of the adapted base weights lives (~16 GB at GLM-Image's size with every "
        "projection adapted): device (fastest restore), host (pinned CPU memory, restored over PCIe, ~0.7 s a "
        "rollout), auto = device when the memory plan plus the copy fits the GPU, else host. Not kept under "
        "ZeRO-3 on several ranks, where the rollout's gathered weights are discarded anyway.",
    )
    adapters_in_model_dtype: bool = setting(
        False,
        "LoRA: sample with the adapters cast to the model dtype (bf16) for the rollout; the trainer's passes keep "
        "peft's fp32 adapters, restored bitwise after each rollout (glm_grpo_ds/model/adapters.py "
        "adapters_in_base_dtype). Saves each adapted linear's fp32 casts and matmuls per token; the sampler then "
        "draws from adapters rounded to bf16 (the mismatch/* metrics show it; grpo.sampler_correction corrects "
        "it). No effect in fp32, under ZeRO-1/2 (DeepSpeed casts the adapters itself) or with "
        "gather_parameters: false.",
    )


@dataclass
class RewardSpec:
    """One entry of ``rewards``."""

    name: str = setting(
        "",
        "A built-in reward name (see glm_grpo_ds/rewards), python:package.module:function or "
        "path/to/file.py:function (required).",
    )
    weight: float = setting(1.0, "Weight of this reward in the combination (see grpo.reward_combination).")
    args: dict = setting(help="Keyword arguments of the reward, e.g. {net: vgg} for lpips.", factory=dict)


@dataclass
class DataConfig:
    """The training prompts."""

    train_file: str = setting(
        "",
        "The prompts (required): a .txt (one per line), .jsonl, .parquet, .csv or .json file, a directory written by "
        "datasets' save_to_disk (or of data files), or a Hugging Face Hub dataset id (org/name, through the HF "
        "cache; offline-aware). Columns / JSON keys: see prompt_key, target_image_key, text_key; the others are "
        "passed to the rewards. Paths in target_image are relative to the file (or the dataset directory).",
    )
    shuffle: bool = setting(True, "Shuffle the prompt order each epoch (seeded by seed); false = file order.")
    prompt_key: str = setting("prompt", "The column (JSON key) holding the prompt; every row needs a non-empty one.")
    target_image_key: str = setting(
        "target_image",
        "The optional column (JSON key) of target images for likeness rewards: image paths, or a datasets.Image "
        "column (images stored in the dataset). A name other than the default must be a column.",
    )
    text_key: str = setting(
        "text", "The optional column (JSON key) of the text to render (ocr reward); a non-default name must exist."
    )
    split: str = setting(
        "train", "The split to train on when train_file is a dataset with several (a DatasetDict, a Hub dataset)."
    )
    revision: str | None = setting(
        None, "Hub datasets only: the branch, tag or commit of train_file to use (null = main); pin a commit."
    )
    dead_prompt_skip_prob: float = setting(
        0.0,
        "In [0, 1). A dead prompt is one whose last group had no reward variance (every reward equal across its "
        "samples: all advantages 0, nothing learnt). When its turn comes again it is skipped with this "
        "probability, drawn per (epoch, prompt) alike on every rank, and the next prompt is taken, so no rollout "
        "or decode goes to it (GRESO-style selective rollouts); on average it is retried after p / (1 - p) of "
        "its turns, and a step never skips more prompts than the set holds. 0 = off. frac_reward_zero_std and "
        "prompts_skipped in metrics.jsonl show the effect.",
    )

    def problems(self, prefix: str = "data.") -> list[str]:
        """One line per problem, keys written ``<prefix>key``."""
        p = self.dead_prompt_skip_prob
        if not 0 <= p < 1:
            return [f"{prefix}dead_prompt_skip_prob must be in [0, 1) (1 would never retry a prompt), got {p}"]
        return []


# Experiment trackers ``logging.report_to`` may name: accelerate's tracker classes
# (accelerate.tracking.LOGGER_TYPE_TO_CLASS) under their TRL / transformers ``report_to`` names (aim is
# accelerate's only); each name is also the module its package installs.
TRACKERS = ("tensorboard", "wandb", "mlflow", "trackio", "comet_ml", "clearml", "dvclive", "swanlab", "aim")
# report_to also takes "all" (every tracker whose package is installed) and "none", as transformers does.
REPORT_TO = (*TRACKERS, "all", "none")
# What a missing tracker package is installed with (tensorboard and wandb: the project's `tracking` extra).
TRACKER_PIP = {name: name for name in TRACKERS} | {
    "tensorboard": "'glm-grpo-ds[tracking]'",
    "wandb": "'glm-grpo-ds[tracking]'",
    "comet_ml": "comet-ml",
}


def tracker_installed(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


@dataclass
class LoggingConfig:
    """Rank-0 outputs besides ``metrics.jsonl`` (see glm_grpo_ds/observability/tracking.py, gallery.py)."""

    progress_bar: bool = setting(
        True,
        "tqdm bar when stderr is a terminal, else one line every log_every steps; with it the running step's status "
        "(status_interval_s). false = neither.",
    )
    log_every: int = setting(10, "Steps between progress lines when stderr is not a terminal (log files), >= 1.")
    status_interval_s: float = setting(
        30.0,
        "While a step (or the load, or an evaluation) runs, where it is: its phase and count (rollout tokens, "
        "decoded images, rewards done, update micro-batches; the load's stage). On a terminal in the bar, in place; "
        "else a line at most every this many seconds (the first one this long after the start; 0 = at every "
        "change), >= 0. With progress_bar, on rank 0.",
    )
    plot: bool = setting(True, "Reward / KL / clip-fraction PNG at the end of training (reward_curve.png).")
    report_to: list[Literal[REPORT_TO]] = setting(
        help="Experiment trackers (accelerate's tracker classes) by their TRL / transformers report_to names, e.g. "
        "[tensorboard, wandb]; all = every one whose package is installed; none or [] = none; one name may stand "
        "without brackets. metrics.jsonl is always written. A named tracker's package is checked at config time "
        "(tensorboard, wandb: pip install 'glm-grpo-ds[tracking]').",
        factory=list,
        noun="tracker",
    )
    project: str = setting(
        "glm-grpo",
        "Project the run is filed under: wandb / trackio / comet_ml / clearml / swanlab project, mlflow and aim "
        "experiment.",
    )
    run_name: str | None = setting(
        None,
        "The run's name in every tracker (the tensorboard/ subdirectory, the wandb / mlflow / ... run); null = the "
        "output_dir's name.",
    )
    wandb_mode: Literal["offline", "online"] = setting(
        "offline", "offline (no network; `wandb sync` later) or online (uploads during training)."
    )
    tracker_kwargs: dict = setting(
        help="Keyword arguments per tracker for its accelerate tracker class (which passes most on to wandb.init, "
        "SummaryWriter, mlflow, ...), over the run's own, e.g. {wandb: {entity: my-team, tags: [grpo]}}.",
        factory=dict,
    )
    gallery_steps: int = setting(0, "Training gallery samples/step_N.png every N steps (0 = off).")
    gallery_max_prompts: int = setting(4, "Rows (prompts) per gallery, training and eval; >= 1.")
    gallery_thumbnail: int = setting(128, "Longest side of a gallery tile in pixels (never upscaled); >= 16.")

    def trackers(self) -> list[str]:
        """The trackers ``report_to`` selects, in its order: ``all`` = every one whose package is
        installed (as transformers' ``report_to="all"``), ``none`` = none; unknown names are left to
        validation."""
        if "all" in self.report_to:
            return [name for name in TRACKERS if tracker_installed(name)]
        return [name for name in dict.fromkeys(self.report_to) if name in TRACKERS]


@dataclass
class EvalConfig:
    """Held-out evaluation (glm_grpo_ds/evaluation/in_training.py)."""

    file: str = setting(
        "",
        "Held-out prompts, any source data.train_file takes, read with data.prompt_key / target_image_key / "
        'text_key; "" = no evaluation.',
    )
    split: str = setting("test", "The split of eval.file when it is a dataset with several (a DatasetDict, a Hub id).")
    revision: str | None = setting(None, "Hub datasets only: the branch, tag or commit of eval.file (null = main).")
    steps: int = setting(0, "Evaluate every N training steps (0 = only before training and after the last step).")
    at_start: bool = setting(True, "Evaluate the initial policy (step 0) for comparison.")
    num_prompts: int = setting(0, "The first N prompts of the file (0 = all).")
    group_size: int = setting(4, "Samples per eval prompt, >= 1.")
    seed: int = setting(1234, "The sampler and decoder seeds of eval prompt i derive from (seed, i) only.")
    gallery: bool = setting(True, "samples/eval_step_N.png at every evaluation.")
    num_inference_steps: int | None = setting(
        None,
        "DiT steps of the evaluation decode (>= 1); null = the pipeline's own (50 for GLM-Image), as `glm-grpo "
        "render` decodes, so eval rewards score the images users will see, not the cheaper training decode "
        "(decoder.num_inference_steps).",
    )
    guidance_scale: float | None = setting(
        None, "Classifier-free guidance of the evaluation decode (> 0); null = the pipeline's own (1.5 for GLM-Image)."
    )

    def problems(self, prefix: str = "eval.") -> list[str]:
        """One line per problem, keys written ``<prefix>key``."""
        problems = []
        if self.steps < 0:
            problems.append(f"{prefix}steps must be >= 0 (0 = before training and at the end only), got {self.steps}")
        if self.num_prompts < 0:
            problems.append(f"{prefix}num_prompts must be >= 0 (0 = all), got {self.num_prompts}")
        if self.group_size < 1:
            problems.append(f"{prefix}group_size must be >= 1, got {self.group_size}")
        return problems + decode_problems(self.num_inference_steps, self.guidance_scale, prefix)


# The alarm rules a run watches unless told otherwise: the brightness shifts of UniRL's OCR hack (dark-pixel fraction
# 0.45 -> 0.93). Measured on the tiny world (docs/monitoring.md): a reward paying for dark pixels fires the first
# at step 10 (0.07 -> 0.47); the demo's 80 steps keep both within 0.06 of the start. The collapse rules (diversity,
# near-duplicates, colour entropy, edge density) are not defaults: the demo's prompts each have one right image,
# so its diversity falls to 0.08 x the start by design; docs/monitoring.md gives them for open-ended prompts.
DEFAULT_ALARMS = ("dark_fraction > start + 0.25", "bright_fraction > start + 0.25")


@dataclass
class MonitorConfig:
    """What the images become beyond their reward (glm_grpo_ds/monitoring/image_stats.py, alarms.py)."""

    statistics: list[str] = setting(
        help="The image statistics logged at every step and evaluation as images/<name> (and images/<name>_spread, "
        f"their standard deviation over the images): any of {', '.join(STATISTICS)}; [] = none. Computed on the "
        "images already decoded (docs/monitoring.md: what each means and costs).",
        factory=lambda: list(STATISTICS),
        noun="statistic",
    )
    alarms: list[str] = setting(
        help="Rules 'STATISTIC < BOUND' / 'STATISTIC > BOUND' with BOUND = N, N x start, start + N or start - N "
        "spread, checked at each evaluation (else each step) against the run's start (the step-0 evaluation, else "
        "the first step); a rule that fires prints one line, sets alarm/<statistic> to 1 (eval.jsonl and "
        "metrics.jsonl) and is listed in the run's closing lines, check-run, evaluate and the model card; [] = none. "
        "Default: " + "; ".join(DEFAULT_ALARMS) + ".",
        factory=lambda: list(DEFAULT_ALARMS),
    )
    stop_on_alarm: bool = setting(
        False,
        "Stop the run when an alarm fires: save a checkpoint and exit with status 5 (resume_from=latest continues; "
        "the alarm is checked again).",
    )
    fail_on_alarm: bool = setting(
        False,
        "Let the run finish, then exit with status 6 when any alarm fired during it (at any step; the closing lines "
        "list each with its step, value and bound): the final weights, logs and uploads are saved first, and a job "
        "script or CI sees a non-zero status. An upload failure's status 4 comes first.",
    )

    def problems(self, prefix: str = "monitor.", rewards: list[str] | None = None) -> list[str]:
        """One line per problem, keys written ``<prefix>key``; ``rewards``: the run's reward names (a rule on
        lpips_diversity needs an lpips reward, whose network measures it)."""
        problems = [
            f"{prefix}statistics: unknown statistic {name!r}; known: {', '.join(STATISTICS)}"
            for name in self.statistics
            if name not in STATISTICS
        ]
        try:
            rules = parse_rules(self.alarms, f"{prefix}alarms")
        except RuleError as err:
            return problems + str(err).splitlines()
        for i, rule in enumerate(rules):
            if rule.statistic not in self.statistics:
                problems.append(
                    f"{prefix}alarms[{i}]: {rule.text!r} watches {rule.statistic}, which {prefix}statistics does not "
                    f"compute; add it there or drop the rule"
                )
            elif rule.statistic in NEEDS_DISTANCE and rewards is not None and "lpips" not in rewards:
                problems.append(
                    f"{prefix}alarms[{i}]: {rule.text!r} watches {rule.statistic}, which needs an lpips reward (its "
                    "network measures the distances); add {name: lpips} to rewards or watch diversity instead"
                )
        return problems


@dataclass
class HubConfig:
    """Pushing the run's results to the Hugging Face Hub, and the model card (glm_grpo_ds/sharing/)."""

    repo_id: str | None = setting(
        None,
        "Hub model repo to upload the final adapter (LoRA) or model to, as namespace/name (created if missing, "
        "checked at startup); null = no upload. The token comes from HF_TOKEN or `hf auth login`, never from the "
        "config. A failed upload keeps every local file and ends the run with exit status 4 (docs/sharing.md).",
    )
    private: bool = setting(
        True, "Create the repo private; an existing public repo is refused while this is true (never made public)."
    )
    revision: str | None = setting(None, "Branch to upload to (created from main if missing); null = main.")
    push_checkpoints: bool = setting(
        False,
        "Also upload each saved checkpoint's adapter (LoRA only) to checkpoints/step_N/ in the repo, as it is saved; "
        "false = the final adapter / model only.",
    )
    base_model: str | None = setting(
        None,
        "Hub id of the base model for the model card's base_model metadata when model.path is a local directory "
        "(e.g. zai-org/GLM-Image); null = model.path when it is a Hub id or a Hugging Face cache snapshot, else the "
        "card names the local path in its text only (the Hub rejects a path as base_model).",
    )
