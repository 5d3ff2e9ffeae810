"""A run's life on disk, owned in one place: where it starts (a fresh ``output_dir`` or a checkpoint,
decided once, before any model loads), its checkpoints, its final weights, and stopping when asked (a
signal on any rank, or too many skipped steps in a row). The trainer (glm_grpo_ds/train.py) holds one
:class:`RunLife`; the decision (:func:`decide_start`) is tested without DeepSpeed in
tests/unit/test_run_life.py, the rest by the training runs of tests/integration (resume, preemption).

    start = decide_start(out, resume_path, cfg, world, zero_stage, data_fingerprint, rank)
    life = RunLife(cfg, out, start, rank, world, zero_stage, data_fingerprint, publisher, later)
    life.tidy(); dist.barrier(); step, skipped = life.restore(engine, prompt_order)
    ... life.save_checkpoint(engine, prompt_order, step, skipped) ... life.stop_if_asked(...)
    ... life.save_final(engine, step)
"""

from __future__ import annotations

import shutil
import signal
import time
import uuid
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable

from ..config import TrainConfig, to_dict
from ..ds import dist, portable
from ..ds import io as ds_io
from ..runtime import log
from ..runtime.seeding import derive_seed
from . import checkpoint, resume
from .best import BestCheckpoint
from .disk_space import DiskRoom, room_to_convert
from .preempt import EXIT_ALARM, EXIT_NONFINITE, Stopped, exit_code, signal_name, terms_ignored

# How long the other ranks wait for rank 0 to convert a checkpoint for another world size or stage (ds/portable.py).
CONVERT_WAIT_S = 6 * 3600
UPLOAD_WAIT_S = 6 * 3600  # how long the other ranks of a stopped run wait for rank 0's checkpoint upload


@dataclass(frozen=True)
class Start:
    """Where a run starts: ``checkpoint`` None = a fresh run at step 0, else that checkpoint's step."""

    checkpoint: Path | None = None
    step: int = 0
    changes: dict = field(default_factory=dict)  # {key: [old, new]} against the checkpoint's config (resume.py)
    # (world size, ZeRO stage) the checkpoint was written on, when this launch's differ (None: the same): it is
    # carried over through a universal checkpoint (ds/portable.py)
    written_on: tuple[int, int] | None = None


def decide_start(out: Path, resume_path: Path | None, cfg, world: int, zero_stage: int, data: dict, rank: int) -> Start:
    """Resume or start fresh, before any model loads (every rank alike). Resuming: the checkpoint must fit
    this launch (CheckpointError), must not be finished already (:class:`resume.NothingToDo`: nothing is
    touched); a changed prompt source and changed settings are warnings. Fresh: ``output_dir`` must hold no earlier run,
    unless ``overwrite_output_dir`` (checkpoint.start_fresh)."""
    if resume_path is not None:
        state = checkpoint.check_compatible(resume_path, world, zero_stage)
        done = resume.finished(state, cfg.max_steps, out, follows_latest=cfg.resume_from in ("auto", "latest"))
        if done:  # before the run's log file, the models, config.json: nothing is touched
            raise resume.NothingToDo(done)
        if int(state["step"]) >= cfg.max_steps:
            log.info(
                f"glm-grpo: {resume_path} is the run's last step ({state['step']}) but its final weights were not "
                "written (stopped before, or killed while writing them): writing them now, no step is trained"
            )
        changed = resume.data_changed(state.get("data"), data)
        if changed:
            log.warning(f"glm-grpo: {changed}")
        changes = resume.config_changes(state.get("config"), to_dict(cfg), to_dict(TrainConfig()))
        refused = resume.other_run(out, resume_path, state)  # first: the other run's settings are no changes
        refused = refused or resume.refused_change(changes, resume_path, cfg.lora is not None)
        written_on = checkpoint.written_on(state)
        moved = written_on != (world, zero_stage)
        if moved:
            saved_per_rank = (state.get("config") or {}).get("batch", {}).get("prompts_per_rank")
            old = (written_on[0], int(saved_per_rank or cfg.batch.prompts_per_rank))
            new = (world, cfg.batch.prompts_per_rank)
            refused = refused or resume.batch_refusal(resume_path, old, new, cfg.allow_batch_change)
            refused = refused or _conversion_mismatch(resume_path)
            # the history records the new cluster shape as it records a changed setting
            for key, was, now in zip(("world_size", "zero_stage"), written_on, (world, zero_stage)):
                if was != now:
                    changes[key] = [was, now]
        if refused:
            raise checkpoint.CheckpointError(refused)
        if changes:
            log.warning(resume.changes_line(changes, int(state["step"])))
        return Start(resume_path, int(state["step"]), changes, written_on if moved else None)
    checkpoint.start_fresh(out, cfg.overwrite_output_dir, rank)
    if cfg.resume_from == "auto":
        log.info(f"glm-grpo: resume_from=auto: no checkpoint in {out}, starting fresh")
    return Start()


def _conversion_mismatch(path: Path) -> str | None:
    """The line refusing a checkpoint whose ``universal/`` folder (an earlier resume's conversion) was not made from
    its DeepSpeed files, before anything is written; None when it has none yet or a matching one."""
    try:
        portable.check_converted(path / portable.UNIVERSAL, path / ds_io.DS_TAG)
    except portable.ConversionError as err:
        return f"{err}; nothing was changed"
    return None


def _write_each(states: list, directory: Path, rank: int) -> None:
    """Every state in ``states`` (the reset reference, the adapter's average) writes itself into a checkpoint."""
    for state in states:
        state.write(directory, rank)


class RunLife:
    """The run's checkpoints, final weights and stops, from the start :func:`decide_start` chose.
    ``publisher`` writes each saved adapter's model card (and uploads: sharing/hub.py); ``later(name, job)``
    runs rank 0's pruning off the collective path (lifecycle/background.py)."""

    def __init__(
        self, cfg, out: Path, start: Start, rank: int, world: int, zero_stage: int, data: dict, publisher, later
    ):
        self.cfg, self.out, self.start, self.data = cfg, out, start, data
        self.rank, self.world, self.zero_stage = rank, world, zero_stage
        self.publisher, self.later = publisher, later
        # Names this run's checkpoints (pruning counts only those); a resumed run keeps its checkpoint's.
        # Only rank 0 writes trainer_state.json and prunes, so the ranks' ids need not agree.
        self.run_id: str | None = uuid.uuid4().hex
        # This launch and the step it started from: pruning leaves alone a branch it went back from (checkpoint.prune)
        self.launch = {"id": uuid.uuid4().hex, "from_step": start.step}
        # save_best: the best evaluated checkpoint so far, kept from pruning (a resume goes on with its best)
        self.best = BestCheckpoint(out, cfg.save_best, rank == 0, start.step if start.checkpoint else None)
        self.disk = DiskRoom(out, rank)  # room for each checkpoint and the final weights, checked first

    @property
    def final_dir(self) -> Path:
        return self.out / ("final_adapter" if self.cfg.lora is not None else "final_model")

    def tidy(self) -> None:
        """Rank 0, before the barrier that precedes the restore: interrupted saves removed, and ``latest`` naming the
        checkpoint this run goes on from (gone back to an earlier one of this output_dir, it named the branch left
        behind)."""
        if self.rank != 0:
            return
        checkpoint.remove_stale(self.out)
        if self.start.checkpoint is not None:
            self._latest_is_the_start()

    def _latest_is_the_start(self) -> None:
        """``latest`` names the start checkpoint when it is one of this output_dir's: a run killed before its first
        save, relaunched with resume_from=auto, went on with the steps it had gone back from."""
        start, pointer = self.start.checkpoint, self.out / checkpoint.CHECKPOINTS / checkpoint.LATEST
        if start.resolve().parent != pointer.parent.resolve() or not pointer.is_file():
            return
        named = pointer.read_text(encoding="utf-8").strip()
        if named != start.name:
            checkpoint.point_latest(self.out, start.name)
            log.info(
                f"glm-grpo: checkpoints/latest names {start.name} now (it named {named}, the steps this run goes back "
                "from): a relaunch with resume_from=auto continues this run"
            )

    def convert(self) -> None:
        """A checkpoint written on another world size or ZeRO stage (collective, before any model loads): rank 0
        converts its DeepSpeed state into the universal folder beside it (ds/portable.py), unless an earlier resume
        did; every rank waits, and raises CheckpointError when the conversion failed."""
        if self.start.written_on is None:
            return
        path = self.start.checkpoint
        ds_dir, universal = path / ds_io.DS_TAG, path / portable.UNIVERSAL
        failed = ""
        # the others wait on a group of their own: a conversion (minutes for a full fine-tuning's optimizer state)
        # may outlast dist_timeout_minutes, which is there to catch hangs, not rank 0's long work
        with dist.patient_group(CONVERT_WAIT_S) as any_rank:
            if self.rank == 0:
                try:
                    if not portable.check_converted(universal, ds_dir):
                        self._convert(ds_dir, universal)
                except portable.ConversionError as err:
                    failed = str(err)
            if any_rank(bool(failed)):
                raise checkpoint.CheckpointError(failed or f"rank 0 could not convert {path} (its log says why)")

    def _convert(self, ds_dir: Path, universal: Path) -> None:
        """Rank 0: the conversion, planned first (its disk: refused in one line when the file system lacks it)."""
        (world, stage), mib = self.start.written_on, 2**20
        size, kept, peak = room_to_convert(ds_dir, universal, self.cfg.optimizer.name != "adamw")
        log.info(
            f"glm-grpo: {ds_dir.parent.name} was written on {world} rank(s) at ZeRO-{stage}; this run has {self.world} "
            f"at ZeRO-{self.zero_stage}: converting its DeepSpeed state ({size / mib:,.1f} MiB) to a universal "
            f"checkpoint in {universal} (~{kept / mib:,.1f} MiB kept, ~{peak / mib:,.1f} MiB while converting; once: a "
            "later resume reuses it)"
        )
        started = time.perf_counter()
        portable.convert(ds_dir, universal)
        log.info(f"glm-grpo: converted in {time.perf_counter() - started:.1f} s")

    def restore(self, engine, prompt_order, entropy_control=None, reference=None, ema=None) -> tuple[int, int]:
        """Load the checkpoint chosen at the start into ``engine``, ``prompt_order``, ``entropy_control`` (the
        adaptive entropy coefficient, when the run has one and the checkpoint holds it) and ``reference`` (the KL's
        reset reference, model/reference.py) and ``ema`` (the adapter's average, model/ema.py) (collective): (the
        step it is at, the optimizer updates skipped so far); (0, 0) for a fresh run."""
        if self.start.checkpoint is None:
            return 0, 0
        path, cfg = self.start.checkpoint, self.cfg
        # on another cluster shape no rank's RNG file is this rank's: each starts from a seed of (step, rank)
        reseed = None if self.start.written_on is None else derive_seed(cfg.seed, "resume", self.start.step, self.rank)
        state, lr = checkpoint.load(engine, path, self.rank, cfg.optimizer, reseed)
        self.run_id = state.get("run_id")  # None for checkpoints written before run ids
        prompt_order.load_state(state["sampler"])  # the key checkpoints have always had
        if entropy_control is not None and state.get("entropy_control") is not None:  # else: from entropy_coef
            entropy_control.load_state(state["entropy_control"])
        self._restore_reference(reference, path, int(state["step"]))
        if ema is not None:  # none in the checkpoint: the average starts from the weights at the next update
            ema.read(path)
        shape = ""
        if self.start.written_on is not None:
            shape = (
                f" on {self.world} rank(s) at ZeRO-{self.zero_stage} through its universal checkpoint (each rank's RNG "
                "from a seed of the run's seed, the step and the rank)"
            )
        log.info(f"glm-grpo: resumed from {path} at step {int(state['step'])}{shape}")
        if self.rank == 0:  # final_*/ of an earlier end would sit beside newer metrics; set aside once loaded, not
            # before: a load that fails leaves them where they were
            for line in resume.set_aside_final(self.out, self.start.step, self.cfg.max_steps):
                log.info(line)
        # the schedule's length is max_steps x grpo.num_iterations x batch.mini_batches optimizer steps: a change of
        # any of them moves the lr
        schedule_keys = ("max_steps", "grpo.num_iterations", "batch.mini_batches")
        if any(key.startswith("optimizer.") or key in schedule_keys for key in self.start.changes):
            log.info(
                f"glm-grpo: the optimizer runs with this launch's settings from step {int(state['step']) + 1}: lr "
                f"{lr:.6g} (optimizer.lr={cfg.optimizer.lr:g}, schedule {cfg.optimizer.schedule} over "
                f"{cfg.total_optimizer_steps} optimizer steps with warmup_steps={cfg.optimizer.warmup_steps}, at the "
                "checkpoint's position in it)"
            )
        order_keys = [key for key in ("seed", "data.shuffle") if key in self.start.changes]
        if order_keys:
            log.info(
                f"glm-grpo: the prompts of epoch {prompt_order.epoch} come in the checkpoint's order to its end (each "
                f"once); the new {' and '.join(order_keys)} orders the epochs after it"
            )
        return int(state["step"]), int(state.get("skipped_steps", 0))

    def _restore_reference(self, reference, path: Path, step: int) -> None:
        """The KL's reset reference of checkpoint ``path`` into ``reference`` (collective; model/reference.py), and a
        line where the checkpoint's and this launch's grpo.ref_sync_steps disagree."""
        every = self.cfg.grpo.ref_sync_steps
        if reference is not None:
            reference.read(path)
            if reference.step == 0 and step >= every:
                log.info(
                    f"glm-grpo: {path.name} holds no reset reference: the KL's reference is the starting model "
                    f"until the reset after step {(step // every + 1) * every} (grpo.ref_sync_steps={every})"
                )
        elif any(path.glob(checkpoint.REFERENCE_FILES)):
            log.warning(
                f"glm-grpo: warning: {path.name} holds a reset reference, but grpo.ref_sync_steps=0 now: the "
                "KL's reference is the starting model again (set ref_sync_steps to keep resetting it)"
            )

    def save_checkpoint(
        self,
        engine,
        prompt_order,
        step: int,
        skipped_steps: int,
        ahead=None,
        eval_reward=None,
        entropy_control=None,
        reference=None,
        ema=None,
    ) -> Path:
        """Checkpoint ``step`` (collective), its adapter's model card; its path. ``ahead``: this rank's rollout
        drawn ahead for the next step (``rollout.one_step_off``; glm_grpo_ds/experience/drawn.py Drawn.state);
        ``eval_reward``: rank 0's evaluation at this step, for ``save_best`` (None: not evaluated here);
        ``entropy_control``: the adaptive entropy coefficient (grpo.entropy_target), None without one; ``reference``:
        the KL's reset reference (grpo.ref_sync_steps; model/reference.py), None without resets; ``ema``: the adapter's
        average (lora.ema_decay; model/ema.py), None without one."""
        state = {
            "step": step,
            "run_id": self.run_id,
            "launch": self.launch,
            "skipped_steps": skipped_steps,
            "sampler": prompt_order.state(),
            "data": self.data,
            "world_size": self.world,
            "zero_stage": self.zero_stage,
            "lora": self.cfg.lora is not None,
            "config": to_dict(self.cfg),
            "entropy_control": None if entropy_control is None else entropy_control.state(),
        }
        is_lora, limit = self.cfg.lora is not None, self.cfg.save_total_limit
        kept = [state for state in (reference, ema) if state is not None]  # tensors of their own, every rank writes
        more = partial(_write_each, kept, rank=self.rank) if kept else None
        with self.disk.writing(f"checkpoint {checkpoint.step_dir_name(step)}", self.disk.checkpoint_bytes()):
            path = checkpoint.save(
                engine, self.out, step, state, self.rank, is_lora, limit, later=self.later, ahead=ahead, more=more
            )
        self.disk.wrote_checkpoint(path)
        self.best.consider(step, eval_reward, path)
        return self.publisher.checkpoint(path, step)  # its adapter's model card (+ upload, hub.push_checkpoints)

    def save_final(self, engine, step: int, ema=None) -> None:
        """``final_adapter/`` (LoRA) or ``final_model/`` (collective), with the step it holds (``step``: max_steps, or
        the resumed checkpoint's when max_steps was lowered below it) and its card; with ``ema`` (lora.ema_decay,
        model/ema.py) its average in ``final_adapter_ema/`` too; first, the room for them (lifecycle/disk_space.py)."""
        ema_dir = None if ema is None else self.out / checkpoint.FINAL_ADAPTER_EMA
        with self.disk.writing(self.final_dir.name + "/", self.disk.planned("final_bytes"), final=True):
            self._write_final(engine, step, ema, ema_dir)
        dist.barrier()  # every rank sees final_*/ whole
        self.publisher.final(self.final_dir, ema_dir)

    def _write_final(self, engine, step: int, ema, ema_dir: Path | None) -> None:
        if ema is not None:
            ema.save_adapter(engine, ema_dir, self.rank, step)
        final = self.final_dir
        # written beside it, then renamed: a run killed while writing leaves final_*.tmp (removed when they are next
        # written), not a final_*/ of half the files, and its resume writes them again (resume.finished)
        partial, replaced = final.with_name(final.name + ".tmp"), final.with_name(final.name + ".old")
        if self.rank == 0:
            shutil.rmtree(partial, ignore_errors=True)
            shutil.rmtree(replaced, ignore_errors=True)
        if self.cfg.lora is not None:
            ds_io.save_adapter(engine, partial, self.rank)
        else:
            ds_io.save_full_model(engine, partial, self.rank)
        if self.rank == 0:  # which step these weights are: a later resume sets them aside by it
            resume.write_final_state(partial, step)
            if final.exists():  # an earlier end's (not set aside: the same step), or a pre-.tmp half-written one
                final.rename(replaced)  # renamed, not deleted first: final_*/ is missing for two renames, not a delete
            partial.rename(final)
            shutil.rmtree(replaced, ignore_errors=True)

    def end_stopped(self, stop: Stopped) -> int:
        """The end of a run every rank agreed to stop (collective): its line, rank 0's pending upload / pruning of
        the checkpoint it just saved, then the exit status. The other ranks wait for that upload before they exit
        (once they have, the launcher would end rank 0), on a group of their own: the process group's barrier gave
        up after ``dist_timeout_minutes``, and the launcher then ended rank 0 mid-upload."""
        try:
            with terms_ignored():  # from the first instant: a rank other than 0 sleeps in log.fatal (its grace)
                log.fatal(str(stop))
                with dist.patient_group(UPLOAD_WAIT_S) as barrier:
                    self.publisher.wait()
                    barrier(False)
        except KeyboardInterrupt:  # a (second) Ctrl-C while rank 0 uploads: its line, not a chained traceback
            if self.rank == 0:
                log.fatal(self.publisher.interrupted_line())
            return exit_code(signal.SIGINT)
        dist.shutdown()
        return stop.exit_code

    def finish_uploads(self) -> int:
        """Rank 0's final upload after training, the process group gone (:meth:`Publisher.finish`): its exit status.
        A scheduler's SIGTERM (a job's time limit, launch/slurm.sbatch) is passed over: it killed rank 0 mid-upload,
        silently, and the requeued job found the run finished and never uploaded. Ctrl-C still interrupts it."""
        with terms_ignored():
            return self.publisher.finish()

    def stop_if_asked(
        self,
        step: int,
        received: int,
        consecutive_skips: int,
        saved: Path | None,
        save: Callable[[], Path],
        alarm: bool = False,
    ) -> None:
        """After ``step`` (collective): if any rank received SIGTERM / SIGINT (``received``: this rank's signal
        number or 0), or the last ``max_consecutive_skips`` steps were all skipped, or an alarm holds on any rank
        (``alarm``: monitor.stop_on_alarm), save a checkpoint (``save``, unless ``saved`` just now) and raise
        :class:`Stopped` on every rank; a signal after the last step lets the run end (its final weights are next)."""
        signum = int(dist.any_rank(received))
        limit = self.cfg.max_consecutive_skips
        diverged = limit > 0 and consecutive_skips >= limit
        alarmed = bool(dist.any_rank(float(alarm))) if self.cfg.monitor.stop_on_alarm else False
        if not signum and not diverged and not alarmed:
            return
        if not diverged and not alarmed and step >= self.cfg.max_steps:
            return  # a signal at the last step: the final weights come next, as soon as a checkpoint would
        path = saved or save()
        if signum:
            raise Stopped(
                f"glm-grpo train: preempted by {signal_name(signum)} at step {step}; checkpoint at {path}; "
                "resume with resume_from=latest",
                exit_code(signum),
            )
        if diverged:
            raise Stopped(
                f"glm-grpo train: stopped at step {step}: the last {limit} steps were skipped for a non-finite loss or "
                f"gradient or rewards undefined for every sample (max_consecutive_skips={limit}); checkpoint at {path} "
                "(weights of the last update); lower optimizer.lr or check the rewards, then resume with "
                "resume_from=latest",
                EXIT_NONFINITE,
            )
        raise Stopped(
            f"glm-grpo train: stopped at step {step} on an alarm (monitor.stop_on_alarm; its line is above); "
            f"checkpoint at {path}; look at samples/ and the images/* metrics, then resume with "
            "resume_from=latest and monitor.stop_on_alarm=false (or other monitor.alarms) to go on",
            EXIT_ALARM,
        )
