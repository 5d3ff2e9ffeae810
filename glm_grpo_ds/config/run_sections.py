"""The sections of a run's inputs and outputs: ``data``, ``eval``, ``logging``, ``monitor`` and ``hub``. Each checks
its own fields (``problems()``; the monitor's given the run's reward names: an alarm on lpips_diversity needs an
lpips reward); TrainConfig.validate adds the rules that tie sections together (pushing checkpoints needs LoRA and
save_steps)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..monitoring.alarms import RuleError, parse_rules
from ..monitoring.image_stats import NEEDS_DISTANCE, STATISTICS
from .checks import decode_problems, need
from .fields import choice_error, choice_problems, is_repo_id, setting


@dataclass
class DataConfig:
    """The training prompts."""

    train_file: str = setting(
        "",
        "The prompts (required): a .txt (one per line), .jsonl, .parquet, .csv or .json file, a directory written by "
        "datasets' save_to_disk (or of data files), or a Hugging Face Hub dataset id (org/name, through the HF "
        "cache; offline-aware). Columns / JSON keys: see prompt_key, target_image_key, text_key; the others are "
        "passed to the rewards. Paths in target_image are relative to the file (or the dataset directory). A .txt "
        "with a target_images/ folder beside it gets a target image per line from it, named by line number "
        "(7.png or 0007.png; docs/configuration.md#promptstxt-with-a-target_images-folder).",
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
    subset: str | None = setting(
        None,
        "The subset (config) of a Hub dataset or dataset directory of several, e.g. a benchmark's categories "
        "(datasets' load_dataset name; TRL's dataset_config); null = its only one.",
    )
    dead_prompt_skip_prob: float = setting(
        0.0,
        "In [0, 1). A dead prompt is one whose last group had all advantages 0, nothing learnt (every reward equal "
        "across its samples, a weight-0 reward aside). When its turn comes again it is skipped with this "
        "probability, drawn per (epoch, prompt) alike on every rank, and the next prompt is taken, so no rollout "
        "or decode goes to it (GRESO-style selective rollouts); on average it is retried after p / (1 - p) of "
        "its turns, and a step never skips more prompts than the set holds. 0 = off. frac_reward_zero_std and "
        "prompts_skipped in metrics.jsonl show the effect.",
    )

    def problems(self, prefix: str = "data.") -> list[str]:
        """One line per problem, keys written ``<prefix>key``."""
        problems = choice_problems(self, prefix)
        if not self.train_file:
            problems.append(
                f"{prefix}train_file is required: a prompt file (.txt, .jsonl, .parquet, .csv, .json), a dataset "
                "directory or a Hub dataset id"
            )
        keys = {f"{prefix}prompt_key": self.prompt_key, f"{prefix}target_image_key": self.target_image_key}
        keys[f"{prefix}text_key"] = self.text_key
        if not all(keys.values()):
            problems.append(f"{', '.join(keys)} must not be empty")
        if not len(set(keys.values())) == 3:
            problems.append(f"{', '.join(keys)} must name three different columns, got {keys}")
        p = self.dead_prompt_skip_prob
        if not 0 <= p < 1:
            problems.append(f"{prefix}dead_prompt_skip_prob must be in [0, 1) (1 would never retry a prompt), got {p}")
        return problems


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
    subset: str | None = setting(
        None, "The subset (config) of eval.file when it is a dataset of several, as data.subset; null = its only one."
    )
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

    def evaluates(self, step: int, max_steps: int) -> bool:
        """Whether the run evaluates after training step ``step`` (1-based): every ``steps``, and the last."""
        return step == max_steps or bool(self.steps and step % self.steps == 0)

    def problems(self, prefix: str = "eval.") -> list[str]:
        """One line per problem, keys written ``<prefix>key``."""
        problems = choice_problems(self, prefix)  # none today: any Literal[...] field added later is checked
        if self.steps < 0:
            problems.append(f"{prefix}steps must be >= 0 (0 = before training and at the end only), got {self.steps}")
        if self.num_prompts < 0:
            problems.append(f"{prefix}num_prompts must be >= 0 (0 = all), got {self.num_prompts}")
        if self.group_size < 1:
            problems.append(f"{prefix}group_size must be >= 1, got {self.group_size}")
        return problems + decode_problems(self.num_inference_steps, self.guidance_scale, prefix)


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
    """Rank-0 outputs besides ``metrics.jsonl`` (see glm_grpo_ds/observability/tracking.py, gallery.py), and every
    rank's hang reports (``watchdog*``: glm_grpo_ds/observability/watchdog.py)."""

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
    sample_records: int = setting(
        0,
        "Every N steps, a line per sample of the step in samples.jsonl: its prompt, each reward, the weighted total "
        "and the advantage the update used (0 = off; ~300 bytes a sample).",
    )
    gallery_max_prompts: int = setting(4, "Rows (prompts) per gallery, training and eval; >= 1.")
    gallery_thumbnail: int = setting(128, "Longest side of a gallery tile in pixels (never upscaled); >= 16.")
    watchdog: bool = setting(
        True,
        "Every rank watches its own step: a phase (rollout, decode, reward, advantages, update, record, checkpoint "
        "save, eval ...) running past its limit (watchdog_factor, watchdog_min_seconds) is reported once, in that "
        "rank's logs/rank_<r>.log and on stderr, with the Python stacks of all its threads and the NCCL settings to "
        "rerun with (docs/troubleshooting.md#a-run-that-hangs). It never stops the run. false = off.",
    )
    watchdog_factor: float = setting(
        5.0,
        "A phase is late after this many times its last duration on this rank (a reported, slow occurrence counts "
        "only while the phase has no other), >= 1.",
    )
    watchdog_min_seconds: float = setting(
        300.0,
        "Nor before this many seconds: the floor, and the whole limit of a phase's first occurrence, > 0. The limit "
        "is never above half of dist_timeout_minutes, so the report comes before a collective's timeout ends the run.",
    )

    def trackers(self) -> list[str]:
        """The trackers ``report_to`` selects, in its order: ``all`` = every one whose package is
        installed (as transformers' ``report_to="all"``), ``none`` = none; unknown names are left to
        validation."""
        if "all" in self.report_to:
            return [name for name in TRACKERS if tracker_installed(name)]
        return [name for name in dict.fromkeys(self.report_to) if name in TRACKERS]

    def problems(self, prefix: str = "logging.") -> list[str]:
        """One line per problem, keys written ``<prefix>key``: an unknown tracker name first, then the rest.
        A named tracker's package is checked here, at config time on every rank, so a missing one stops all ranks
        before training instead of failing on rank 0 only while the others wait in a collective."""
        problems = choice_problems(self, prefix)
        alone = [name for name in ("all", "none") if name in self.report_to]
        need(
            problems,
            not alone or len(self.report_to) == 1,
            f"{prefix}report_to: {alone[0] if alone else ''} stands alone, got {self.report_to}; "
            "list the trackers instead, e.g. [tensorboard, wandb]",
        )
        if "all" not in self.report_to:
            for name in self.trackers():
                need(
                    problems,
                    tracker_installed(name),
                    f"{prefix}report_to names {name} but the {name} package is not installed: "
                    f"pip install {TRACKER_PIP[name]}",
                )
        for name, kwargs in self.tracker_kwargs.items():
            need(problems, name in TRACKERS, choice_error(name, TRACKERS, f"{prefix}tracker_kwargs", "tracker"))
            need(
                problems,
                isinstance(kwargs, dict),
                f"{prefix}tracker_kwargs.{name} must be a mapping of keyword arguments, got {kwargs!r}",
            )
        need(problems, self.log_every >= 1, f"{prefix}log_every must be >= 1, got {self.log_every}")
        need(
            problems,
            self.status_interval_s >= 0,
            f"{prefix}status_interval_s must be >= 0 seconds (0 = a status line at every change), got "
            f"{self.status_interval_s}",
        )
        need(
            problems, self.gallery_steps >= 0, f"{prefix}gallery_steps must be >= 0 (0 = off), got {self.gallery_steps}"
        )
        need(
            problems,
            self.sample_records >= 0,
            f"{prefix}sample_records must be >= 0 (0 = off), got {self.sample_records}",
        )
        need(
            problems,
            self.gallery_max_prompts >= 1,
            f"{prefix}gallery_max_prompts must be >= 1, got {self.gallery_max_prompts}",
        )
        thumbnail = self.gallery_thumbnail
        need(problems, thumbnail >= 16, f"{prefix}gallery_thumbnail must be >= 16 pixels, got {thumbnail}")
        factor, floor = self.watchdog_factor, self.watchdog_min_seconds
        need(problems, factor >= 1, f"{prefix}watchdog_factor must be >= 1 (x a phase's last duration), got {factor}")
        need(problems, floor > 0, f"{prefix}watchdog_min_seconds must be > 0 seconds, got {floor}")
        return problems


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
        "the alarm is checked again). A run that evaluates checks its alarms at the evaluations: it needs "
        "eval.steps > 0.",
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
        problems = choice_problems(self, prefix)  # none today: any Literal[...] field added later is checked
        problems += [
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
        "Also upload each saved checkpoint's adapter (LoRA only) to checkpoints/step_N/ in the repo, as it is saved "
        "(while training goes on); one whose previous upload is still running after a quarter of "
        "dist_timeout_minutes (at most 10 min) is skipped, with a warning, and the run ends with exit status 4 as "
        "for a failed upload (`glm-grpo push` uploads it later); false = the final adapter / model only.",
    )
    base_model: str | None = setting(
        None,
        "Hub id of the base model for the model card's base_model metadata when model.path is a local directory "
        "(e.g. zai-org/GLM-Image); null = model.path when it is a Hub id or a Hugging Face cache snapshot, else the "
        "card names the local path in its text only (the Hub rejects a path as base_model).",
    )

    def problems(self, prefix: str = "hub.") -> list[str]:
        """One line per problem, keys written ``<prefix>key``; what push_checkpoints needs of the other sections
        (LoRA, save_steps) is TrainConfig.validate's."""
        problems = choice_problems(self, prefix)
        if self.repo_id is not None and not is_repo_id(self.repo_id):
            problems.append(
                f"{prefix}repo_id={self.repo_id!r} is not a Hub repo id: write namespace/name (your user or "
                "organisation, then the repo name: letters, digits, '-', '_', '.'), or null for no upload"
            )
        if self.base_model is not None and not is_repo_id(self.base_model):
            problems.append(
                f"{prefix}base_model={self.base_model!r} is not a Hub model id: write namespace/name, e.g. "
                "zai-org/GLM-Image"
            )
        for key, value in (("push_checkpoints", self.push_checkpoints), ("revision", self.revision)):
            if value and self.repo_id is None:
                problems.append(
                    f"{prefix}{key} is set but {prefix}repo_id is null: set {prefix}repo_id=namespace/name to upload"
                )
        return problems
