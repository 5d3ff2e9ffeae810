"""What a run says when an accelerator runs out of memory (``torch.OutOfMemoryError``): one line from the rank that
met it, and exit status :data:`EXIT_OOM`, instead of a traceback whose last line is torch's.

The line names where (the step, the phase and the part marked on the error as it left them: runtime/oom.py), torch's
own figures (what it tried to allocate, what the GPU had free), the plan's figure for that phase (memory/phases.py
``phase_totals``), the settings of this run that plan that phase lower, each planned again with that one change
(memory/levers.py), PyTorch's expandable segments when much memory was reserved but unallocated (fragmentation),
and where the run stands on disk::

    glm-grpo train: out of GPU memory in the reward phase of step 12 (reward aesthetic): tried to allocate
    2.00 GiB with 1.23 GiB of 79.15 GiB free; the plan puts this phase at 44.5 of 79.2 GiB; planned lower with one
    change: decoder.offload=true -13.5 GiB: ...; the last checkpoint is step_000010 (checkpoints/latest): make one
    of these changes, then resume with resume_from=latest

(one line in the run). Each change is planned on the run's config in memory (its file may have changed since), the
models' sizes read once; whatever the planner meets, the line says so and still comes.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import torch

from ..ds import dist
from ..ds.ds_config import read_ds_config
from ..lifecycle.resume import go_on
from ..runtime.oom import marks
from .levers import NO_LEVER, lever_text, replanned
from .phases import MEASURED_PHASES, phase_totals
from .plan import GIB
from .sizes import model_sizes
from .startup import startup_plan

EXIT_OOM = 8  # exit status of a run that ran out of accelerator memory (2 = bad input, 7 = disk, ...)

# torch's caching allocator's message (c10/cuda/CUDACachingAllocator.cpp), the figures this line repeats
_TRIED = re.compile(r"Tried to allocate ([\d.]+ [KMGT]?i?B)")
_FREE = re.compile(r"has a total capacity of ([\d.]+ [KMGT]?i?B) of which ([\d.]+ [KMGT]?i?B) is free")
_UNALLOCATED = re.compile(r"([\d.]+) ([KMGT]?i?B) is reserved by PyTorch but unallocated")
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
# reserved but unallocated memory above this share of the GPU: fragmentation worth naming
FRAGMENTED = 0.05


def torch_figures(message: str) -> tuple[str, float | None, float | None]:
    """``(what torch tried and had, reserved-but-unallocated bytes, the GPU's capacity in bytes)`` from its
    out-of-memory message: ``"tried to allocate 2.00 GiB with 1.23 GiB of 79.15 GiB free"``, else the message's first
    sentence (another allocator's) and None where a figure is not in it."""
    tried, free = _TRIED.search(message), _FREE.search(message)
    if tried and free:
        text = f"tried to allocate {tried.group(1)} with {free.group(2)} of {free.group(1)} free"
    else:
        text = " ".join(message.split()).split(". ")[0] or "out of memory"
    spare = _UNALLOCATED.search(message)
    return (
        text,
        None if spare is None else _bytes(*spare.groups()),
        None if free is None else _bytes(*free.group(1).split()),
    )


def _bytes(number: str, unit: str) -> float:
    return float(number) * _UNITS.get(unit, 1)


def where_text(err: BaseException, step: int | None) -> tuple[str, str | None]:
    """``("in the reward phase of step 12 (reward ocr)", "reward")``: where ``err`` was met, and the plan's phase
    (a key of :data:`MEASURED_PHASES`, else None: the plan's peak stands for it)."""
    phase, part = marks(err)
    when = "during startup" if step is None else f"of step {step}"
    if phase:
        text = f"in the {phase.replace('_', ' ')} phase {when}"
    else:
        text = "during startup" if step is None else f"in step {step}"
    return text + (f" ({part})" if part else ""), phase if phase in MEASURED_PHASES else None


def plan_text(given: dict, phase: str | None, planned: list[tuple[str, str, dict]]) -> str:
    """The plan's figure for ``phase`` (or its peak) against the GPU, and the changes that plan it lower."""
    peak = phase_totals(given)[phase] if phase else given["total_bytes"]
    what = "this phase" if phase else "the run's peak"
    levers = lever_text(given, planned, phase)
    return f"the plan puts {what} at {peak / GIB:.1f} of {given['gpu_memory_bytes'] / GIB:.1f} GiB; " + (
        levers if levers == NO_LEVER else f"planned lower with one change: {levers}"
    )


def explain(err: BaseException, step: int | None, out: Path, plan_config: Callable[[object], dict], cfg) -> str:
    """The run's line for ``err``, met in ``step`` (None: during startup). ``plan_config(config)``: a config's plan
    on this run's cluster; ``cfg``: the run's config (its plan, and the changes that apply)."""
    where, phase = where_text(err, step)
    figures, spare, capacity = torch_figures(str(err))
    parts = [f"glm-grpo train: out of GPU memory {where}: {figures}"]
    try:
        given = plan_config(cfg)
        parts.append(plan_text(given, phase, replanned(cfg, given, plan_config)))
    except Exception as plan_err:  # noqa: BLE001 - whatever the planner meets, the run's line must still come
        parts.append(f"the run could not be planned again ({plan_err}): glm-grpo estimate-memory shows the plan")
    parts += fragmentation(spare, capacity)
    parts.append(go_on(out, "make one of these changes"))
    return "; ".join(parts)


def fragmentation(spare: float | None, capacity: float | None) -> list[str]:
    """The sentence naming PyTorch's expandable segments when much of the GPU was reserved but unallocated (``[]``
    otherwise)."""
    if spare is None or not capacity or spare < FRAGMENTED * capacity:
        return []
    return [
        f"{spare / GIB:.2f} GiB were reserved but unallocated (fragmentation): launching with "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True may be enough"
    ]


def fewer_dit_images(batch_size: int) -> str | None:
    """A command's change at the decode: ``decoder.batch_size`` halved (None at 1)."""
    if batch_size <= 1:
        return None
    return f"decoder.batch_size={batch_size // 2} decodes half as many images per DiT forward (now {batch_size})"


class CommandOutOfMemory(Exception):
    """A command's out-of-memory error as its one line (:func:`command_line`): its ``main`` prints it and exits
    :data:`EXIT_OOM`."""


def command_line(command: str, err: BaseException, change: Callable[[str | None], str | None], after: str) -> str:
    """``glm-grpo <command>``'s line for ``err`` (a command, not a run: no step, no plan): where it was met (the phase
    and part marked on it), torch's figures, ``change(phase)`` (what of the command's settings makes that phase
    smaller; None: nothing does), fragmentation, and ``after`` (what the command kept, how to go on)::

        glm-grpo evaluate: out of GPU memory in the decode phase (model base, prompt rows 4-7): tried to allocate
        2.00 GiB with 1.23 GiB of 79.15 GiB free; decoder.batch_size=4 decodes half as many images per DiT forward
        (now 8); this rank's 1 finished batch of prompts is kept in ...
    """
    phase, part = marks(err)
    where = f" in the {phase.replace('_', ' ')} phase" if phase else ""
    where += f" ({part})" if part else ""
    figures, spare, capacity = torch_figures(str(err))
    advice = change(phase) or "no setting of this command makes it smaller: a GPU with more free memory"
    return "; ".join(
        [f"glm-grpo {command}: out of GPU memory{where}: {figures}", advice, *fragmentation(spare, capacity), after]
    )


def train_line(err: BaseException, cfg, ds_config_path: str, run=None, step: int | None = None) -> str:
    """:func:`explain` for ``glm-grpo train``: ``cfg`` the run's config as loaded, the DeepSpeed config at
    ``ds_config_path``; ``run`` the trainer's (glm_grpo_ds/startup.py ``Run``) and the ``step`` it was in, None when
    the error came while building it. The models' sizes and the DeepSpeed config are read once."""
    if run is not None:
        world, device, out = run.world, run.device, run.out
    else:
        world, out = dist.world_size() if dist.initialized() else 1, Path(cfg.output_dir)
        cuda = torch.cuda.is_initialized()
        device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    known: dict = {}

    def plan_config(config) -> dict:
        if not known:  # read once, when first planned (inside explain: its failure is said in the line)
            known.update(raw=read_ds_config(ds_config_path), sizes=model_sizes(cfg))
        return startup_plan(config, known["raw"], world, device, known["sizes"])

    return explain(err, step, out, plan_config, cfg)
