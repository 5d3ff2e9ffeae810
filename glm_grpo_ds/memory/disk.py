"""What a run writes to ``output_dir``, planned from the memory plan's parameter counts (no weights read): one
checkpoint's bytes, the final weights' and the most the run holds at once. The trainer checks the file system
before each write with these figures (the first checkpoint; a later one by the size of the last: lifecycle/
disk_space.py), ``train --check`` and ``estimate-memory`` say them beforehand.

A checkpoint (lifecycle/checkpoint.py ``save``) holds:

* ``ds/``: every rank's optimizer partition, its fp32 master and moments (AdamW: two fp32; 8-bit AdamW: two uint8
  codes with a scale per 256), the same bytes as in the memory plan (components.py); below ZeRO-3, DeepSpeed's
  model-states file adds the trainable parameters in their dtype (frozen ones are left out); under ZeRO-3 each rank
  writes one of its own, without them (partitioned placeholders);
* ``adapter/`` (LoRA): the adapter export in its dtype; ``reference-*`` (``grpo.ref_sync_steps``, once reset): the
  adapters' copy (LoRA) or the trained parameters (full fine-tuning); ``ema-*`` and ``adapter_ema/``
  (``lora.ema_decay``): the fp32 average and its export;
* the RNG states (one file a rank), ``trainer_state.json`` and DeepSpeed's two conversion scripts: small and fixed.

The final weights: ``final_adapter/`` (+ ``final_adapter_ema/``), or ``final_model/``, the whole AR in the model
dtype. What a rollout drawn ahead adds (``rollout.one_step_off``: token ids) is small and not counted.

    from glm_grpo_ds.memory.disk import disk_plan
    disk_plan(basis)   # {"checkpoint_bytes": ..., "final_bytes": ..., "checkpoints_kept": ..., "run_bytes": ...}
"""

from __future__ import annotations

from .basis import Basis
from .components import master_bytes, state_bytes

FIXED_BYTES = 64 * 1024  # trainer_state.json and DeepSpeed's zero_to_fp32.py / zero_to_torch.py (~47 KiB together)
# a final weights directory's model card, reward curve and configs (~51 KiB measured on the tiny model)
FINAL_FIXED_BYTES = 64 * 1024
RNG_BYTES = 24 * 1024  # rng/rank_<r>.pt: python, numpy, torch (and CUDA) states, ~19 KiB measured on a CPU rank
# ZeRO-3: each rank's own model-states file (the parameters' names and shapes, buffers, the config; 30 KiB a rank on
# the tiny model), where below ZeRO-3 one file holds them with the trainable parameters
ZERO3_STATES_BYTES = 30 * 1024


def checkpoint_bytes(s: Basis) -> int:
    """One checkpoint of this run on ``s.world`` ranks (the module docstring's parts)."""
    cfg, trainable = s.cfg, s.psi_t
    optimizer = (s.world if s.stage >= 1 else 1) * (master_bytes(s) + state_bytes(s))  # ZeRO-0: rank 0's only
    model_states = trainable * s.trainable_b if s.stage < 3 else s.world * ZERO3_STATES_BYTES
    total = optimizer + model_states + FIXED_BYTES + s.world * RNG_BYTES
    if cfg.lora is not None:
        total += trainable * s.lora_b  # adapter/
        if cfg.lora.ema_decay is not None:
            total += trainable * 4 + trainable * s.lora_b  # ema-00000.safetensors (fp32) + adapter_ema/
        if cfg.grpo.beta > 0 and cfg.grpo.ref_sync_steps:
            total += trainable * s.lora_b  # the reset reference: the adapters' copy
    elif cfg.grpo.beta > 0 and cfg.grpo.ref_sync_steps:
        total += trainable * s.b  # the reset reference: the reference engine's trained parameters
    return total


def final_bytes(s: Basis) -> int:
    """``final_adapter/`` (+ ``final_adapter_ema/``) of a LoRA run, ``final_model/`` (the whole AR) of a full one."""
    lora = s.cfg.lora
    if lora is None:  # every AR tensor (ar_base: all but the LoRA adapters, of which there are none)
        return sum(s.sizes.ar_base) * s.b + FINAL_FIXED_BYTES
    return (s.psi_t * s.lora_b + FINAL_FIXED_BYTES) * (2 if lora.ema_decay is not None else 1)


def checkpoints_kept(cfg) -> int:
    """The most checkpoints the run keeps at once: ``save_total_limit`` (0: every one it saves), one more while a
    new one is written before the oldest is pruned, and the best one (``save_best``) kept beside them."""
    if not cfg.save_steps:
        return 0
    saved = cfg.max_steps // cfg.save_steps
    kept = saved if cfg.save_total_limit == 0 else min(saved, cfg.save_total_limit + 1)
    return kept + (1 if cfg.save_best and cfg.save_total_limit and saved > cfg.save_total_limit else 0)


def disk_plan(s: Basis) -> dict:
    """The run's disk figures (bytes): one checkpoint, the final weights, how many checkpoints it holds at most
    (:func:`checkpoints_kept`) and the most it holds at once, checkpoints and final weights together."""
    one, final, kept = checkpoint_bytes(s), final_bytes(s), checkpoints_kept(s.cfg)
    return {"checkpoint_bytes": one, "final_bytes": final, "checkpoints_kept": kept, "run_bytes": kept * one + final}
