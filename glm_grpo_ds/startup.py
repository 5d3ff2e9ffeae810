"""The trainer's entrance hall: :func:`build_run` does what a run does before its first step, in named phases -
check what each rank can check alone, open the process group and ``output_dir``, read and check every input
(prompts, model files, processor, token ids, the DeepSpeed config), decide resume or fresh start, build (rewards,
policy, reference, DeepSpeed engines, decoder, the memory plan and the one copy of the base weights it places, the
samplers, where each step's rollout comes from), restore a checkpoint, and announce the run (config.json, the
startup summary) - and returns a :class:`Run`, the typed record of everything the loop reads
(glm_grpo_ds/train.py ``Trainer(run)``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from . import preflight
from .config import TrainConfig
from .config.notes import unused_settings
from .data import PromptOrder, check_source, load_prompts
from .decoder import ImageDecoder
from .decoder.compute import check_device
from .ds import dist
from .ds import engine as ds_engine
from .ds.ds_config import fill_ds_config, read_ds_config, zero_stage
from .ds.portable import cannot_load, universal_config
from .entropy_control import EntropyControl
from .evaluation.in_training import Evaluator
from .experience import ExperienceMaker, NoAhead, RolloutAhead, off_policy
from .experience import resumed as pending
from .grpo import LossSettings
from .lifecycle import checkpoint, resume, storage
from .lifecycle.background import Background
from .lifecycle.run import RunLife, decide_start
from .memory.startup import base_copy_placement, recorded_config, startup_plan
from .model import ema, reference
from .model.adapters import check_init_adapter, check_target_modules, text_layer_linear_names
from .model.glm_image import ar_parts, load_processor, read_ar_config, resolve_attn, resolve_dtype, resolve_sampling
from .model.policy import load_policy, load_reference
from .model.source import ModelSource, check_local_model, resolve_for_training
from .model.token_ids import check_token_ids, embedding_rows
from .monitoring.alarms import Monitor, parse_rules
from .observability.records import first_record, read_run_record
from .observability.step_status import NO_STATUS, NoStatus, StepStatus, for_rank
from .observability.summary import print_startup_summary
from .observability.tracking import Tracker, build_tracker
from .observability.watchdog import NoWatchdog, Watchdog, WatchedStatus, watched
from .observability.watchdog import for_run as watchdog_for_run
from .rewards import RewardError, RewardSet, build_rewards, check_reward_inputs, check_reward_specs
from .rollout.backends import EngineSampler
from .rollout.merged_lora import BaseCopy
from .runtime import cuda_check, log, memory_probe, run_log, threads
from .runtime.atomic_files import write_text_atomic
from .runtime.cuda_check import CudaUnusable
from .runtime.seeding import derive_seed, rollout_seeds, seed_everything
from .runtime.versions import framework_versions
from .sharing.hub import Publisher
from .testing.random_model import materialize
from .update import logprobs_before_update, loss_settings

if TYPE_CHECKING:  # annotations only: the processor's class lives in transformers
    from transformers import ProcessorMixin


@dataclass(frozen=True)
class Run:
    """Everything the training loop reads, built once by :func:`build_run` (or from parts, by a test); nothing in it
    is replaced during the run (the objects it holds keep their own state: the engine's weights, the prompt order's
    position, the rollout pending one step off)."""

    cfg: TrainConfig  # the loaded config, with the model's own sampling settings where the config left them unset
    rank: int
    world: int
    device: torch.device
    out: Path  # output_dir
    status: StepStatus | NoStatus  # rank 0's step status line (observability/step_status.py); a no-op elsewhere
    step_status: StepStatus | NoStatus | WatchedStatus  # the same, its phases reported to the watchdog too
    watchdog: Watchdog | NoWatchdog  # every rank's hang reports (observability/watchdog.py)
    prompt_order: PromptOrder  # data/prompt_order.py: each step's prompts of this rank
    evaluator: Evaluator | None  # the in-training evaluation (eval.file), None without one
    reward_fn: RewardSet  # the configured rewards and their weights
    loss: LossSettings  # the policy loss's settings (grpo.*), built once
    entropy_control: EntropyControl | None  # grpo.entropy_target's adaptive coefficient (None: entropy_coef fixed)
    engine: torch.nn.Module  # the policy's DeepSpeed engine (ds/engine.py: the one module that imports DeepSpeed)
    ref_engine: torch.nn.Module | None  # full fine-tuning's reference (LoRA's is the policy with adapters off)
    reference: reference.LoraReference | reference.ModelReference | None  # grpo.ref_sync_steps' reset reference
    ema: ema.AdapterEMA | None  # lora.ema_decay's moving average of the adapter (model/ema.py)
    processor: ProcessorMixin  # GLM-Image's processor (tokenizer and image-grid helpers)
    dtype: torch.dtype
    base_copy: BaseCopy | None  # rollout.merge_lora's copy of the base weights (rollout/merged_lora.py)
    experience: ExperienceMaker  # training's experience path
    eval_experience: ExperienceMaker  # the evaluation's (its own sampler, the same decoder and rewards)
    rollout: NoAhead | RolloutAhead  # where each step's rollout comes from (experience/off_policy.py)
    life: RunLife  # the run on disk: checkpoints, final weights, stops (lifecycle/run.py)
    publisher: Publisher  # model cards and uploads (sharing/hub.py)
    monitor: Monitor  # the alarms on the image statistics
    tracker: Tracker  # metrics.jsonl and the experiment trackers
    model_source: ModelSource
    start_step: int  # 0, or the checkpoint's step
    skipped_steps: int  # optimizer updates skipped before start_step
    before_load_mb: float | None  # CPU: the resident set before any model (observability, check-run)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


# Bad inputs: reported as one line per problem (exit 2, train.py), with a traceback only under --debug; GPUs that
# torch cannot use are one too, met by the ranks only.
INPUT_ERRORS = (*preflight.INPUT_ERRORS, CudaUnusable)


def build_run(cfg, ds_config_path: str) -> Run:
    """The run of ``cfg`` with the DeepSpeed config at ``ds_config_path``, ready for its first step (collective:
    every rank calls it)."""
    return _Hall(cfg, ds_config_path).run


class _Hall:
    """:func:`build_run`'s phases (in ``__init__``: check inputs, open the run, read the inputs, build, resume,
    announce), each reading what the ones before it set; ``run`` is the result."""

    def __init__(self, cfg, ds_config_path: str):
        self.cfg = cfg
        # where the load, then each step, is (rank 0, logging.progress_bar; glm_grpo_ds/observability/step_status.py)
        self.status = for_rank(log.env_rank(), cfg.logging)
        self.status.begin("load")
        try:
            early = self._check_inputs(ds_config_path)
            resume_path = self._open_run(early)
            rows = self._read_inputs(ds_config_path)
            self._start_run(resume_path, rows)
            model = self._build()
            self.run = self._resume()
            self._announce(model)
        except BaseException:
            self.status.close()  # a terminal's status line goes before the error's line
            raise

    def _check_inputs(self, ds_config_path: str) -> BaseException | None:
        """What each rank can check alone, before the process group (whose start may first build DeepSpeed's
        CPU communication op, ~40 s): a mistyped path or reward fails in seconds, on every rank alike. GPUs
        that torch cannot use first: that refusal explains the rest (init_distributed checks again). On several
        nodes a node may fail alone: its error is returned, for every rank to agree on once the group exists."""
        try:
            self._check_each_input(ds_config_path)
        except INPUT_ERRORS as err:
            if threads.launcher_nodes() == 1:
                raise
            return err
        return None

    def _check_each_input(self, ds_config_path: str) -> None:
        cfg = self.cfg
        self.status.phase("input checks")
        if log.env_rank() == 0:  # settings this run accepts and does not act on (config/notes.py)
            for line in unused_settings(cfg):
                log.warning(f"glm-grpo: warning: {line}")
        cuda_check.check_rank()
        check_source(cfg.data.train_file, "data.train_file", cfg.data)
        if cfg.eval.file:
            check_source(cfg.eval.file, "eval.file", cfg.data, cfg.eval.revision, subset=cfg.eval.subset)
        check_reward_specs(cfg.rewards, cfg.grpo.diversity_features)
        check_init_adapter(cfg.lora)
        self.ds_config_raw = read_ds_config(ds_config_path)
        materialize(cfg.model.path)  # a random: model's configs (glm_grpo_ds/model/random_weights.py)
        check_local_model(cfg.model.path, cfg.model.revision)

    def _open_run(self, early: BaseException | None) -> Path | None:
        """The process group, then ``output_dir``: every rank checks it and all agree what to resume (rank 0's
        ``latest``), and it must be one storage for all nodes (storage.py). Collective, and nothing before it
        can raise on one rank alone. The checkpoint to resume from, or None."""
        self.status.phase("process group")
        self.rank, self.world, self.local_rank, self.device = ds_engine.init_distributed(
            self.cfg.force_collectives, self.cfg.dist_timeout_minutes
        )
        self.is_main = self.rank == 0
        if not self.is_main:  # the launcher's RANK said 0 (or nothing)
            self.status.close()
            self.status = NO_STATUS
        log.set_rank(self.rank)
        if threads.launcher_nodes() > 1:  # a node that failed its checks alone stops every node now
            storage.agree_on_inputs(early)
        self.out, resume_path = storage.open_output_dir(self.cfg.output_dir, self.cfg.resume_from, self.rank)
        return resume_path

    def _read_inputs(self, ds_config_path: str) -> list:
        """Prompts (train and eval), the model's files, sampling / dtype / attention, the processor, every
        prompt's token ids, the filled DeepSpeed config: all read, and checked, before any model loads.
        Inputs are checked on every rank alike (each raises the same error, none waits in a collective for
        the others). The training rows."""
        cfg = self.cfg
        # the DiT's kernels on this device (decoder.attention, decoder.fp8): seconds, before a Hub id downloads
        check_device(cfg.decoder, self.device, resolve_dtype(cfg.decoder.dtype, on_gpu=self.device.type == "cuda"))
        self.status.phase("prompts")
        at = dict(rank=self.rank, local_rank=self.local_rank)  # a dataset cache to build: rank 0 builds it first
        rows = load_prompts(cfg.data.train_file, "data.train_file", cfg.data, **at)
        self.prompt_order = PromptOrder(
            rows,
            self.world,
            self.rank,
            cfg.batch.prompts_per_rank,
            cfg.seed,
            cfg.data.shuffle,
            cfg.data.dead_prompt_skip_prob,
            cfg.batch.mini_batches,
        )
        ev = cfg.eval
        at_eval = dict(at, subset=ev.subset)
        eval_rows = load_prompts(ev.file, "eval.file", cfg.data, ev.split, ev.revision, **at_eval) if ev.file else None
        check_reward_inputs(cfg.rewards, rows, "data.train_file", cfg.data.train_file)
        if eval_rows:
            check_reward_inputs(cfg.rewards, eval_rows, "eval.file", cfg.eval.file)
        # after the cheap checks: a Hub id may download (rank 0, if the environment allows; the others wait)
        self.status.phase("model files")
        self.model_source = resolve_for_training(cfg.model.path, cfg.model.revision, self.rank)
        # unset sampling knobs = what the model samples with by itself (recorded in config.json): the run's config
        # is the loaded one with them filled in (the loaded object is left as it was)
        sampling = resolve_sampling(cfg.grpo.sampling, self.model_source.path)
        cfg = self.cfg = replace(cfg, grpo=replace(cfg.grpo, sampling=sampling))
        self.evaluator = Evaluator(cfg, eval_rows, self.rank, self.world, self.device) if eval_rows else None
        # before the processor: importing it imports transformers' flash-attn probe, which a broken
        # flash-attn install crashes; resolve_attn turns that into one line
        on_gpu = self.device.type == "cuda"
        self.dtype = resolve_dtype(cfg.model.dtype, on_gpu)
        self.attn = resolve_attn(cfg.model.attn_implementation, on_gpu, self.dtype)  # the benchmarks load alike
        self.status.phase("processor")
        self.processor = load_processor(self.model_source.path)
        # every id a prompt can produce must have an embedding row: else a raw IndexError mid-run
        size = dict(height=cfg.rollout.height, width=cfg.rollout.width)
        rows_in_ar = embedding_rows(self.model_source.path)
        check_token_ids(self.processor, rows_in_ar, self.model_source.path, rows, "data.train_file", **size)
        if eval_rows:
            check_token_ids(self.processor, rows_in_ar, self.model_source.path, eval_rows, "eval.file", **size)
        text_config = read_ar_config(self.model_source.path)["text_config"]
        if cfg.lora is not None:  # peft would drop a name that matches nothing, silently
            check_target_modules(cfg.lora.target_modules, text_layer_linear_names(text_config))
        hidden = text_config["hidden_size"]
        self.ds_config = fill_ds_config(self.ds_config_raw, cfg, self.world, hidden, self.dtype, ds_config_path)
        return rows

    def _start_run(self, resume_path: Path | None, rows: list) -> None:
        """Resume or start fresh (lifecycle/run.py decides, before any model loads), then the run's log file,
        rank 0's background worker and the model cards' publisher (hub.repo_id checked now)."""
        self.data_fingerprint = resume.data_fingerprint(self.cfg.data.train_file, rows)
        storage.check_same_data(self.data_fingerprint, "data.train_file")  # node-local copies that differ
        stage = zero_stage(self.ds_config)
        start = decide_start(self.out, resume_path, self.cfg, self.world, stage, self.data_fingerprint, self.rank)
        run_log.open_file(self.out, self.rank)  # library output: logs/rank_<r>.log (what was held back first)
        # rank 0's pruning and checkpoint uploads, off the collective path (glm_grpo_ds/lifecycle/background.py)
        self.background = Background()
        self.publisher = Publisher(self.cfg, self.out, self.rank, self.background)
        later = partial(self.background.submit, "prune")
        self.life = RunLife(
            self.cfg, self.out, start, self.rank, self.world, stage, self.data_fingerprint, self.publisher, later
        )
        if start.written_on is not None:  # another world size or stage: the checkpoint's universal form
            refused = cannot_load(self.ds_config)
            if refused:
                raise checkpoint.CheckpointError(f"{start.checkpoint}: {refused}; nothing was changed")
            self.status.phase("checkpoint conversion")
            self.life.convert()
            self.ds_config = universal_config(self.ds_config)

    def _build(self):
        """Rewards, the policy (and the reference), the DeepSpeed engines, the decoder, the memory plan, the
        experience maker. The policy model (before DeepSpeed)."""
        cfg = self.cfg
        self.status.phase("rewards")
        # rank 0 first, then each node's first rank, then the rest: a reward model on the Hub downloads once
        build = partial(build_rewards, cfg.rewards, cfg.grpo.diversity_features)
        self.reward_fn = dist.in_rank_order(build, self.rank, self.local_rank, "rewards", RewardError)
        # Same seed on every rank: model construction (LoRA init) must be identical everywhere;
        # sampling streams are derived per (step, place in the global batch): runtime/seeding.rollout_seeds.
        seed_everything(derive_seed(cfg.seed, "init"))
        # CPU: what the resident set holds before any model (interpreter, libraries, data, processor,
        # reward functions), which the memory plan does not count (check-run and docs/real-width.md use it)
        self.before_load_mb = memory_probe.current_bytes(self.device) / 2**20 if self.device.type == "cpu" else None
        ref = None
        self.status.phase("policy")
        with ds_engine.zero3_model_loading(self.ds_config):
            model = load_policy(
                self.model_source.path,
                self.dtype,
                self.attn,
                cfg.lora,
                cfg.model.gradient_checkpointing,
                cfg.model.trust_remote_code,
                seed=derive_seed(cfg.seed, "lora"),
                adapter_base=self.model_source.adapter_base(),
            )
            if cfg.needs_reference_model:
                self.status.phase("reference model")
                ref = load_reference(self.model_source.path, self.dtype, self.attn, cfg.model.trust_remote_code)
        self.status.phase("DeepSpeed engine")
        self.ref_engine = ds_engine.initialize_reference(ref, self.ds_config) if ref is not None else None
        self.engine = ds_engine.initialize(model, self.ds_config, cfg.optimizer, cfg.total_optimizer_steps)
        self.reference = reference.for_run(cfg, self.engine, self.ref_engine, self.device)
        self.ema = ema.for_run(cfg, self.engine)
        self.status.phase("decoder")
        decoder = ImageDecoder(self.model_source.path, cfg.decoder, self.device)
        if self.evaluator is not None and self.evaluator.decode != decoder.training:
            log.info(
                f"glm-grpo: training rewards decode with {decoder.training.describe()} (decoder.*), evaluation with "
                f"{self.evaluator.decode.describe()} (eval.*)"
            )
        # the memory plan of this very run (rank 0 prints it); with rollout.merge_lora it places the merge's copy of
        # the base weights, on every rank: the one BaseCopy, made here, both samplers share
        self.memory_plan = None
        if self.is_main or cfg.rollout.merge_lora:
            self.memory_plan = startup_plan(cfg, self.ds_config_raw, self.world, self.device)
        self.base_copy_where = base_copy_placement(self.memory_plan)
        self.base_copy = BaseCopy(self.base_copy_where) if self.base_copy_where else None
        # training's sampler computes the reference / old log-probs inside the rollout's gather (under ZeRO-3 they
        # then gather nothing more); the evaluation's samples only
        before = partial(logprobs_before_update, cfg=cfg, reference=self.reference) if cfg.logprobs_in_rollout else None
        sampler = EngineSampler(self.engine, self.processor, cfg, self.device, before, base_copy=self.base_copy)
        # every rank's hang reports (observability/watchdog.py): the step status's phases reach it (an evaluation's
        # under names of their own), its thread runs during the loop (Trainer.train)
        self.watchdog = watchdog_for_run(cfg.logging, self.rank, cfg.dist_timeout_minutes)
        self.step_status = watched(self.status, self.watchdog)
        self.experience = ExperienceMaker(sampler, decoder, self.reward_fn, cfg, self.device, self.step_status)
        eval_sampler = EngineSampler(self.engine, self.processor, cfg, self.device, base_copy=self.base_copy)
        eval_status = watched(self.status, self.watchdog, "eval ")
        self.eval_experience = ExperienceMaker(eval_sampler, decoder, self.reward_fn, cfg, self.device, eval_status)
        return model

    def _resume(self) -> Run:
        """The checkpoint's weights, optimizer, RNG and data position when resuming (collective), where each step's
        rollout comes from (with the one a checkpoint drew ahead), then the alarms and the trackers (a resumed run
        continues its tracker runs): the run."""
        cfg = self.cfg
        self.life.tidy()
        dist.barrier()
        if self.life.start.checkpoint is not None:
            self.status.phase("checkpoint")
        control = EntropyControl.for_config(cfg.grpo)
        restored = self.life.restore(self.engine, self.prompt_order, control, self.reference, self.ema)
        self.start_step, skipped_steps = restored
        seeds = partial(rollout_seeds, cfg.seed, places=self.prompt_order.places(self.rank))
        rollout = off_policy.for_run(cfg, self.experience, self.engine, self.device, self.prompt_order, seeds)
        path, moved, order = self.life.start.checkpoint, self.life.start.written_on is not None, self.prompt_order
        per = cfg.batch.prompts_per_rank
        if path is not None and not isinstance(rollout, RolloutAhead):
            pending.requeue_unused(path, self.start_step, order)
        elif path is not None and not moved:  # the same world size and stage (resumed.py)
            pending.take_pending(rollout, path, self.rank, per, order, self.device, self.life.start.changes)
        for maker in (self.experience, self.eval_experience):  # the samplers take the weights the run starts from
            maker.sampler.sync_weights(self.start_step)
        if path is not None and moved and isinstance(rollout, RolloutAhead):
            pending.draw_again(rollout, path, self.start_step, self.rank, self.world, per, order, self.experience)
        monitor = self._monitor()
        self.status.phase("trackers")
        resumed = path is not None
        tracker = build_tracker(cfg, self.is_main, resume_step=self.start_step if resumed else None)
        self.status.idle()  # the startup summary follows
        return Run(
            cfg=cfg, rank=self.rank, world=self.world, device=self.device, out=self.out, status=self.status,
            step_status=self.step_status, watchdog=self.watchdog, prompt_order=self.prompt_order,
            evaluator=self.evaluator, reward_fn=self.reward_fn, loss=loss_settings(cfg.grpo), entropy_control=control,
            engine=self.engine, ref_engine=self.ref_engine, reference=self.reference, ema=self.ema,
            processor=self.processor, dtype=self.dtype, base_copy=self.base_copy, experience=self.experience,
            eval_experience=self.eval_experience, rollout=rollout, life=self.life, publisher=self.publisher,
            monitor=monitor, tracker=tracker, model_source=self.model_source, start_step=self.start_step,
            skipped_steps=skipped_steps, before_load_mb=self.before_load_mb,
        )  # fmt: skip

    def _monitor(self) -> Monitor:
        """The alarms (monitor.alarms) on the evaluations when the run evaluates, else on the training steps; a
        resumed run's start is the first record of that file."""
        evals = self.evaluator is not None
        metrics_file = self.out / ("eval.jsonl" if evals else "metrics.jsonl")
        start = first_record(metrics_file) if self.start_step > 0 else None
        return Monitor(parse_rules(self.cfg.monitor.alarms), "eval/images/" if evals else "images/", start)

    def _announce(self, model) -> None:
        """Rank 0: ``config.json`` (the config, the model source, the DeepSpeed config, the data, the versions)
        and the startup summary with the memory plan."""
        if not self.is_main:
            return
        previous = read_run_record(self.out) if self.start_step else None
        record = {
            "train": recorded_config(self.cfg, self.base_copy_where),  # merge_copy=auto: the placement taken
            # the history: from which step which settings changed (resumes with other settings; lifecycle/resume.py)
            "segments": resume.segments(previous, self.start_step, self.life.start.changes),
            "model_source": self.model_source.record(),
            "launch_dir": str(Path.cwd()),  # where the config's relative paths start (glm-grpo evaluate reads them)
            "deepspeed": self.ds_config,
            "data": self.data_fingerprint,  # what the cards name: the source and its number of prompts
            "versions": framework_versions(),
        }
        write_text_atomic(self.out / "config.json", json.dumps(record, indent=2))  # a kill leaves the old one whole
        print_startup_summary(
            self.cfg, model, self.ds_config, self.world, self.device, self.dtype, self.attn, self.out, self.memory_plan,
            codebook_size=ar_parts(model)[2],
        )  # fmt: skip
        log.info(f"          model: {self.model_source.describe()}")
