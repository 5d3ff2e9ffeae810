"""The sections that say what is loaded and how it samples: ``model``, ``lora``, ``rollout``, ``decoder`` and
``grpo.sampling``. Each checks its own fields (``problems()``); TrainConfig.validate adds the rules that tie
sections together (LoRA-only rollout settings with ``lora: null``, the entropy quantile against the image size)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from .checks import decode_problems, raise_problems
from .fields import Dtype, choice_problems, setting


@dataclass
class ModelConfig:
    """The GLM-Image pipeline the AR policy is loaded from."""

    path: str = setting(
        "",
        "The GlmImagePipeline (required): a local directory (AR in vision_language_encoder/, processor, DiT, VAE, "
        "glyph encoder), used as is, or a Hugging Face Hub id such as zai-org/GLM-Image, downloaded once into the "
        "Hugging Face cache (HF_HOME / HF_HUB_CACHE; rank 0 downloads, the other ranks wait) and read from it after; "
        "with HF_HUB_OFFLINE=1 the cache only (glm_grpo_ds/model/source.py). random:glm-image[,ar_layers=N,"
        "dit_layers=M,seed=S] (or random:tiny): GLM-Image's configs with random weights built in the process on the "
        "device, for time and memory only (glm_grpo_ds/model/random_weights.py).",
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

    def problems(self, prefix: str = "model.") -> list[str]:
        """One line per problem, keys written ``<prefix>key``."""
        problems = []
        if not self.path:
            problems.append(f"{prefix}path is required: a GlmImagePipeline directory or a Hub id (org/name)")
        return problems + choice_problems(self, prefix)


@dataclass
class LoraConfig:
    """peft LoRA on the language model. ``lora: null`` in YAML = full fine-tuning."""

    r: int = setting(16, "LoRA rank (>= 1): more = more trainable parameters and optimizer memory.")
    alpha: int = setting(32, "LoRA scaling: the adapter's update is multiplied by alpha / r (> 0).")
    dropout: float = setting(
        0.0,
        "Dropout on the input of the LoRA adapters, in [0, 1). Keep 0 for GRPO: the sampler and the reference "
        "log-probs run without it, so above 0 the trainer scores a noisier policy than the one that sampled "
        "(mismatch/* in metrics.jsonl show it; with grpo.num_iterations > 1 the first iteration's ratio is not 1 "
        "and the clip acts on dropout noise; TRL's disable_dropout).",
    )
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

    ema_decay: float | None = setting(
        None,
        "Keep an exponential moving average of the adapter (Flow-GRPO's ema; glm_grpo_ds/model/ema.py) with this "
        "decay, in (0, 1), warmed up as min(decay, (1 + n) / (10 + n)) over its n updates, one a step, a skipped "
        "step's too (diffusers' EMAModel): "
        "the in-run evaluations sample the average, final_adapter_ema/ and each checkpoint's adapter_ema/ hold it; "
        "training samples and updates the adapter itself. The average lives whole on every rank, in fp32. null = "
        "none.",
    )

    def problems(self, prefix: str = "lora.") -> list[str]:
        """One line per problem, keys written ``<prefix>key``."""
        problems = []
        if self.ema_decay is not None and not 0 < self.ema_decay < 1:
            problems.append(f"{prefix}ema_decay must be null or in (0, 1), got {self.ema_decay}")
        if not self.r >= 1:
            problems.append(f"{prefix}r must be >= 1, got {self.r}")
        if not self.alpha > 0:  # 0 scales every update away: nothing would train, and nothing would say so
            problems.append(f"{prefix}alpha must be > 0, got {self.alpha}")
        if not 0 <= self.dropout < 1:  # checked here, not by torch's Dropout after the model loaded
            problems.append(f"{prefix}dropout must be in [0, 1), got {self.dropout}")
        if not len(self.target_modules) > 0:
            problems.append(f"{prefix}target_modules must name at least one module")
        return problems + choice_problems(self, prefix)


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
        "fuse_lora there. Under ZeRO-3 needs gather_parameters: true; on several ranks there the merge is written into "
        "the gathered copies, so the reference / old log-probs gather the weights once more.",
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
        "projection adapted): device (fastest restore), host (pinned CPU memory, ~19 GB there: each weight a "
        "power-of-two block; restored over PCIe, ~0.7 s a rollout), auto = device when the memory plan plus the "
        "copy fits the GPU, else host. Not kept under ZeRO-3 on several ranks, where the rollout's gathered weights "
        "are discarded anyway.",
    )
    one_step_off: bool = setting(
        False,
        "Sample step t+1's rollout with step t's weights on a background thread (its own CUDA stream) while step t "
        "decodes, scores and gathers its rewards (verl's one-step-off-policy; glm_grpo_ds/experience/off_policy.py "
        "RolloutAhead): the rollout hides behind the DiT decode, at most min(rollout, decode) per step (computed "
        "~15 s of the 58 s full-size step on an H200; not yet measured; its CUDA path, streams and capture on the "
        "thread, has not yet run on a GPU). Off-policy by one update: needs "
        "grpo.sampler_correction, which reweighs each token by pi_theta(t+1) / pi_theta(t). The first step samples "
        "on-policy; a checkpoint keeps the pending rollout, so a resumed run samples what the uninterrupted one "
        "would. Refused under ZeRO-3 (the rollout's gather would issue collectives beside the rewards' gather) and "
        "with data.dead_prompt_skip_prob > 0 (step t+1's prompts are drawn before step t's dead groups are known). "
        "Learning on the tiny world against on-policy: docs/sweep.md.",
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

    def problems(self, prefix: str = "rollout.") -> list[str]:
        """One line per problem, keys written ``<prefix>key``: an unknown choice first (the checks below read
        compile_scope and merge_copy), then the settings the others make ineffective, refused rather than
        silently ignored. That the LoRA-only settings need ``lora`` is TrainConfig.validate's (another section)."""
        problems = choice_problems(self, prefix)
        if self.fuse_lora and self.merge_lora:
            problems.append(
                f"{prefix}fuse_lora samples the adapters unmerged, {prefix}merge_lora merged: choose one (fuse_lora is "
                "exact, merge_lora rounds the adapter into the weights' dtype); to sample merged set "
                f"{prefix}fuse_lora=false"
            )
        if not (self.compile or self.compile_scope == "step"):
            problems.append(
                f"{prefix}compile_scope={self.compile_scope} chooses what {prefix}compile=false never compiles: "
                f"set {prefix}compile=true or drop compile_scope"
            )
        if not (self.merge_lora or self.merge_copy == "auto"):
            problems.append(
                f"{prefix}merge_copy={self.merge_copy} places a copy that {prefix}merge_lora=false never makes: "
                f"set {prefix}merge_lora=true or drop merge_copy"
            )
        for key, v in (("height", self.height), ("width", self.width)):
            if not (v > 0 and v % 32 == 0):
                problems.append(
                    f"{prefix}{key}={v} must be a positive multiple of 32 (GLM-Image tokens are 32x32 pixels)"
                )
        return problems


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
    attention: Literal[
        "sdpa", "sdpa_cudnn", "sdpa_flash", "sdpa_efficient", "sdpa_math", "flash_attn", "flash_attn_3"
    ] = setting(
        "sdpa",
        "The DiT's attention kernel, through diffusers' attention dispatcher: sdpa = torch's "
        "scaled_dot_product_attention, which picks its kernel itself; sdpa_cudnn / sdpa_flash / sdpa_efficient "
        "force one of its GPU kernels (sdpa_math: its reference math, any device); flash_attn / flash_attn_3 = the "
        "flash-attn 2 / 3 packages when installed. Exact attention each (the images differ by float rounding); "
        "a kernel this device or install lacks is refused before any model loads. `glm-grpo profile dit-timing` times "
        "them on a GPU.",
    )
    fp8: bool = setting(
        False,
        "Run the DiT's transformer-block linears in float8 e4m3 (weights per output channel, activations per "
        "token, torch's scaled matmul): half their weight memory and FP8 tensor cores on a GPU with compute "
        "capability 8.9+ (L40S, H100, H200; refused elsewhere; on a CPU it runs, slowly, to measure its "
        "numerics, where torch's CPU takes per-row FP8 scales: 2.15 does, 2.11 does not). Pair it with "
        "decoder.compile: eager, each linear's input quantization is 4 extra passes over the activations "
        "(computed: a large part of the GEMMs' saving at 1024²); compiled they fuse into one. "
        "Changes the images: check with `glm-grpo decode-agreement --candidate STEPS:GUIDANCE+fp8` that it still "
        "ranks a group's samples like the evaluation decode. Evaluation (in training and `glm-grpo evaluate`) "
        "decodes with the same DiT, so its rewards come from FP8 images too.",
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
        """One line per problem, keys written ``<prefix>key`` (GRPOConfig.problems passes ``grpo.sampling.``)."""
        problems = []
        if self.temperature is not None and not 0 < self.temperature < math.inf:
            problems.append(f"{prefix}temperature must be > 0 and finite, got {self.temperature}")
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
