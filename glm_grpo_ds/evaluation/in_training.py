"""Held-out evaluation during training, and sample galleries gathered from every rank to rank 0.

Evaluation (``eval.file``; see :class:`glm_grpo_ds.config.EvalConfig`): before training (step 0,
``eval.at_start``), every ``eval.steps`` steps and after the last step, each eval prompt gets
``eval.group_size`` samples and the run's rewards score them. Seeds are fixed, by evaluation/seeds.py's scheme
with ``eval.seed``: a rank's prompts are rolled out in one batch, each prompt's tokens drawn from its own
seed's stream, so a prompt's samples depend on the weights, the prompt and ``eval.seed`` only - not on the step,
the training ``seed``, the rank count or which other prompts share the batch (up to floating-point rounding of
the batched forward: the padding differs with the batch, and a draw within ~1e-7 of a boundary can change). The
same weights give the same eval reward, and ``glm-grpo evaluate`` of the final adapter with ``--seed eval.seed``
and ``--samples-per-prompt eval.group_size`` (its defaults) draws the final evaluation's samples.
The eval decode has its own settings (``eval.num_inference_steps`` / ``eval.guidance_scale``, by default
the pipeline's own, as ``glm-grpo render``), not the cheaper training decode's; each record names them.

Distribution: the P eval prompts are split into contiguous shares of ceil(P / world) per rank
(the last shares padded with repeats, dropped after gathering), so every rank runs the same number
of rollouts inside one ``gathered_for_rollout`` block - under ZeRO-3 every rank must take part in
the parameter gather (and, with ``rollout.gather_parameters: false``, in every forward).

Galleries (:func:`gallery_to_main`): each rank turns at most ceil(max_prompts / world) of its
prompts into small uint8 thumbnails, ``dist.gather_to_main`` collects them on rank 0, which writes
the PNG (glm_grpo_ds/observability/gallery.py); the trainer's training galleries use it too. Called from
``glm_grpo_ds.train``; no command of its own.
"""

from __future__ import annotations

import math
import time
from functools import partial
from pathlib import Path

import torch

from ..advantages import weighted_total
from ..data import PromptRow
from ..decoder import resolve_settings
from ..ds import dist
from ..observability.gallery import save_gallery, thumbnails
from ..observability.metrics import image_record, nan_mean, nan_std
from ..observability.records import reward_means
from ..runtime import oom
from .seeds import decode_seed, rollout_seeds

PADDING = -1  # row index of a padding sample (dropped on rank 0)


def gallery_to_main(
    path: Path,
    images: torch.Tensor,
    rewards: torch.Tensor,
    row_index: torch.Tensor,
    rows: list[PromptRow],
    cols: int,
    logging_cfg,
    world: int,
) -> Path | None:
    """Collective. ``images`` ``[n, 3, H, W]`` are this rank's samples, group by group (``cols`` per
    prompt), ``rewards`` / ``row_index`` ``[n]`` their total reward and dataset row (``PADDING`` =
    not a real sample). Rank 0 writes at most ``logging.gallery_max_prompts`` rows to ``path`` and
    returns it; other ranks return None."""
    max_prompts = logging_cfg.gallery_max_prompts
    k = min(images.shape[0] // cols, math.ceil(max_prompts / world)) * cols  # same on every rank
    device = images.device
    thumbs = dist.gather_to_main(thumbnails(images[:k], logging_cfg.gallery_thumbnail))
    rewards = dist.gather_to_main(rewards[:k].to(device=device, dtype=torch.float32))
    index = dist.gather_to_main(row_index[:k].to(device=device, dtype=torch.int64))
    if thumbs is None:
        return None
    keep = [g for g in range(index.shape[0] // cols) if int(index[g * cols]) != PADDING][:max_prompts]
    sel = torch.tensor([g * cols + c for g in keep for c in range(cols)], dtype=torch.long)
    prompts = [rows[int(index[g * cols])].prompt for g in keep]
    return save_gallery(path, thumbs.cpu()[sel], prompts, rewards.cpu()[sel].tolist(), cols)


class Evaluator:
    """Fixed-seed evaluation of the current policy on held-out prompts (see the module docstring)."""

    def __init__(self, cfg, rows: list[PromptRow], rank: int, world: int, device: torch.device):
        ev = cfg.eval
        self.cfg, self.rank, self.world, self.device = cfg, rank, world, device
        self.rows = rows[: ev.num_prompts] if ev.num_prompts else rows
        per_rank = math.ceil(len(self.rows) / world)
        positions = range(rank * per_rank, (rank + 1) * per_rank)
        # (row, real): padding repeats a real prompt so shapes match across ranks, then is dropped
        self.mine = [(self.rows[p % len(self.rows)], p < len(self.rows)) for p in positions]
        self.decode = resolve_settings(ev.num_inference_steps, ev.guidance_scale)

    def due(self, step: int) -> bool:
        """Evaluate after training step ``step`` (1-based)?"""
        return self.cfg.eval.evaluates(step, self.cfg.max_steps)

    def run(self, step: int, experience, out: Path, is_main: bool) -> tuple[dict | None, Path | None]:
        """Collective. Returns ``(record, gallery path)`` on rank 0, ``(None, None)`` elsewhere."""
        cfg, ev = self.cfg, self.cfg.eval
        group_size = ev.group_size
        t0 = time.perf_counter()
        # one batched rollout, each prompt with its own seed: a prompt's samples do not depend on
        # which prompts share its rank
        rows = [row for row, _ in self.mine]
        with oom.marking(part=f"the evaluation at step {step}"):  # the run's line says so (memory/oom.py)
            exp = experience.collect(
                rows,
                rollout_seeds(ev.seed, rows),
                partial(decode_seed, ev.seed),
                group_size=group_size,
                decode=self.decode,
            )
        reward_fn = experience.reward_fn
        images, per_reward = exp.images, exp.per_reward

        real = len(self.rows) * group_size  # gathered rows are rank-major; the first `real` are the eval set
        all_per_reward = {label: dist.all_gather(values)[:real].cpu() for label, values in per_reward.items()}
        statistics = image_record(images, group_size, cfg.monitor.statistics, real, reward_fn.pair_distance())
        path = None
        if ev.gallery:
            total = weighted_total(per_reward, reward_fn.weights, group_size)
            row_index = [row.index if is_real else PADDING for row, is_real in self.mine]
            index = torch.tensor(row_index).repeat_interleave(group_size)
            path = gallery_to_main(
                out / "samples" / f"eval_step_{step:06d}.png",
                images,
                total,
                index,
                self.rows,
                group_size,
                cfg.logging,
                self.world,
            )
        if not is_main:
            return None, None
        totals = weighted_total(all_per_reward, reward_fn.weights, group_size)
        record = {"step": step, "eval/reward_mean": nan_mean(totals), "eval/reward_std": nan_std(totals)}
        for label, values in all_per_reward.items():
            record[f"eval/reward/{label}"] = nan_mean(values)
            # a reward that failed on some samples (a remote one timed out) is filled by its group's mean in their
            # total, 0 where it failed for the whole group (TRL's nansum): this says how many
            record[f"eval/reward/{label}_undefined"] = int(torch.isnan(values).sum())
        record["eval/num_prompts"] = len(self.rows)
        record["eval/decode_steps"] = self.decode.num_inference_steps
        record["eval/decode_guidance"] = self.decode.guidance_scale
        record.update({f"eval/{key}": value for key, value in statistics.items()})
        record["eval/time"] = time.perf_counter() - t0
        if path is not None:
            record["gallery"] = str(path.relative_to(out))
        return record, path


def eval_line(record: dict, group_size: int) -> str:
    """The console line of one evaluation: the reward (each reward's mean when there are several), the prompts x
    samples it rests on, its seconds and its gallery."""
    labels = reward_means(record, "eval/reward/")  # each reward's mean, not its _undefined count
    each = f" ({', '.join(f'{k} {_fmt(v)}' for k, v in labels.items())})" if len(labels) > 1 else ""
    gallery = f"; {record['gallery']}" if record.get("gallery") else ""
    return (
        f"eval at step {record['step']}: reward {_fmt(record['eval/reward_mean'])}{each}, "
        f"{record['eval/num_prompts']} prompts x {group_size} samples, {record['eval/time']:.1f} s{gallery}"
    )


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def eval_summary(path) -> str | None:
    """The closing line's part on the run's evaluations (``eval.jsonl``): how many, the reward at the first and
    the last; None when the run wrote none."""
    from ..observability.records import read_metrics

    if not Path(path).is_file():
        return None
    rows = read_metrics(path)
    if not rows:
        return None
    first, last = rows[0], rows[-1]
    return (
        f"{len(rows)} evaluation(s), reward {_fmt(first.get('eval/reward_mean'))} at step {first['step']} -> "
        f"{_fmt(last.get('eval/reward_mean'))} at step {last['step']}"
    )
