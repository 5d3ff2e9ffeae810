"""An exponential moving average of the LoRA adapter (``lora.ema_decay``; Flow-GRPO's ``ema``), for the evaluations
and a second final adapter: what a noisy policy-gradient run has learnt, with less of its last steps' noise.

diffusers' ``EMAModel`` keeps the average: after each step's update ``ema -= (1 - d) (ema - w)`` with d warmed up
as ``min(lora.ema_decay, (1 + n) / (10 + n))`` over its updates so far (the first takes the weights as they are, so
a resume from a checkpoint saved without an average starts it there). It is fed the adapters whole (gathered under
ZeRO-3 once per step; the average lives on every rank, the adapters' size in fp32). Training samples and updates the
adapters' own weights; the evaluations (``eval.*``, the in-run ones) and ``final_adapter_ema/`` take the average,
written into the adapters for the block and the adapters' own weights put back bitwise after it. A checkpoint keeps
it (``ema-00000.safetensors``, the update count in its metadata), so a resume continues it, and in peft format
(``adapter_ema/``)::

    ema = for_run(cfg, engine)        # None without lora.ema_decay
    ema.update()                      # after a step's update (collective under ZeRO-3)
    with ema.in_adapters():           # the adapters hold the average inside (collective under ZeRO-3)
        ...
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import torch

from ..ds import dist
from ..ds.engine import gathered, is_zero3, unwrap, written
from ..ds.io import save_adapter
from ..lifecycle.checkpoint import ADAPTER_EMA
from ..lifecycle.resume import write_final_state
from .kept import KeptTensors

FILES = "ema-*.safetensors"  # in a checkpoint (lifecycle/checkpoint.py's layout)


def for_run(cfg, engine):
    """The run's adapter average (``lora.ema_decay`` set), else None."""
    if cfg.lora is None or cfg.lora.ema_decay is None:
        return None
    return AdapterEMA(unwrap(engine), cfg.lora.ema_decay, is_zero3(engine), engine)


class AdapterEMA(KeptTensors):
    """The average of a peft model's LoRA weights; ``step``: the updates it has had (0: none yet, the weights it was
    made from)."""

    pattern = FILES

    def __init__(self, peft_model, decay: float, zero3: bool, engine=None):
        from diffusers.training_utils import EMAModel

        self.engine = engine  # the DeepSpeed engine a checkpoint's adapter_ema/ is saved through (None: not saved)
        named = [(name, p) for name, p in peft_model.named_parameters() if "lora_" in name]
        self.names, self.params, self.zero3 = [n for n, _ in named], [p for _, p in named], zero3
        self.expected = set(self.names)
        with gathered(self.params, zero3):  # EMAModel copies what it is given: the weights whole
            self.average = EMAModel(self.params, decay=decay)
        # in fp32 whatever the adapters' dtype: a bf16 average would round away each (1 - d) share of a small change
        self.average.shadow_params = [t.float() for t in self.average.shadow_params]

    @property
    def step(self) -> int:
        return self.average.optimization_step

    def update(self) -> None:
        """Average in the adapters' weights as they are now (collective under ZeRO-3)."""
        with gathered(self.params, self.zero3):
            self.average.step(self.params)

    @contextlib.contextmanager
    def in_adapters(self):
        """The adapters hold the average inside the block; their own weights, bitwise, after it. Before the first
        update the average is the weights themselves: nothing to write."""
        if not self.step:
            yield
            return
        with written(self.params, self.zero3):
            self.average.store(self.params)  # a host copy of the adapters' own weights
            self.average.copy_to(self.params)
        try:
            yield
        finally:
            with written(self.params, self.zero3):
                self.average.restore(self.params)

    def save_adapter(self, engine, directory: Path, rank: int, step: int | None = None) -> None:
        """The average in peft format in ``directory`` (``final_adapter_ema/``; collective), written beside it and
        renamed: a run killed meanwhile leaves a ``.tmp``, not half an adapter. ``step``: the run's end it is, recorded
        as the final weights' is (a later resume sets it aside by it, lifecycle/resume.py)."""
        partial_dir = directory.with_name(directory.name + ".tmp")
        if rank == 0:
            shutil.rmtree(partial_dir, ignore_errors=True)
        with self.in_adapters():
            save_adapter(engine, partial_dir, rank)
        if rank == 0:
            if step is not None:
                write_final_state(partial_dir, step)
            shutil.rmtree(directory, ignore_errors=True)
            partial_dir.rename(directory)
        dist.barrier()

    def write(self, directory, rank: int) -> None:
        """The average and its update count for a resume (``ema-00000.safetensors``), and in peft format
        (``adapter_ema/``: the evaluations' adapter, e.g. the one save_best picked) (collective)."""
        super().write(directory, rank)
        if self.step and self.engine is not None:
            self.save_adapter(self.engine, Path(directory) / ADAPTER_EMA, rank)

    def _shards(self, rank: int):
        """One file: the average as CPU tensors by parameter name (rank 0's; every rank holds the same)."""
        if rank == 0:
            yield {name: t.detach().cpu() for name, t in zip(self.names, self.average.shadow_params)}

    def _take(self, get, step: int) -> None:
        """The checkpoint's average and update count; without files a fresh start (its first update copies)."""
        with torch.no_grad():
            for name, shadow in zip(self.names, self.average.shadow_params):
                if get is not None:
                    shadow.copy_(get(name))
        self.average.optimization_step = step
