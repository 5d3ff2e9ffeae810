"""Configuration dataclasses: the only place where defaults live.

A run is described by :class:`TrainConfig`, filled from a YAML file and dotted ``key=value``
command-line overrides::

    cfg = load_config("configs/tiny_cpu.yaml", ["max_steps=10", "lora.r=8", "lora=null"])

Unknown keys fail with a close-match suggestion, values are converted to the field's type, and
:meth:`TrainConfig.validate` reports every problem, one line each. Command-line tools
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


class ConfigError(ValueError):
    """A configuration problem; the message names the key and the fix."""


@dataclass
class SamplingConfig:
    """How the AR policy samples visual tokens during a rollout.

    Tokens are drawn from the policy distribution (codebook mask, temperature) cut to the top-k /
    top-p support; every log-prob the loss uses (sampler record, teacher-forced, old, reference) is
    under the policy distribution, never re-truncated (see glm_grpo_ds/sampling.py).
    """

    # None = what the model itself samples with: its vision_language_encoder/generation_config.json,
    # and transformers' generate() defaults for what that leaves unset (temperature 1, top_k 50,
    # top_p 1). Released GLM-Image: temperature 0.9, top_p 0.75, top_k 50 (policy.resolve_sampling).
    temperature: float | None = None
    top_k: int | None = None  # 0 = off
    top_p: float | None = None  # 1.0 = off

    def validate(self) -> None:
        if self.temperature is not None and not self.temperature > 0:
            raise ValueError(f"sampling.temperature must be > 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 0:
            raise ValueError(f"sampling.top_k must be >= 0 (0 = off), got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"sampling.top_p must be in (0, 1] (1 = off), got {self.top_p}")

    @property
    def resolved(self) -> bool:
        return None not in (self.temperature, self.top_k, self.top_p)


@dataclass
class DecoderConfig:
    """The frozen DiT + VAE + glyph encoder that render prior tokens to images."""

    num_inference_steps: int = 8
    guidance_scale: float = 1.5
    batch_size: int = 8  # images per DiT forward; bounds decode memory
    offload: bool = False  # keep on CPU between rollouts, move to the accelerator only to decode
    dtype: str = "auto"  # auto = bf16 on GPU, fp32 on CPU
    # Decoder noise seed of a prompt: seed + dataset row index (fixed_seeds, the same every step,
    # as for evaluation or reference-likeness tasks) or a fresh seed per (step, row).
    seed: int = 0
    fixed_seeds: bool = False

    def validate(self) -> None:
        if self.num_inference_steps < 1:
            raise ValueError(f"decoder.num_inference_steps must be >= 1, got {self.num_inference_steps}")
        if self.batch_size < 1:
            raise ValueError(f"decoder.batch_size must be >= 1, got {self.batch_size}")
        if self.dtype not in ("auto", "bf16", "fp32", "fp16"):
            raise ValueError(f"decoder.dtype must be auto|bf16|fp32|fp16, got {self.dtype!r}")


@dataclass
class ModelConfig:
    path: str = ""  # a GlmImagePipeline directory (required)
    dtype: str = "auto"  # auto = bf16 on GPU, fp32 on CPU
    attn_implementation: str = "auto"  # auto = flash_attention_2 if installed (GPU, bf16), else sdpa
    gradient_checkpointing: bool = True
    trust_remote_code: bool = False


@dataclass
class LoraConfig:
    """peft LoRA on the language model. ``lora: null`` in YAML = full fine-tuning."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    # attention and MLP projections of GlmImageTextDecoderLayer (the vision tower has other names
    # only where it shares q/k/v; see policy.lora_target_regex, which restricts to the LM)
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_up_proj", "down_proj"]
    )


@dataclass
class GRPOConfig:
    group_size: int = 8  # G completions per prompt
    beta: float = 0.04  # KL coefficient; 0 skips the reference pass
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    aggregation: str = "token_mean"  # token_mean | seq_mean | dr_grpo
    advantage_scale: str = "group"  # group | batch | none
    reward_combination: str = "sum_then_normalize"  # or normalize_then_sum (see rewards/combine.py)
    num_iterations: int = 1  # updates per rollout (mu); > 1 stores old log-probs
    # Train on the preview-grid tokens too (they condition the target grid, but the DiT renders
    # only the target grid). false = loss on the target grid's tokens alone: less variance when the
    # reward cannot depend on the preview (the tiny world), biased for the real model.
    preview_in_loss: bool = True
    logprob_chunk_size: int = 256  # tokens per lm_head chunk in the teacher-forced pass
    sampling: SamplingConfig = field(default_factory=SamplingConfig)


@dataclass
class OptimizerConfig:
    name: str = "adamw_8bit"  # adamw | adamw_8bit | paged_adamw_8bit
    lr: float = 1e-5
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    weight_decay: float = 0.0
    schedule: str = "constant"  # constant | linear | cosine (after warmup)
    warmup_steps: int = 0
    max_grad_norm: float = 1.0


@dataclass
class BatchConfig:
    prompts_per_rank: int = 1  # prompts each rank samples per step (x G sequences)
    micro_batch_size: int = 4  # sequences per forward/backward; must divide prompts_per_rank * G


@dataclass
class RolloutConfig:
    height: int = 1024
    width: int = 1024
    # ZeRO-3: gather the AR's parameters once per rollout (fast); false keeps them sharded
    # during sampling for models that cannot be gathered on one device (slow).
    gather_parameters: bool = True


@dataclass
class RewardSpec:
    name: str = ""  # built-in name or python:package.module:function
    weight: float = 1.0
    args: dict = field(default_factory=dict)


@dataclass
class DataConfig:
    train_file: str = ""  # .txt (one prompt per line) or .jsonl (prompt, target_image, text)
    shuffle: bool = True


# Experiment trackers ``logging.report_to`` may name (metrics.jsonl is always written).
TRACKERS = ("tensorboard", "wandb")


@dataclass
class LoggingConfig:
    """Rank-0 outputs besides ``metrics.jsonl`` (see glm_grpo_ds/tracking.py, gallery.py)."""

    progress_bar: bool = True  # tqdm bar when stderr is a terminal, else one line every log_every steps
    log_every: int = 10  # steps between progress lines when stderr is not a terminal (log files)
    plot: bool = True  # reward / KL / clip-fraction PNG at the end of training (reward_curve.png)
    report_to: list[str] = field(default_factory=list)  # any of TRACKERS, e.g. [tensorboard, wandb]
    wandb_project: str = "glm-grpo"
    wandb_run_name: str | None = None  # None = the output_dir's name
    wandb_mode: str = "offline"  # offline (no network; `wandb sync` later) | online
    gallery_steps: int = 0  # training gallery samples/step_N.png every N steps (0 = off)
    gallery_max_prompts: int = 4  # rows (prompts) per gallery, training and eval
    gallery_thumbnail: int = 128  # longest side of a gallery tile in pixels (never upscaled)


@dataclass
class EvalConfig:
    """Held-out evaluation with seeds that do not depend on the training step, rank count or
    ``seed``: the same weights always get the same eval reward (glm_grpo_ds/evaluate.py)."""

    file: str = ""  # .txt / .jsonl prompts like data.train_file; "" = no evaluation
    steps: int = 0  # evaluate every N training steps (0 = only before training and after the last step)
    at_start: bool = True  # evaluate the initial policy (step 0) for comparison
    num_prompts: int = 0  # the first N prompts of the file (0 = all)
    group_size: int = 4  # samples per eval prompt
    seed: int = 1234  # sampler and decoder seeds of eval prompt i derive from (seed, i) only
    gallery: bool = True  # samples/eval_step_N.png at every evaluation


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    lora: LoraConfig | None = field(default_factory=LoraConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    decoder: DecoderConfig = field(default_factory=DecoderConfig)
    rewards: list[RewardSpec] = field(default_factory=list)
    data: DataConfig = field(default_factory=DataConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    output_dir: str = "outputs/run"
    max_steps: int = 100
    seed: int = 42
    save_steps: int = 0  # checkpoint every N steps (0 = never); see glm_grpo_ds/checkpoint.py
    save_total_limit: int = 0  # keep the newest K checkpoints (0 = keep all)
    resume_from: str | None = None  # "latest" (newest complete checkpoint of output_dir) or a checkpoint path
    # Stop (checkpoint + exit code 3) after this many steps in a row whose optimizer update was
    # skipped for a non-finite loss/gradient; 0 = never stop.
    max_consecutive_skips: int = 3
    # Run every collective even at world size 1 (normally skipped): one GPU with NCCL then checks
    # the multi-GPU communication path (device placement of every collective) - see glm_grpo_ds/ds/dist.py.
    force_collectives: bool = False

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
        need(self.model.dtype in ("auto", "bf16", "fp32", "fp16"), f"model.dtype must be auto|bf16|fp32|fp16, got {self.model.dtype!r}")
        need(
            self.model.attn_implementation in ("auto", "sdpa", "eager", "flash_attention_2"),
            f"model.attn_implementation must be auto|sdpa|eager|flash_attention_2, got {self.model.attn_implementation!r}",
        )
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
        need(g.aggregation in ("token_mean", "seq_mean", "dr_grpo"), f"grpo.aggregation must be token_mean|seq_mean|dr_grpo, got {g.aggregation!r}")
        need(g.advantage_scale in ("group", "batch", "none"), f"grpo.advantage_scale must be group|batch|none, got {g.advantage_scale!r}")
        need(
            g.reward_combination in ("sum_then_normalize", "normalize_then_sum"),
            f"grpo.reward_combination must be sum_then_normalize|normalize_then_sum, got {g.reward_combination!r}",
        )
        need(g.num_iterations >= 1, f"grpo.num_iterations must be >= 1, got {g.num_iterations}")
        need(g.logprob_chunk_size >= 1, f"grpo.logprob_chunk_size must be >= 1, got {g.logprob_chunk_size}")
        try:
            g.sampling.validate()
        except ValueError as err:
            problems.append(f"grpo.{err}")
        o = self.optimizer
        need(o.name in ("adamw", "adamw_8bit", "paged_adamw_8bit"), f"optimizer.name must be adamw|adamw_8bit|paged_adamw_8bit, got {o.name!r}")
        need(o.lr > 0, f"optimizer.lr must be > 0, got {o.lr}")
        need(len(o.betas) == 2, f"optimizer.betas must be two numbers, got {o.betas}")
        need(o.schedule in ("constant", "linear", "cosine"), f"optimizer.schedule must be constant|linear|cosine, got {o.schedule!r}")
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
        for i, name in enumerate(lg.report_to):
            close = difflib.get_close_matches(name, TRACKERS, n=2, cutoff=0.5)
            hint = f"did you mean {', '.join(repr(c) for c in close)}?" if close else f"known: {', '.join(TRACKERS)}"
            need(name in TRACKERS, f"logging.report_to[{i}]: unknown tracker {name!r}; {hint}")
        # Checked here, on every rank, so a missing package stops all ranks before training
        # instead of failing on rank 0 only while the others wait in a collective.
        import importlib.util

        for name in set(lg.report_to) & set(TRACKERS):
            need(
                importlib.util.find_spec(name) is not None,
                f"logging.report_to names {name} but the {name} package is not installed: pip install 'glm-grpo-ds[tracking]'",
            )
        need(lg.wandb_mode in ("offline", "online"), f"logging.wandb_mode must be offline|online, got {lg.wandb_mode!r}")
        need(lg.log_every >= 1, f"logging.log_every must be >= 1, got {lg.log_every}")
        need(lg.gallery_steps >= 0, f"logging.gallery_steps must be >= 0 (0 = off), got {lg.gallery_steps}")
        need(lg.gallery_max_prompts >= 1, f"logging.gallery_max_prompts must be >= 1, got {lg.gallery_max_prompts}")
        need(lg.gallery_thumbnail >= 16, f"logging.gallery_thumbnail must be >= 16 pixels, got {lg.gallery_thumbnail}")
        need(ev.steps >= 0, f"eval.steps must be >= 0 (0 = before training and at the end only), got {ev.steps}")
        need(ev.num_prompts >= 0, f"eval.num_prompts must be >= 0 (0 = all), got {ev.num_prompts}")
        need(ev.group_size >= 1, f"eval.group_size must be >= 1, got {ev.group_size}")


# ----------------------------------------------------------------------------- loading
def _unknown(key: str, known: typing.Iterable[str], where: str) -> ConfigError:
    close = difflib.get_close_matches(key, list(known), n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(repr(where + c) for c in close)}?" if close else f"known keys under it: {', '.join(sorted(known))}"
    return ConfigError(f"unknown config key {where + key!r}; {hint}")


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
