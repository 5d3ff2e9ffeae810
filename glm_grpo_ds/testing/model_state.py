"""Test and benchmark instrumentation: bytes of the model states a DeepSpeed engine holds.

Used to check glm_grpo_ds/memory/plan.py against what DeepSpeed really allocates
(tests/integration/test_memory_plan_deepspeed.py); reads engine internals, so it is not part of
the training path.
"""

from __future__ import annotations

import torch

from ..ds.engine import is_zero3, unwrap


def model_state_bytes(engine) -> dict[str, int]:
    """Bytes of the model states this rank holds now, by kind, each storage counted once.

    ``parameters``: the model's parameters as stored here (ZeRO-3: this rank's partitions, plus the
    whole of parameters below the persistence threshold); ``gradients``: DeepSpeed's gradient
    buffers and ``.grad`` tensors (complete just before ``engine.step``); ``master``: fp32 master
    partitions; ``optimizer_states``: the wrapped optimizer's state tensors (Adam moments, 8-bit
    codes and scales). Compared with ``glm_grpo_ds.memory.plan`` by the tests.
    """
    seen: set[int] = set()

    def total(tensors) -> int:
        n = 0
        for t in tensors:
            if not torch.is_tensor(t) or t.numel() == 0:
                continue
            storage = t.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                n += storage.nbytes()
        return n

    opt = engine.optimizer
    params = list(unwrap(engine).parameters())
    out = {"parameters": total([getattr(p, "ds_tensor", None) for p in params] + [p.data for p in params])}
    if is_zero3(engine):
        master = list(opt.fp32_partitioned_groups_flat)
        grads = [opt.grad_partitions_flat_buffer] + [p.grad for p in params]
    else:
        master = list(opt.single_partition_of_fp32_groups)
        grads = [getattr(opt, "grads_in_partition", None)] + [p.grad for p in params]
        grads += [
            g for g in getattr(opt, "averaged_gradients", {}).values() for g in (g if isinstance(g, list) else [g])
        ]
    out["master"] = total(master)
    out["gradients"] = total(grads)
    out["optimizer_states"] = total(v for st in opt.optimizer.state.values() for v in st.values())
    return out
