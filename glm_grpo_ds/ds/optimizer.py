"""The client optimizer and lr schedule a DeepSpeed engine steps with, and the config's optimizer settings put
back over what a checkpoint's load restored (a resume with another lr, betas, eps or weight decay runs with them).
"""

from __future__ import annotations

import torch


def build_optimizer(params: list, opt_cfg):
    """Client optimizer: torch AdamW or bitsandbytes (Paged)AdamW8bit."""
    kwargs = dict(lr=opt_cfg.lr, betas=tuple(opt_cfg.betas), eps=opt_cfg.eps, weight_decay=opt_cfg.weight_decay)
    if opt_cfg.name == "adamw":
        return torch.optim.AdamW(params, **kwargs)
    import bitsandbytes as bnb

    cls = {"adamw_8bit": bnb.optim.AdamW8bit, "paged_adamw_8bit": bnb.optim.PagedAdamW8bit}[opt_cfg.name]
    return cls(params, **kwargs)


# optimizer.schedule -> transformers scheduler name (linear warmup over optimizer.warmup_steps first)
SCHEDULES = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}


def build_scheduler(optimizer, opt_cfg, total_optimizer_steps: int):
    """The lr schedule of ``optimizer`` (one ``scheduler.step()`` per optimizer step), from
    ``transformers.get_scheduler``: linear warmup from 0 over ``optimizer.warmup_steps``, then
    constant, linear decay to 0 or half-cosine decay to 0 at ``total_optimizer_steps``."""
    from transformers import get_scheduler

    return get_scheduler(
        SCHEDULES[opt_cfg.schedule],
        optimizer,
        num_warmup_steps=opt_cfg.warmup_steps,
        num_training_steps=total_optimizer_steps,
    )


def apply_optimizer_settings(param_groups: list[dict], scheduler, opt_cfg) -> float:
    """Put the config's optimizer settings over what a checkpoint's load restored; the lr the next optimizer step
    takes.

    DeepSpeed's ``load_checkpoint`` restores the optimizer's param groups (``lr``, ``betas``, ``eps``,
    ``weight_decay``, ``initial_lr``: torch's ``Optimizer.load_state_dict`` takes them from the checkpoint) and the
    scheduler's state (``base_lrs``, ``last_epoch``, ``_last_lr``), so a resume with another ``optimizer.lr`` kept
    the old one. The schedule's shape is already this launch's (``build_scheduler``'s ``functools.partial`` lambdas
    hold no state to restore: ``optimizer.schedule``, ``warmup_steps`` and the total of optimizer steps are the
    config's); its position, ``last_epoch`` (the optimizer updates applied, skipped ones not counted), is the
    checkpoint's and is kept. Here: betas, eps and weight decay set on every group; ``base_lrs`` and each group's
    ``initial_lr`` = ``optimizer.lr``; each group's lr recomputed as ``LambdaLR`` does, ``base_lr *
    lambda(last_epoch)``, so the first resumed step already runs with it (an unchanged config sets every value to
    the one it had: the resume stays bitwise exact)."""
    base = float(opt_cfg.lr)
    for group in param_groups:
        group.update(betas=tuple(opt_cfg.betas), eps=opt_cfg.eps, weight_decay=opt_cfg.weight_decay, initial_lr=base)
    scheduler.base_lrs = [base] * len(param_groups)
    lrs = [b * fn(scheduler.last_epoch) for fn, b in zip(scheduler.lr_lambdas, scheduler.base_lrs, strict=True)]
    for group, lr in zip(param_groups, lrs, strict=True):
        group["lr"] = lr
    scheduler._last_lr = list(lrs)  # what get_last_lr() reports until the next step
    return lrs[0]
