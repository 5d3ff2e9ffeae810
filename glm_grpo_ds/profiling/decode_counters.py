"""The counters a decode step is measured with (profiling/decode_counts.py runs them, one step at a time).

Counted (deterministic: the same model and shapes give the same numbers on every run):

* kernels: the aten operators that do work, as a ``TorchDispatchMode`` sees them (after autograd and the
  composite decompositions, so ``linear`` counts as its ``addmm`` / ``mm``). Not counted: views (an operator
  whose schema returns an alias of an input and writes nothing: ``view``, ``expand``, ``t``, ``transpose``,
  ``permute``, ``(un)squeeze``, ``slice``, ``select``, ``split``, ``alias``, ``detach``, ``as_strided`` ...),
  the metadata-only operators of :data:`METADATA_OPS` (``_unsafe_view``, ``resolve_conj``, ...) and
  allocations that write nothing (``empty*``). In-place and ``out=`` operators count, and so do reads back
  to the host. The compiled step runs most of its work where no dispatcher sees it: its generated kernels
  (C++ or Triton) and the extern kernels (matmuls, attention) its C++ wrapper calls directly are counted from
  the profiler's events of a compile with inductor's kernel profiling on (:func:`kernel_profiled_step`),
  plus what it still dispatches (the copies into its mutated inputs, the eager noise draw);
* module calls: ``nn.Module`` calls (a global forward pre-hook);
* Python calls: ``sys.setprofile``'s ``call`` (a Python function entered) and ``c_call`` (a C function called
  from Python) events, in a pass of its own, less those of an empty call (the counter's own);
* host syncs: operators that read a device value back to the host (:data:`SYNC_OPS`: ``_local_scalar_dense``
  of ``.item()`` / ``bool()``, ``nonzero``, ``equal``, data-dependent shapes ...) and copies from an
  accelerator to the CPU. A CPU has nothing to wait for: these count what would stall a GPU.
"""

from __future__ import annotations

import collections
import contextlib
import os
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

COUNTS = ("kernels", "module_calls", "python_calls", "host_syncs")  # what a pass counts, in the report's order

# Not kernels: metadata-only operators (views by schema are skipped anyway; the common ones are named here for
# the reader, with those whose schema does not say so: _unsafe_view, _reshape_alias, lift_fresh, resolve_*),
# symbolic size queries and allocations that write nothing (no kernel on any device).
METADATA_OPS = frozenset(
    """_unsafe_view _reshape_alias reshape view alias detach expand as_strided t transpose permute unsqueeze
    squeeze slice select lift_fresh resolve_conj resolve_neg _conj _neg_view empty empty_like empty_strided
    new_empty new_empty_strided sym_size sym_stride sym_numel sym_storage_offset""".split()
)
# Host syncs: operators that read a device value back to the host or size their output by one (counted for
# repeat_interleave even when an output_size spares it).
SYNC_OPS = frozenset(
    """_local_scalar_dense item is_nonzero nonzero equal allclose masked_select _unique _unique2 unique_dim
    unique_consecutive repeat_interleave""".split()
)
# profiler events of work that never reaches the dispatcher: inductor's generated kernels and the extern
# kernels its C++ wrapper calls through AOTInductor's shims (at::cpu:: / at::cuda:: functions)
GENERATED_KERNEL_MARKS = ("cpp_fused", "triton_")
EXTERN_SHIM_PREFIXES = ("aoti_torch_cpu_", "aoti_torch_cuda_")


def is_view(func) -> bool:
    """A schema-declared view: some return aliases an input and nothing is written."""
    schema = func._schema
    if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
        return False  # in place / out=: writes
    return any(r.alias_info is not None for r in schema.returns)


def _is_device_to_host(func, args, out) -> bool:
    name = func._opname
    if name == "_to_copy" and isinstance(out, torch.Tensor) and isinstance(args[0], torch.Tensor):
        return out.device.type == "cpu" and args[0].device.type != "cpu"
    if name == "copy_" and isinstance(args[0], torch.Tensor) and isinstance(args[1], torch.Tensor):
        return args[0].device.type == "cpu" and args[1].device.type != "cpu"
    return False


class OpCounter(TorchDispatchMode):
    """Counts the operators dispatched under it: ``kernels`` (work, by the module docstring's rule),
    ``host_syncs``, and ``ops`` (every counted kernel by operator name, for reading)."""

    def __init__(self):
        super().__init__()
        self.kernels = 0
        self.host_syncs = 0
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func._opname
        if name in SYNC_OPS or _is_device_to_host(func, args, out):
            self.host_syncs += 1
        if name not in METADATA_OPS and not is_view(func):
            self.kernels += 1
            self.ops[str(func)] += 1
        return out


@contextlib.contextmanager
def _quiet_stderr():
    """File descriptor 2 to /dev/null: the profiler's C++ side prints lines of its own at start and stop."""
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def _compiled_kernels(events) -> collections.Counter:
    """The profiler events of work the dispatcher does not see, by name: inductor's generated kernels (C++ with
    ``cpp.enable_kernel_profile``, Triton always) and the extern kernels its C++ wrapper calls (AOTI shims)."""
    names = collections.Counter()
    for e in events:
        if any(m in e.name for m in GENERATED_KERNEL_MARKS):
            names["inductor kernel"] += 1
        elif e.name.startswith(EXTERN_SHIM_PREFIXES):
            names[e.name] += 1
    return names


@contextlib.contextmanager
def counting(profile: bool = False):
    """Kernels, host syncs and module calls of the block (``profile``: also the compiled code's kernels, from
    the profiler's events). Yields a dict, filled when the block ends."""
    counts: dict = {}
    calls = [0]

    def hook(module, args):
        calls[0] += 1

    prof = None
    if profile:
        os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # no warning that a CPU has no GPU
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        with _quiet_stderr():
            prof.start()
    handle = torch.nn.modules.module.register_module_forward_pre_hook(hook)
    try:
        with OpCounter() as ops:
            yield counts
    finally:
        handle.remove()
        if prof is not None:
            with _quiet_stderr():
                prof.stop()
    compiled = _compiled_kernels(prof.events()) if prof is not None else collections.Counter()
    counts.update(
        kernels=ops.kernels + sum(compiled.values()),
        module_calls=calls[0],
        host_syncs=ops.host_syncs,
        ops=dict(ops.ops + compiled),
    )


def python_calls(run) -> int:
    """Python calls of ``run()`` (``sys.setprofile``: ``call`` and ``c_call`` events), less those of an empty
    ``run`` (the counter's own)."""

    def count(fn) -> int:
        n = [0]

        def profiler(frame, event, arg):
            if event == "call" or event == "c_call":
                n[0] += 1

        sys.setprofile(profiler)
        try:
            fn()
        finally:
            sys.setprofile(None)
        return n[0]

    if sys.getprofile() is not None:  # cProfile and the like: theirs could not be put back
        raise RuntimeError("decode_counts: Python calls cannot be counted under another profiler (sys.setprofile)")

    return count(run) - count(lambda: None)


def counted_pass(run) -> dict:
    """Every count of :data:`COUNTS` (and ``ops``) of one ``run()``, the Python calls in a pass of their own."""
    with counting() as counts:
        run()
    return {**counts, "python_calls": python_calls(run)}


_profiled_steps: dict[str, object] = {}


def kernel_profiled_step(device: torch.device):
    """The decode loop's step compiled as :func:`~glm_grpo_ds.rollout.decode_loop.compiled_step` compiles it
    (``fullgraph``, static shapes, inductor's C++ wrapper on a CPU), with inductor's kernel profiling on: every
    generated C++ kernel and every extern kernel the wrapper calls is a profiler event (Triton kernels are one
    without it). A code object of its own, so its graphs stay apart from the loop's, which is what is timed
    (the profiling costs ~4 % of the tiny model's compiled step on a CPU)."""
    if device.type not in _profiled_steps:
        from ..rollout.decode_loop import decode_step

        def profiled_step(lm, lm_head, codebook, sampling, s):
            decode_step(lm, lm_head, codebook, sampling, s)

        options = {"cpp_wrapper": True, "cpp.enable_kernel_profile": True} if device.type == "cpu" else {}
        _profiled_steps[device.type] = torch.compile(profiled_step, fullgraph=True, dynamic=False, options=options)
    return _profiled_steps[device.type]
