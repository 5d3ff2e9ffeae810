"""GRPO training of the GLM-Image AR policy with DeepSpeed.

    deepspeed --num_gpus 8 --module glm_grpo_ds.train --config configs/glm_image_lora.yaml \
        --deepspeed ds_configs/zero3.json [key=value ...]
    python -m glm_grpo_ds.train --config configs/tiny_cpu.yaml --deepspeed ds_configs/zero2.json   # one process

One step: each rank samples G token grids for its prompts (rollout) -> the frozen DiT renders them
(decode) -> rewards score the images -> group-relative advantages over the global batch -> for each
micro-batch backward -> optimizer step (``grpo.num_iterations`` times; glm_grpo_ds/update.py). Outputs in
``output_dir``: ``metrics.jsonl``, ``config.json``, ``reward_curve.png``, ``final_adapter/`` (LoRA) or
``final_model/`` (full fine-tuning) with its model card, uploaded with ``hub.repo_id`` (sharing/hub.py); with
``eval.file`` ``eval.jsonl``, ``samples/`` galleries (``logging.gallery_steps``, evals); trackers
(``logging.report_to``).

Exit status: 0 done; 2 bad input (config, data, ds_config, model path, output_dir, checkpoint,
reward name or a reward's missing sample field: one line on stderr, ``--debug`` for the traceback); 3
stopped after ``max_consecutive_skips`` steps skipped in a row for a non-finite loss / gradient or rewards
undefined for every sample (checkpoint saved); 128 + signal when preempted by
SIGTERM (143) or SIGINT (130) (checkpoint saved, resume with ``resume_from=latest``), or interrupted
during startup, or aborted by a second Ctrl-C (no new checkpoint; one line each, see lifecycle/preempt.py); 4
trained and saved, but an upload to the Hub failed (``glm-grpo push OUTPUT_DIR`` retries it); 5 stopped by an
alarm on the image statistics with ``monitor.stop_on_alarm`` (checkpoint saved; monitoring/alarms.py); 6
trained and saved (final weights, logs, uploads), but an alarm fired during the run and ``monitor.fail_on_alarm``
is true (4 comes first when an upload failed too). The alarms that fired are listed in the closing lines.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from functools import partial
from pathlib import Path

import torch

from .advantages import combine_advantages, gate_disagreeing, reward_disagreement, signal_free_groups
from .config import ConfigError, load_config, to_dict
from .config.arguments import parse_train_args
from .data import DataError, PromptOrder, check_source, load_prompts
from .decoder import ImageDecoder
from .ds import dist
from .ds import engine as ds_engine
from .ds.ds_config import DeepSpeedConfigError, fill_ds_config, read_ds_config, zero_stage
from .evaluation.in_training import Evaluator, eval_line, eval_summary, gallery_to_main
from .experience import ExperienceMaker
from .lifecycle import checkpoint, resume, storage
from .lifecycle.background import Background
from .lifecycle.preempt import Interrupted, Stopped, StopSignals, exit_code, signal_name, startup_signals
from .lifecycle.run import RunLife, decide_start
from .memory.startup import resolve_merge_copy, startup_plan
from .model.adapters import check_init_adapter
from .model.glm_image import load_processor, read_ar_config, resolve_attn, resolve_dtype, resolve_sampling
from .model.policy import load_policy, load_reference
from .model.source import check_local_model, resolve_for_training
from .model.token_ids import check_token_ids, embedding_rows
from .monitoring.alarms import EXIT_ALARMS_FIRED, Monitor, alarm_failure, describe, parse_rules
from .observability.metrics import (
    Progress,
    StepFacts,
    disagreement_fields,
    fired_alarms,
    first_record,
    image_record,
    measure,
    step_record,
    timer,
)
from .observability.plot import PLOT_NAME, plot_training
from .observability.step_status import NO_STATUS, for_rank
from .observability.summary import print_startup_summary
from .observability.tracking import build_tracker
from .observability.update_stats import UpdateStats
from .rewards import RewardError, build_rewards, check_reward_inputs, check_reward_specs
from .rollout.backends import EngineSampler
from .runtime import cuda_check, log, memory_probe, process_exit, run_log
from .runtime.cuda_check import CudaUnusable
from .runtime.seeding import decoder_seed, derive_seed, seed_everything
from .runtime.versions import framework_versions
from .sharing.hub import Publisher
from .update import grpo_update, logprobs_before_update


class Trainer:
    """The entrance hall (in ``__init__``, in named phases: check inputs, open the run, read the inputs, build,
    resume, announce) -> ``train()`` -> outputs; ``step()`` is one GRPO step. The run's life on disk (start,
    checkpoints, final weights, stops) is ``self.life`` (glm_grpo_ds/lifecycle/run.py)."""

    def __init__(self, cfg, ds_config_path: str):
        self.cfg = cfg
        # where the load, then each step, is (rank 0, logging.progress_bar; glm_grpo_ds/observability/step_status.py)
        self.status = for_rank(log.env_rank(), cfg.logging)
        self.status.begin("load")
        try:
            self._check_inputs(ds_config_path)
            resume_path = self._open_run()
            rows = self._read_inputs(ds_config_path)
            self._start_run(resume_path, rows)
            model = self._build()
            self._resume()
            self._announce(model)
        except BaseException:
            self.status.close()  # a terminal's status line goes before the error's line
            raise

    def _check_inputs(self, ds_config_path: str) -> None:
        """What each rank can check alone, before the process group (whose start may first build DeepSpeed's
        CPU communication op, ~40 s): a mistyped path or reward fails in seconds, on every rank alike. GPUs
        that torch cannot use first: that refusal explains the rest (init_distributed checks again)."""
        cfg = self.cfg
        self.status.phase("input checks")
        cuda_check.check_rank()
        check_source(cfg.data.train_file, "data.train_file", cfg.data)
        if cfg.eval.file:
            check_source(cfg.eval.file, "eval.file", cfg.data, cfg.eval.revision)
        check_reward_specs(cfg.rewards)
        check_init_adapter(cfg.lora)
        self.ds_config_raw = read_ds_config(ds_config_path)
        check_local_model(cfg.model.path, cfg.model.revision)

    def _open_run(self) -> Path | None:
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
        self.out, resume_path = storage.open_output_dir(self.cfg.output_dir, self.cfg.resume_from, self.rank)
        return resume_path

    def _read_inputs(self, ds_config_path: str) -> list:
        """Prompts (train and eval), the model's files, sampling / dtype / attention, the processor, every
        prompt's token ids, the filled DeepSpeed config: all read, and checked, before any model loads.
        Inputs are checked on every rank alike (each raises the same error, none waits in a collective for
        the others). The training rows."""
        cfg = self.cfg
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
        )
        ev = cfg.eval
        eval_rows = load_prompts(ev.file, "eval.file", cfg.data, ev.split, ev.revision, **at) if ev.file else None
        self.evaluator = Evaluator(cfg, eval_rows, self.rank, self.world, self.device) if eval_rows else None
        check_reward_inputs(cfg.rewards, rows, "data.train_file", cfg.data.train_file)
        if eval_rows:
            check_reward_inputs(cfg.rewards, eval_rows, "eval.file", cfg.eval.file)
        # after the cheap checks: a Hub id may download (rank 0, if the environment allows; the others wait)
        self.status.phase("model files")
        self.model_source = resolve_for_training(cfg.model.path, cfg.model.revision, self.rank)
        # unset sampling knobs = what the model samples with by itself (recorded in config.json)
        cfg.grpo.sampling = resolve_sampling(cfg.grpo.sampling, self.model_source.path)
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
        hidden = read_ar_config(self.model_source.path)["text_config"]["hidden_size"]
        self.ds_config = fill_ds_config(self.ds_config_raw, cfg, self.world, hidden, self.dtype, ds_config_path)
        return rows

    def _start_run(self, resume_path: Path | None, rows: list) -> None:
        """Resume or start fresh (lifecycle/run.py decides, before any model loads), then the run's log file,
        rank 0's background worker and the model cards' publisher (hub.repo_id checked now)."""
        self.data_fingerprint = resume.data_fingerprint(self.cfg.data.train_file, rows)
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

    def _build(self):
        """Rewards, the policy (and the reference), the DeepSpeed engines, the decoder, the memory plan, the
        experience maker. The policy model (before DeepSpeed)."""
        cfg = self.cfg
        self.status.phase("rewards")
        self.reward_fn = build_rewards(cfg.rewards)
        # Same seed on every rank: model construction (LoRA init) must be identical everywhere;
        # sampling streams are derived per (step, rank) below.
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
        self.status.phase("decoder")
        decoder = ImageDecoder(self.model_source.path, cfg.decoder, self.device)
        if self.evaluator is not None and self.evaluator.decode != decoder.training:
            log.info(
                f"glm-grpo: training rewards decode with {decoder.training.describe()} (decoder.*), evaluation with "
                f"{self.evaluator.decode.describe()} (eval.*)"
            )
        # the memory plan of this very run (rank 0 prints it); rollout.merge_copy=auto takes its placement, on
        # every rank, before the first rollout copies the base weights (the evaluator reads the same cfg)
        self.memory_plan = None
        if self.is_main or (cfg.rollout.merge_lora and cfg.rollout.merge_copy == "auto"):
            self.memory_plan = startup_plan(cfg, self.ds_config_raw, self.world, self.device)
            resolve_merge_copy(cfg, self.memory_plan)
        # training's sampler computes the reference / old log-probs inside the rollout's gather (under ZeRO-3 they
        # then gather nothing more); the evaluation's samples only
        before = partial(logprobs_before_update, cfg=cfg) if cfg.logprobs_in_rollout else None
        sampler = EngineSampler(self.engine, self.processor, cfg, self.device, before_update=before)
        self.experience = ExperienceMaker(sampler, decoder, self.reward_fn, cfg, self.device, self.status)
        eval_sampler = EngineSampler(self.engine, self.processor, cfg, self.device)
        self.eval_experience = ExperienceMaker(eval_sampler, decoder, self.reward_fn, cfg, self.device, self.status)
        return model

    def _resume(self) -> None:
        """The checkpoint's weights, optimizer, RNG and data position when resuming (collective), then the
        trackers (a resumed run continues its tracker runs)."""
        self.life.tidy()
        dist.barrier()
        if self.life.start.checkpoint is not None:
            self.status.phase("checkpoint")
        self.start_step, self.skipped_steps = self.life.restore(self.engine, self.prompt_order)
        self.monitor = self._monitor()
        self.consecutive_skips = 0  # optimizer updates skipped in a row (non-finite gradients, undefined rewards)
        self.status.phase("trackers")
        resumed = self.life.start.checkpoint is not None
        self.tracker = build_tracker(self.cfg, self.is_main, resume_step=self.start_step if resumed else None)
        self.status.idle()  # the startup summary follows

    def _monitor(self) -> Monitor:
        """The alarms (monitor.alarms) on the evaluations when the run evaluates, else on the training steps; a
        resumed run's start is the first record of that file."""
        evals = self.evaluator is not None
        metrics_file = self.out / ("eval.jsonl" if evals else "metrics.jsonl")
        start = first_record(metrics_file) if self.start_step > 0 else None
        return Monitor(parse_rules(self.cfg.monitor.alarms), "eval/images/" if evals else "images/", start)

    def _alarms(self, record: dict) -> None:
        """The monitor's check of ``record`` (rank 0 prints a line per new alarm); its fields join the record."""
        fields, lines = self.monitor.check(record)
        record.update(fields)
        for line in lines:
            log.warning(line)

    def _announce(self, model) -> None:
        """Rank 0: ``config.json`` (the config, the model source, the DeepSpeed config, the data, the versions)
        and the startup summary with the memory plan."""
        if not self.is_main:
            return
        previous = self.out / "config.json"
        previous = json.loads(previous.read_text()) if previous.is_file() and self.start_step else None
        record = {
            "train": to_dict(self.cfg),
            # the history: from which step which settings changed (resumes with other settings; lifecycle/resume.py)
            "segments": resume.segments(previous, self.start_step, self.life.start.changes),
            "model_source": self.model_source.record(),
            "deepspeed": self.ds_config,
            "data": self.data_fingerprint,  # what the cards name: the source and its number of prompts
            "versions": framework_versions(),
        }
        (self.out / "config.json").write_text(json.dumps(record, indent=2))
        print_startup_summary(
            self.cfg, model, self.ds_config, self.world, self.device, self.dtype, self.attn, self.out, self.memory_plan
        )
        log.info(f"          model: {self.model_source.describe()}")

    # ------------------------------------------------------------------ one step
    def step(self, index: int) -> dict:
        """GRPO step ``index`` (0-based; collective): experience -> global advantages -> update -> record."""
        cfg, grpo_cfg = self.cfg, self.cfg.grpo
        generator = torch.Generator(device=self.device).manual_seed(derive_seed(cfg.seed, "rollout", index, self.rank))
        exp = self.experience.collect(self.prompt_order.next(), [generator], partial(decoder_seed, cfg.decoder, index))
        # Advantages over the global batch (identical on every rank), then this rank's share.
        all_per_reward = {label: dist.all_gather(values) for label, values in exp.per_reward.items()}
        advantages, all_rewards = combine_advantages(
            all_per_reward,
            self.reward_fn.weights,
            grpo_cfg.group_size,
            grpo_cfg.reward_combination,
            grpo_cfg.advantage_estimator,
            tie=grpo_cfg.rank_tie_tolerance,
        )
        # several rewards: where they disagree (logged), optionally gated out of the advantages
        disagreement = reward_disagreement(all_per_reward, grpo_cfg.group_size)
        advantages = gate_disagreeing(advantages, disagreement, grpo_cfg.disagreement_gate)
        # groups whose rewards are all equal teach nothing: counted every step, and their prompts may be skipped
        dead = signal_free_groups(all_per_reward, grpo_cfg.group_size)
        self.prompt_order.observe(dead.tolist())
        mine = slice(self.rank * len(exp.batch), (self.rank + 1) * len(exp.batch))
        with measure(exp.timings, exp.peaks, "update", self.device):
            if torch.isnan(all_rewards).all():  # the same global batch on every rank: all agree
                stats = self._skip_undefined(index + 1, all_per_reward)
            else:
                stats = grpo_update(
                    self.engine,
                    exp.batch,
                    advantages[mine],
                    cfg,
                    self.ref_engine,
                    ref_logps=exp.ref_logps,
                    old_logps=exp.old_logps,
                    status=self.status,
                )
        record = self._record(index + 1, exp, stats, all_rewards[mine], all_rewards, all_per_reward, dead)
        record.update(disagreement_fields(disagreement, grpo_cfg.disagreement_gate))
        return record

    def _skip_undefined(self, step: int, all_per_reward: dict) -> dict:
        """A step whose rewards are all undefined has nothing to learn from: skip its update like a
        non-finite one (an optimizer step on zero advantages would still move the weights through
        Adam's momentum and weight decay), so ``max_consecutive_skips`` such steps stop the run."""
        log.warning_once(
            "rewards-all-undefined",
            f"glm-grpo: warning: step {step}: every reward is undefined (NaN) for every sample "
            f"({', '.join(all_per_reward)}); the update is skipped (counted in `skipped` in metrics.jsonl) and "
            f"{self.cfg.max_consecutive_skips or 'no'} such steps in a row stop the run; check the rewards and the "
            "fields they need; further ones are not logged",
        )
        return UpdateStats.not_run(self.cfg.grpo.num_iterations)

    def _record(self, step: int, exp, stats: dict, my_rewards, all_rewards, all_per_reward, dead) -> dict:
        """The ``metrics.jsonl`` record after ``step`` steps (collective), and the training gallery when due."""
        facts = StepFacts(
            dead_groups=dead,
            prompts_skipped=self.prompt_order.last_skipped,
            dead_prompts=len(self.prompt_order.dead) if self.cfg.data.dead_prompt_skip_prob > 0 else None,
            skipped_before=self.skipped_steps,
            lr=ds_engine.current_lr(self.engine),
            grad_norm=ds_engine.grad_norm(self.engine) if stats["tokens"] else None,  # 0 tokens: no update ran
            before_load_mb=self.before_load_mb,
        )
        tokens = exp.batch.completion_ids.numel() * self.world
        record = step_record(
            step, stats, all_rewards, all_per_reward, dict(self.reward_fn.failed), exp.timings, exp.peaks, tokens,
            self.cfg.grpo.num_iterations, self.device, facts,
        )  # fmt: skip
        self.skipped_steps = record["skipped_steps"]
        distance = self.reward_fn.pair_distance()
        record.update(image_record(exp.images, self.cfg.grpo.group_size, self.cfg.monitor.statistics, None, distance))
        if self.evaluator is None:
            self._alarms(record)
        if self.cfg.logging.gallery_steps and step % self.cfg.logging.gallery_steps == 0:
            record.update(self._training_gallery(step, exp, my_rewards))
        return record

    def _training_gallery(self, step: int, exp, rewards: torch.Tensor) -> dict:
        """``samples/step_N.png`` from every rank's groups (collective); the record's gallery fields."""
        fields: dict = {}
        with timer(fields, "time/gallery"):
            path = gallery_to_main(
                self.out / "samples" / f"step_{step:06d}.png",
                exp.images,
                rewards,
                torch.tensor([r.index for r in exp.rows]),
                self.prompt_order.rows,
                self.cfg.grpo.group_size,
                self.cfg.logging,
                self.world,
            )
        if path is not None:
            fields["gallery"] = str(path.relative_to(self.out))
        return fields

    # ------------------------------------------------------------------ loop
    def train(self) -> None:
        lg = self.cfg.logging
        progress = Progress(
            self.cfg.max_steps, self.start_step, self.is_main and lg.progress_bar, lg.log_every, status=self.status
        )
        self._current_step, self._finishing = self.start_step + 1, False
        self._step_started, self._last_step_seconds = time.monotonic(), None
        with StopSignals(self._stop_notice if self.is_main else None) as signals:
            try:
                if self.evaluator is not None and self.cfg.eval.at_start and self.start_step == 0:
                    self.evaluate(0)
                for step in range(self.start_step, self.cfg.max_steps):
                    self._current_step, self._step_started = step + 1, time.monotonic()
                    self.status.begin(f"step {step + 1}/{self.cfg.max_steps}")
                    record = self.step(step)
                    self.consecutive_skips = self.consecutive_skips + 1 if record["skipped"] else 0
                    progress.update(record)
                    if self.evaluator is not None and self.evaluator.due(step + 1):
                        # the alarms it checked join the step's record too: metrics.jsonl holds them
                        record.update(self.evaluate(step + 1))
                    self.log_step(record)
                    saved = None
                    if self.cfg.save_steps and (step + 1) % self.cfg.save_steps == 0:
                        saved = self.save_checkpoint(step + 1)
                    save = partial(self.save_checkpoint, step + 1)
                    alarm = bool(self.monitor.holding)  # acted on with monitor.stop_on_alarm only
                    self.life.stop_if_asked(step + 1, signals.received, self.consecutive_skips, saved, save, alarm)
                    self._last_step_seconds = time.monotonic() - self._step_started
            finally:
                progress.close()
                self.status.close()
                self.tracker.close()
            self._finishing = True
            if self.is_main and lg.plot:  # before save_final: the model card shows it
                plot_training(self.out / "metrics.jsonl", self.out / PLOT_NAME, self.out / "eval.jsonl")
            self.life.save_final(self.engine)
        final = self.life.final_dir
        log.info(f"done: metrics {self.out / 'metrics.jsonl'}")
        if lg.plot:
            log.info(f"      training curves {self.out / PLOT_NAME}")
        evals = eval_summary(self.out / "eval.jsonl")
        if evals is not None:
            log.info(f"      evaluations {self.out / 'eval.jsonl'}: {evals}")
            log.info(f"      samples {self.out / 'samples'}/ (eval_step_*.png: the held-out prompts, fixed seeds)")
        log.info(f"      {final.name.replace('_', ' ')} {final}")
        self.fired = self._alarm_summary()

    def _alarm_summary(self) -> list[dict]:
        """Rank 0: the alarms that fired in the whole run (its records on disk, before any resume too), one line
        each in the closing lines; the same list decides the exit status with monitor.fail_on_alarm."""
        if not self.is_main:
            return []
        alarms = fired_alarms(self.out)
        if alarms is None or not alarms["fired"]:
            return []
        log.warning(
            f"      alarms that fired ({len(alarms['fired'])}; {Path(alarms['file']).name}): look at the samples "
            "(samples/) before trusting the reward or the adapter"
        )
        for alarm in alarms["fired"]:
            log.warning(f"        {describe(alarm)}")
        return alarms["fired"]

    def exit_status(self) -> int:
        """Rank 0's status for a run that finished and saved everything: :data:`EXIT_ALARMS_FIRED`, with its line,
        when alarms fired and monitor.fail_on_alarm is set, else 0."""
        if not alarm_failure(self.fired, self.cfg.monitor.fail_on_alarm):
            return 0
        log.fatal(
            f"glm-grpo train: training finished and everything is saved in {self.out}, but {len(self.fired)} "
            f"alarm(s) fired ({', '.join(a['rule'] for a in self.fired)}; listed above) and monitor.fail_on_alarm "
            f"is true: exit {EXIT_ALARMS_FIRED}"
        )
        return EXIT_ALARMS_FIRED

    def _stop_notice(self, signum: int) -> str:
        """What rank 0 prints the moment SIGINT / SIGTERM arrives (from the signal watcher thread, so
        it only reads what the loop last wrote)."""
        again = "press Ctrl-C again to abort at once (the last complete checkpoint stays intact)"
        if self._finishing:
            return f"glm-grpo train: {signal_name(signum)} received: saving the final weights, then done; {again}"
        when = ""
        if self._last_step_seconds is not None:
            left = max(0.0, self._last_step_seconds - (time.monotonic() - self._step_started))
            when = f" (in about {left:.0f} s at the last step's pace, plus the save)"
        return (
            f"glm-grpo train: {signal_name(signum)} received: the run will save a checkpoint and stop after step "
            f"{self._current_step}{when}; {again}"
        )

    def log_step(self, record: dict) -> None:
        self.tracker.log("train", record)
        if record.get("gallery"):
            self.tracker.log_image("samples", self.out / record["gallery"], record["step"])

    def evaluate(self, step: int) -> dict:
        """Fixed-seed evaluation after ``step`` training steps (collective: every rank calls it); the alarm fields
        the monitor set on its record (rank 0; ``{}`` elsewhere)."""
        self.status.begin(f"eval at step {step}")
        record, gallery = self.evaluator.run(step, self.eval_experience, self.out, self.is_main)
        self.status.idle()
        alarms = {}
        if record is not None:
            log.info(eval_line(record, self.cfg.eval.group_size))
            self._alarms(record)
            alarms = {k: v for k, v in record.items() if k.startswith("alarm/")}
            self.tracker.log("eval", record)
        if gallery is not None:
            self.tracker.log_image("eval/samples", gallery, step)
        return alarms

    def save_checkpoint(self, step: int) -> Path:
        """Checkpoint ``step`` (collective; lifecycle/run.py)."""
        return self.life.save_checkpoint(self.engine, self.prompt_order, step, self.skipped_steps)


# Bad inputs: reported as one line per problem (exit 2), with a traceback only under --debug.
INPUT_ERRORS = (
    ConfigError,
    DataError,
    DeepSpeedConfigError,
    checkpoint.CheckpointError,
    checkpoint.OutputDirError,
    RewardError,
    FileNotFoundError,
    CudaUnusable,
)


def main(argv: list[str] | None = None) -> int:
    args = parse_train_args(sys.argv[1:] if argv is None else argv)
    run_log.setup(args.log_level, log.env_rank())  # our lines on the console, library output to the run's log
    try:
        cfg = load_config(args.config, args.overrides)
        with startup_signals():
            trainer = Trainer(cfg, args.deepspeed)
        trainer.train()
        run_log.finish()
    except resume.NothingToDo as done:  # resume_from on a finished run
        log.info(str(done))
        dist.shutdown(agreed=False)
        return 0
    except Interrupted as stop:  # Ctrl-C / SIGTERM while loading: one line, not a traceback
        log.fatal(
            f"glm-grpo train: interrupted by {signal_name(stop.signum)} during startup, before the first step; "
            "nothing was saved (checkpoints already in output_dir are untouched)"
        )
        dist.shutdown(agreed=False)
        return exit_code(stop.signum)
    except KeyboardInterrupt:  # the instants between startup_signals and StopSignals
        log.fatal("glm-grpo train: interrupted by SIGINT; the last complete checkpoint (checkpoints/latest) is intact")
        dist.shutdown(agreed=False)
        return exit_code(signal.SIGINT)
    except Stopped as stop:  # every rank agreed to stop (preemption / non-finite steps)
        log.fatal(str(stop))
        # rank 0's pending upload / pruning of that checkpoint, before the others exit (once they have, the
        # launcher would terminate rank 0); they wait in shutdown's barrier
        trainer.publisher.wait()
        dist.shutdown()
        return stop.exit_code
    except INPUT_ERRORS as err:
        if args.debug:
            raise
        lines = str(err).splitlines() or [type(err).__name__]
        log.fatal("glm-grpo train: " + ("\n  ".join(lines) if len(lines) > 1 else lines[0]))
        dist.shutdown(agreed=False)
        return 2
    dist.shutdown()
    # rank 0 uploads now, no peer waiting on it: 0, or 4 if an upload failed (its line says how to retry; it comes
    # before the alarms' 6, whose lines are printed above either way)
    return trainer.publisher.finish() or trainer.exit_status()


if __name__ == "__main__":
    raise SystemExit(process_exit.exit_now(main()))
