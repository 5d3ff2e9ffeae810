"""GRPO training of the GLM-Image AR policy with DeepSpeed.

    deepspeed --num_gpus 8 --module glm_grpo_ds.train --config configs/glm_image_lora.yaml \
        --deepspeed ds_configs/zero2.json [key=value ...]
    python -m glm_grpo_ds.train --check --config ... --deepspeed ... --num-gpus 8   # checked, not run (preflight.py)
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

import signal
import sys
import time
from functools import partial
from pathlib import Path

import torch

from . import preflight
from .advantages import combine_advantages, gate_disagreeing, reward_disagreement, signal_free_groups
from .config import load_config
from .config.arguments import parse_train_args
from .ds import dist
from .ds import engine as ds_engine
from .evaluation.in_training import eval_line, eval_summary, gallery_to_main
from .experience import drawn_state
from .lifecycle import resume
from .lifecycle.preempt import Interrupted, Stopped, StopSignals, exit_code, signal_name, startup_signals
from .model.source import RANDOM_NOTE
from .monitoring.alarms import EXIT_ALARMS_FIRED, alarm_failure, describe
from .observability.metrics import (
    Progress,
    StepFacts,
    advantage_fields,
    disagreement_fields,
    fired_alarms,
    image_record,
    measure,
    step_record,
    timer,
)
from .observability.plot import PLOT_NAME, plot_training
from .observability.update_stats import UpdateStats
from .runtime import log, process_exit, run_log
from .runtime.cuda_check import CudaUnusable
from .runtime.seeding import decoder_seed, rollout_seeds
from .startup import TrainerStartup
from .update import grpo_update


class Trainer(TrainerStartup):
    """One GRPO step (:meth:`step`) and the loop of steps (:meth:`train`) with its evaluations, checkpoints and
    stops; built by the entrance hall it inherits (glm_grpo_ds/startup.py: check inputs, open the run, read the
    inputs, build, resume, announce). The run's life on disk (start, checkpoints, final weights, stops) is
    ``self.life`` (glm_grpo_ds/lifecycle/run.py)."""

    def _alarms(self, record: dict) -> None:
        """The monitor's check of ``record`` (rank 0 prints a line per new alarm); its fields join the record."""
        fields, lines = self.monitor.check(record)
        record.update(fields)
        for line in lines:
            log.warning(line)

    # ------------------------------------------------------------------ one step
    def step(self, index: int) -> dict:
        """GRPO step ``index`` (0-based; collective): experience -> global advantages -> update -> record."""
        cfg, grpo_cfg = self.cfg, self.cfg.grpo
        drawn, overlapped = self._drawn(index)
        exp = self.experience.finish(drawn, partial(decoder_seed, cfg.decoder, index))
        # Advantages over the global batch (identical on every rank), then this rank's share.
        self.watchdog.phase("advantages")  # its gathers: where a rank waits for one still scoring
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
        if self.ahead is not None:  # the next rollout reads the weights the update writes
            self.watchdog.phase("rollout wait")
            exp.timings["rollout_wait"] = self.ahead.wait()
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
                    status=self.step_status,
                )
        self.watchdog.phase("record")  # the weights to the samplers, the step's statistics (collectives), its line
        for maker in (self.experience, self.eval_experience):  # the sampling backends take the updated weights
            maker.sampler.sync_weights(index + 1)
        record = self._record(index + 1, exp, stats, all_rewards[mine], all_rewards, all_per_reward, dead)
        record.update(disagreement_fields(disagreement, grpo_cfg.disagreement_gate))
        record.update(advantage_fields(advantages))  # the global batch's, as the update uses them (after the gate)
        if self.ahead is not None:  # whether time/rollout ran beside the previous step (not on this step's path)
            record["rollout_overlapped"] = overlapped
        return record

    def _drawn(self, index: int):
        """Step ``index``'s rollout and whether it was drawn ahead during the previous step
        (``rollout.one_step_off``), else sampled now; one step off, the next step's is then started on the weights
        as they are now."""
        drawn = self.ahead.take() if self.ahead is not None else None
        overlapped = drawn is not None
        if drawn is None:
            drawn = self.experience.draw(self.prompt_order.next(), self._rollout_seeds(index))
        # at the last step too: a checkpoint then holds the next rollout, so a resume with a larger max_steps
        # trains on what a longer uninterrupted run would (the extra rollout hides behind the decode)
        if self.ahead is not None:
            self.ahead.start(self.prompt_order.next(), self._rollout_seeds(index + 1))
        return drawn, overlapped

    def _rollout_seeds(self, index: int) -> list[int]:
        """The sampling's streams of step ``index`` on this rank (the same whichever step samples it)."""
        return rollout_seeds(self.cfg.seed, index, self.rank, self.cfg.batch.prompts_per_rank)

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
        with StopSignals(self._stop_notice if self.is_main else None) as signals, self.watchdog:
            try:
                self.watchdog.begin(self.start_step)
                if self.evaluator is not None and self.cfg.eval.at_start and self.start_step == 0:
                    self.evaluate(0)
                for step in range(self.start_step, self.cfg.max_steps):
                    self._current_step, self._step_started = step + 1, time.monotonic()
                    self.status.begin(f"step {step + 1}/{self.cfg.max_steps}")
                    self.watchdog.begin(step + 1)
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
                    self.watchdog.phase("stop check")  # the ranks agree whether to stop (a collective)
                    self.life.stop_if_asked(step + 1, signals.received, self.consecutive_skips, saved, save, alarm)
                    self._last_step_seconds = time.monotonic() - self._step_started
            finally:
                if self.ahead is not None:
                    self.ahead.close()
                progress.close()
                self.status.close()
                self.tracker.close()
            self.watchdog.phase("final save")
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
        if self.model_source.random_weights:  # glm_grpo_ds/model/random_weights.py
            log.info(f"      model {self.model_source.random_weights}: {RANDOM_NOTE}")
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
        self.watchdog.phase("checkpoint save")
        pending = None if self.ahead is None or self.ahead.pending is None else drawn_state(self.ahead.pending)
        return self.life.save_checkpoint(self.engine, self.prompt_order, step, self.skipped_steps, pending)


# Bad inputs: reported as one line per problem (exit 2), with a traceback only under --debug; GPUs that torch
# cannot use are one too, met by the ranks only.
INPUT_ERRORS = (*preflight.INPUT_ERRORS, CudaUnusable)


def main(argv: list[str] | None = None) -> int:
    args = parse_train_args(sys.argv[1:] if argv is None else argv)
    if args.check:  # the job checked, not run: no process group, no model (glm_grpo_ds/preflight.py)
        return preflight.main(args)
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
