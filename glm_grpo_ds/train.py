"""GRPO training of the GLM-Image AR policy with DeepSpeed.

    deepspeed --num_gpus 8 --module glm_grpo_ds.train --config launch/configs/glm_image_lora.yaml \
        --deepspeed ds_configs/zero2.json [key=value ...]
    python -m glm_grpo_ds.train --check --config ... --deepspeed ... --num-gpus 8   # checked, not run (preflight.py)
    python -m glm_grpo_ds.train --config launch/configs/tiny_cpu.yaml --deepspeed ds_configs/zero2.json   # one process

One step: each rank samples G token grids for its prompts (rollout) -> the frozen DiT renders them (decode) ->
rewards score the images -> group-relative advantages over the global batch -> for each micro-batch backward ->
optimizer step (``grpo.num_iterations`` x ``batch.mini_batches`` times; update.py). Outputs in ``output_dir``:
``metrics.jsonl``, ``config.json``, ``reward_curve.png``, ``final_adapter/`` (LoRA) or ``final_model/`` (full
fine-tuning) with its model card, uploaded with ``hub.repo_id`` (sharing/hub.py); with ``eval.file`` ``eval.jsonl``,
``samples/`` galleries (``logging.gallery_steps``, evals), ``samples.jsonl`` (``logging.sample_records``); trackers
(``logging.report_to``).

Exit status: 0 done; 2 bad input (config, data, ds_config, model path, output_dir, checkpoint, reward name or a
reward's missing sample field: one line on stderr, ``--debug`` for the traceback); 3 stopped after
``max_consecutive_skips`` steps skipped in a row for a non-finite loss / gradient or rewards undefined for every
sample (checkpoint saved); 128 + signal when preempted by SIGTERM (143) or SIGINT (130) (checkpoint saved, resume
with ``resume_from=latest``), or interrupted during startup, or aborted by a second Ctrl-C (no new checkpoint; one
line each, see lifecycle/preempt.py); 4 trained and saved, but an upload to the Hub failed (``glm-grpo push
OUTPUT_DIR`` retries it); 5 stopped by an alarm on the image statistics with ``monitor.stop_on_alarm`` (checkpoint
saved; monitoring/alarms.py); 6 trained and saved (final weights, logs, uploads), but an alarm fired during the run
and ``monitor.fail_on_alarm`` is true (4 comes first when an upload failed too). The alarms that fired are listed in
the closing lines.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from functools import partial
from pathlib import Path

import torch

from . import preflight
from .config import load_config
from .config.arguments import parse_train_args
from .ds import dist
from .ds import engine as ds_engine
from .evaluation.in_training import eval_line, eval_summary, gallery_to_main
from .experience.step_advantages import step_advantages
from .lifecycle import resume
from .lifecycle.preempt import Interrupted, Stopped, StopSignals, exit_code, signal_name, startup_signals
from .memory import oom
from .model.source import RANDOM_NOTE
from .monitoring.alarms import EXIT_ALARMS_FIRED, alarm_failure
from .observability import stuck
from .observability.closing import warn_at_the_end
from .observability.metrics import (
    Progress,
    StepFacts,
    advantage_fields,
    disagreement_fields,
    image_record,
    measure,
    step_record,
    timer,
)
from .observability.plot import PLOT_NAME, plot_training_or_warn
from .observability.sample_records import record_samples
from .observability.update_stats import UpdateStats
from .runtime import log, process_exit, run_log
from .runtime.oom import out_of_memory
from .runtime.seeding import decoder_seed
from .startup import INPUT_ERRORS, Run, build_run
from .update import grpo_update


class Trainer:
    """One GRPO step (:meth:`step`) and the loop of steps (:meth:`train`) with its evaluations, checkpoints and
    stops, on a :class:`glm_grpo_ds.startup.Run` (``build_run``: check inputs, open the run, read the inputs, build,
    resume, announce). The run's life on disk (start, checkpoints, final weights, stops) is ``run.life``
    (glm_grpo_ds/lifecycle/run.py); where each step's rollout comes from, ``run.rollout``
    (glm_grpo_ds/experience/off_policy.py)."""

    def __init__(self, run: Run):
        self.run = run
        self.skipped_steps = run.skipped_steps  # optimizer updates skipped so far (non-finite, undefined rewards)
        self.consecutive_skips = 0  # ... in a row: max_consecutive_skips stops the run
        self.fired: list[dict] = []  # the alarms that fired in the whole run (rank 0; train's closing lines)
        # what the signal watcher thread reads to say when the run will stop (_stop_notice)
        self._current_step, self._finishing = run.start_step + 1, False
        self._step_started, self._last_step_seconds = time.monotonic(), None
        self._evaluated: tuple[int, float | None] | None = None  # rank 0: the last evaluation's (step, reward)

    @classmethod
    def from_config(cls, cfg, ds_config_path: str) -> Trainer:
        """The trainer of ``cfg`` (collective: builds the run, glm_grpo_ds/startup.py)."""
        return cls(build_run(cfg, ds_config_path))

    def _alarms(self, record: dict) -> None:
        """The monitor's check of ``record`` (rank 0 prints a line per new alarm); its fields join the record."""
        fields, lines = self.run.monitor.check(record)
        record.update(fields)
        for line in lines:
            log.warning(line)

    # ------------------------------------------------------------------ one step
    def step(self, index: int) -> dict:
        """GRPO step ``index`` (0-based; collective): experience -> global advantages -> update -> record."""
        run = self.run
        cfg, grpo_cfg = run.cfg, run.cfg.grpo
        drawn = run.rollout.next(index)  # sampled now, or drawn during the previous step (one step off)
        exp = run.experience.finish(drawn, partial(decoder_seed, cfg.decoder, index))
        # Advantages over the global batch (identical on every rank), then this rank's share.
        run.step_status.phase("advantages")  # its gathers, where a rank waits for one still scoring: not the reward's
        got = step_advantages(exp, run.reward_fn, grpo_cfg)
        advantages, all_rewards, all_per_reward = got.advantages, got.all_rewards, got.all_per_reward
        # groups whose advantages are all 0 teach nothing: counted every step, and their prompts may be skipped
        run.prompt_order.observe([None if u else d for d, u in zip(got.dead.tolist(), got.unknown.tolist())])
        mine = slice(run.rank * len(exp.batch), (run.rank + 1) * len(exp.batch))
        run.rollout.before_update(exp.timings, run.step_status)  # one step off: the next rollout reads these weights
        lr = ds_engine.current_lr(run.engine)  # the rate this update runs at: its optimizer step moves the schedule
        with measure(exp.timings, exp.peaks, "update", run.device):
            if torch.isnan(all_rewards).all():  # the same global batch on every rank: all agree
                stats = self._skip_undefined(index + 1, all_per_reward)
            else:
                stats = grpo_update(
                    run.engine,
                    exp.batch,
                    advantages[mine],
                    cfg,
                    run.ref_engine,
                    ref_logps=exp.ref_logps,
                    old_logps=exp.old_logps,
                    status=run.step_status,
                    loss=run.loss,
                    entropy_control=run.entropy_control,
                    reference=run.reference,
                )
        if run.reference is not None and (index + 1) % grpo_cfg.ref_sync_steps == 0:  # grpo.ref_sync_steps:
            run.step_status.phase("reference reset")  # the KL's reference reset to the updated policy (its own phase:
            with measure(exp.timings, exp.peaks, "reference_reset", run.device):  # a full model's mix takes time)
                run.reference.reset(index + 1)
        if run.ema is not None:  # lora.ema_decay: the adapter's moving average takes the updated weights
            run.ema.update()
        run.step_status.phase("record")  # the weights to the samplers, the step's statistics (collectives), its line
        for maker in (run.experience, run.eval_experience):  # the sampling backends take the updated weights
            maker.sampler.sync_weights(index + 1)
        measured_dead = got.dead[~got.unknown]  # frac_reward_zero_std's: over the groups every reward measured
        record = self._record(index + 1, exp, stats, all_rewards[mine], all_rewards, all_per_reward, measured_dead, lr)
        record.update(disagreement_fields(got.disagreement, grpo_cfg.disagreement_gate))
        record.update(advantage_fields(advantages))  # the global batch's, as the update uses them (after the gate)
        record.update(got.fields)  # grpo.diversity_features: the shaping's distances and multipliers
        if run.cfg.logging.sample_records and (index + 1) % run.cfg.logging.sample_records == 0:  # samples.jsonl
            g = grpo_cfg.group_size
            record_samples(
                run.tracker, index + 1, exp.rows, run.prompt_order.rows, all_per_reward, all_rewards, advantages, g
            )
        record.update(run.rollout.record())
        return record

    def _skip_undefined(self, step: int, all_per_reward: dict) -> dict:
        """A step whose rewards are all undefined has nothing to learn from: skip its update like a
        non-finite one (an optimizer step on zero advantages would still move the weights through
        Adam's momentum and weight decay), so ``max_consecutive_skips`` such steps stop the run."""
        run = self.run
        log.warning_once(
            "rewards-all-undefined",
            f"glm-grpo: warning: step {step}: every trained reward is undefined (NaN) for every sample "
            f"({', '.join(all_per_reward)}); the update is skipped (counted in `skipped` in metrics.jsonl) and "
            f"{run.cfg.max_consecutive_skips or 'no'} such steps in a row stop the run; check the rewards and the "
            "fields they need; further ones are not logged",
        )
        return UpdateStats.not_run(run.cfg.updates_per_step)

    def _record(self, step: int, exp, stats: dict, my_rewards, all_rewards, all_per_reward, dead, lr) -> dict:
        """The ``metrics.jsonl`` record after ``step`` steps (collective), and the training gallery when due; ``lr``:
        the learning rate the step's (first) optimizer step ran at, read before it (HF Trainer's, not the next)."""
        run = self.run
        facts = StepFacts(
            dead_groups=dead,
            prompts_skipped=run.prompt_order.last_skipped,
            dead_prompts=len(run.prompt_order.dead) if run.cfg.data.dead_prompt_skip_prob > 0 else None,
            skipped_before=self.skipped_steps,
            lr=lr,
            grad_norm=ds_engine.grad_norm(run.engine) if stats["tokens"] else None,  # 0 tokens: no update ran
            before_load_mb=run.before_load_mb,
        )
        tokens = exp.batch.completion_ids.numel() * run.world
        record = step_record(
            step, stats, all_rewards, all_per_reward, dict(run.reward_fn.failed), exp.timings, exp.peaks, tokens,
            run.cfg.grpo.num_iterations, run.device, facts,
        )  # fmt: skip
        self.skipped_steps = record["skipped_steps"]
        distance = run.reward_fn.pair_distance()
        record.update(image_record(exp.images, run.cfg.grpo.group_size, run.cfg.monitor.statistics, None, distance))
        if run.evaluator is None:
            self._alarms(record)
        if run.cfg.logging.gallery_steps and step % run.cfg.logging.gallery_steps == 0:
            record.update(self._training_gallery(step, exp, my_rewards))
        return record

    def _training_gallery(self, step: int, exp, rewards: torch.Tensor) -> dict:
        """``samples/step_N.png`` from every rank's groups (collective); the record's gallery fields."""
        run = self.run
        fields: dict = {}
        with timer(fields, "time/gallery"):
            path = gallery_to_main(
                run.out / "samples" / f"step_{step:06d}.png", exp.images, rewards,
                torch.tensor([r.index for r in exp.rows]), run.prompt_order.rows, run.cfg.grpo.group_size,
                run.cfg.logging, run.world,
            )  # fmt: skip
        if path is not None:
            fields["gallery"] = str(path.relative_to(run.out))
        return fields

    # ------------------------------------------------------------------ loop
    def train(self) -> None:
        run = self.run
        lg = run.cfg.logging
        progress = Progress(
            run.cfg.max_steps, run.start_step, run.is_main and lg.progress_bar, lg.log_every, status=run.status
        )
        with StopSignals(self._stop_notice if run.is_main else None) as signals, run.watchdog:
            try:
                run.watchdog.begin(run.start_step)
                if run.evaluator is not None and run.cfg.eval.at_start and run.start_step == 0:
                    self.evaluate(0)
                for step in range(run.start_step, run.cfg.max_steps):
                    self._current_step, self._step_started = step + 1, time.monotonic()
                    run.status.begin(f"step {step + 1}/{run.cfg.max_steps}")
                    run.watchdog.begin(step + 1)
                    record = self.step(step)
                    self.consecutive_skips = self.consecutive_skips + 1 if record["skipped"] else 0
                    progress.update(record)
                    if run.evaluator is not None and run.evaluator.due(step + 1):
                        # the alarms it checked join the step's record too: metrics.jsonl holds them
                        record.update(self.evaluate(step + 1))
                    self.log_step(record)
                    saved = None
                    if run.cfg.save_steps and (step + 1) % run.cfg.save_steps == 0:
                        saved = self.save_checkpoint(step + 1)
                    save = partial(self.save_checkpoint, step + 1)
                    alarm = bool(run.monitor.holding)  # acted on with monitor.stop_on_alarm only
                    run.watchdog.phase("stop check")  # the ranks agree whether to stop (a collective)
                    run.life.stop_if_asked(step + 1, signals.received, self.consecutive_skips, saved, save, alarm)
                    self._last_step_seconds = time.monotonic() - self._step_started
            finally:
                run.rollout.close()
                progress.close()
                run.status.close()
                run.tracker.close()
            run.watchdog.phase("final save")
            self._finishing = True
            if run.is_main and lg.plot:  # before save_final: the model card shows it
                plot_training_or_warn(run.out)
            run.life.save_final(run.engine, max(run.start_step, run.cfg.max_steps), run.ema)
        final = run.life.final_dir
        log.info(f"done: metrics {run.out / 'metrics.jsonl'}")
        if lg.plot:
            log.info(f"      training curves {run.out / PLOT_NAME}")
        evals = eval_summary(run.out / "eval.jsonl")
        if evals is not None:
            log.info(f"      evaluations {run.out / 'eval.jsonl'}: {evals}")
            log.info(f"      samples {run.out / 'samples'}/ (eval_step_*.png: the held-out prompts, fixed seeds)")
        log.info(f"      {final.name.replace('_', ' ')} {final}")
        best = run.life.best  # save_best (lifecycle/best.py)
        if best.step is not None:
            log.info(f"      best checkpoint: step {best.step}, eval reward {best.value:.4f} (checkpoints/best)")
        if run.model_source.random_weights:  # glm_grpo_ds/model/random_weights.py
            log.info(f"      model {run.model_source.random_weights}: {RANDOM_NOTE}")
        self.fired = warn_at_the_end(run.out) if run.is_main else []  # alarms, failed rewards

    def exit_status(self) -> int:
        """Rank 0's status for a run that finished and saved everything: :data:`EXIT_ALARMS_FIRED`, with its line,
        when alarms fired and monitor.fail_on_alarm is set, else 0."""
        run = self.run
        if not alarm_failure(self.fired, run.cfg.monitor.fail_on_alarm):
            return 0
        log.fatal(
            f"glm-grpo train: training finished and everything is saved in {run.out}, but {len(self.fired)} "
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
        last = self._current_step >= self.run.cfg.max_steps  # the final weights come next, not a checkpoint
        then = "write its final weights and end" if last else "save a checkpoint and stop"
        return (
            f"glm-grpo train: {signal_name(signum)} received: the run will {then} after step {self._current_step}"
            f"{when}; {again}"
        )

    def log_step(self, record: dict) -> None:
        run = self.run
        run.tracker.log("train", record)
        if record.get("gallery"):
            run.tracker.log_image("samples", run.out / record["gallery"], record["step"])

    def evaluate(self, step: int) -> dict:
        """Fixed-seed evaluation after ``step`` training steps (collective: every rank calls it); the alarm fields
        the monitor set on its record (rank 0; ``{}`` elsewhere)."""
        run = self.run
        run.status.begin(f"eval at step {step}")
        with run.ema.in_adapters() if run.ema is not None else contextlib.nullcontext():  # lora.ema_decay's average
            record, gallery = run.evaluator.run(step, run.eval_experience, run.out, run.is_main)
        run.status.idle()
        run.watchdog.phase("eval record")  # its line, alarms and tracker logging: not held to its last phase's pace
        alarms = {}
        if record is not None:
            log.info(eval_line(record, run.cfg.eval.group_size))
            self._alarms(record)
            alarms = {k: v for k, v in record.items() if k.startswith("alarm/")}
            run.tracker.log("eval", record)
            self._evaluated = (step, record.get("eval/reward_mean"))  # save_best's (lifecycle/best.py)
        if gallery is not None:
            run.tracker.log_image("eval/samples", gallery, step)
        return alarms

    def save_checkpoint(self, step: int) -> Path:
        """Checkpoint ``step`` (collective; lifecycle/run.py)."""
        self.run.watchdog.phase("checkpoint save")
        run = self.run
        reward = self._evaluated[1] if self._evaluated and self._evaluated[0] == step else None  # rank 0's
        return run.life.save_checkpoint(
            run.engine, run.prompt_order, step, self.skipped_steps, run.rollout.state(), reward, run.entropy_control,
            run.reference, run.ema,
        )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_train_args(sys.argv[1:] if argv is None else argv)
    if args.check:  # the job checked, not run: no process group, no model (glm_grpo_ds/preflight.py)
        run_log.setup_tool(args.log_level)  # as the other tools: library warnings off the console
        return preflight.main(args)
    run_log.setup(args.log_level, log.env_rank())  # our lines on the console, library output to the run's log
    training = False  # an input error found mid-run (a prompt file changed, say) may be one rank's alone
    cfg = trainer = None
    try:
        cfg = load_config(args.config, args.overrides)
        with startup_signals():
            trainer = Trainer.from_config(cfg, args.deepspeed)
        training = True
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
        return trainer.run.life.end_stopped(stop)
    except INPUT_ERRORS as err:
        if args.debug:
            raise
        lines = str(err).splitlines() or [type(err).__name__]
        # before the process group, each node checked its own inputs: a node other than rank 0's may fail alone;
        # during training any rank may (its own copy of a file): each failing rank says so, named
        line = "glm-grpo train: " + ("\n  ".join(lines) if len(lines) > 1 else lines[0])
        log.fatal(line, node_alone=not dist.initialized(), every_rank=training)
        dist.shutdown(agreed=False)
        return getattr(err, "exit_code", 2)  # 2: bad input; a write that met a full disk: 7 (lifecycle/disk_space.py)
    except RuntimeError as err:  # out of GPU memory (or an error it caused); a collective that timed out, lost a peer
        step, ours = (None if trainer is None else trainer._current_step), cfg is not None and not args.debug
        starved = out_of_memory(err)
        if starved is not None and ours:  # one line: where, the plan, what plans less
            log.fatal(oom.train_line(starved, cfg, args.deepspeed, trainer and trainer.run, step), every_rank=True)
            dist.shutdown(agreed=False)
            return oom.EXIT_OOM
        code = stuck.end_collective(err, cfg, dist.world_size(), step) if ours else None  # whom the ranks waited for
        if code is not None:
            return code
        if dist.peer_lost(err):  # that rank's line and status are the run's
            time.sleep(dist.PEER_GRACE_S)  # the launcher ends this rank once it sees the failed one's exit
        raise
    dist.shutdown()
    # rank 0 uploads now, no peer waiting on it: 0, or 4 if an upload failed (its line says how to retry; it comes
    # before the alarms' 6, whose lines are printed above either way)
    return trainer.run.life.finish_uploads() or trainer.exit_status()


if __name__ == "__main__":
    raise SystemExit(process_exit.exit_now(main()))
