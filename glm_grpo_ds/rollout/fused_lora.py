"""Sampling with the LoRA adapters unmerged, through one low-rank path per layer instead of peft's wrappers.

    with lora_fused(policy):                # rollout.fuse_lora; peft's wrappers out of the call path
        batch = rollout(policy, ...)        # each adapted projection: base GEMM + its group's low-rank path
    # here peft's wrappers are back; nothing was written to any weight

Why: the sampler must sample the policy the trainer trains. Merging the adapter into bf16 weights
(rollout.merge_lora, glm_grpo_ds/rollout/merged_lora.py) rounds away what of ``s B A`` lies under the bf16
spacing of ``W``, most of an adapter's delta in its first steps at real learning rates (issue #51). Unmerged,
peft runs every adapted linear as the base GEMM plus, per adapter, a cast of the input, two GEMMs, a scale, an
add and a cast back: 4-6 extra kernels and a dozen Python calls per projection, 6 projections x 40 layers per
decode step. Here, per decoder layer:

* the projections that read one input (q/k/v of an attention: :data:`SHARED_INPUT`) form a group: one *shrink*
  GEMM ``x A_cat^T`` with their A's concatenated and one *expand* GEMM with their ``s B``'s as the blocks of a
  block-diagonal matrix give every member's delta (the first member called computes it, the others take their
  columns: the attention calls q, k, v on one tensor);
* a projection alone (o, gate_up, down) shrinks with its live ``A`` and expands with its live ``B``;
* each member adds its delta into the base output in place (one kernel).

Counted per decode step (``glm-grpo profile decode-counts``, fp32): peft adds 24 kernels per layer
over the merged step (12 GEMMs, 6 scales, 6 adds), this path 14 (8 GEMMs, 6 adds); under a CUDA graph
(rollout.cuda_graph) kernels are what a replay costs. The math is peft's: ``x`` cast to the adapters' dtype,
``(x A^T) B^T`` in that dtype, the scaled delta added to the base result in the promoted dtype and rounded once
to the output's (``bf16_out.add_(fp32_delta)`` computes ``float(out) + delta`` and rounds to bf16, as peft's
``(result + delta).to(bf16)`` does). What differs: GEMM blocking, and ``s`` applied to ``B`` before the expand
instead of after it (exact for a power-of-two scale such as the shipped alpha = 2r). So fp32 sampling gives the
peft loop's tokens and its log-probs to fp32 rounding (tests/integration/test_fused_lora.py). Nothing is merged:
the adapters are read live, except the grouped members' concatenated A's and block-diagonal ``s B``, copies of
~6 MB a layer in fp32 at GLM-Image's size and r=64 (~0.27 GB over 40 layers), made at every entry (the adapters
change every optimizer step) and freed at exit.

Supported: peft's vanilla ``lora.Linear`` (any number of active adapters, rsLoRA scales); refused in one line:
LoRA variants (DoRA, ...) and ``lora_bias``. Dropout is the identity in eval mode, where the rollout runs.
"""

from __future__ import annotations

import contextlib

import torch

# sibling projections that transformers' decoder layers call on one input tensor, in call order
SHARED_INPUT = (("q_proj", "k_proj", "v_proj"),)


class _Group:
    """The low-rank path of sibling projections that read one input (see the module docstring). ``members``:
    per member (in call order), its active adapters as ``(A, B, scale)``. A lone member reads its live A and B;
    several share one shrink and one block-diagonal expand, kept from the first member's call to the last's
    only: a compiled step must see the same state at every step (else its guards fail and it recompiles)."""

    def __init__(self, members: list[list[tuple[torch.Tensor, torch.Tensor, float]]]):
        self.members = members
        self.shared = sum(1 for m in members if m) > 1
        self.last_input: torch.Tensor | None = None
        self.last_delta: torch.Tensor | None = None
        if self.shared:
            self._copy(members)
            self.last = max(i for i, m in enumerate(members) if m)

    @torch.no_grad()  # copies of the adapters' values, outside autograd whatever the caller's mode
    def _copy(self, members) -> None:
        """The grouped members' A's concatenated (``a``) and their ``s B`` on the diagonal of ``b``; ``columns``:
        each member's output columns in the expand."""
        adapters = [ab for m in members for ab in m]
        self.a = torch.cat([a for a, _, _ in adapters])  # [sum r, in]
        outs = [m[0][1].shape[0] if m else 0 for m in members]
        self.b = adapters[0][1].new_zeros(sum(outs), self.a.shape[0])  # [sum out, sum r], s B on the diagonal
        self.columns, row, col = [], 0, 0
        for m, out in zip(members, outs):
            for _, b, scale in m:
                self.b[row : row + out, col : col + b.shape[1]] = b * scale
                col += b.shape[1]
            self.columns.append((row, row + out))
            row += out

    def delta(self, x: torch.Tensor, index: int) -> tuple[torch.Tensor, float]:
        """Member ``index``'s ``(delta, alpha)``: ``alpha * delta`` = ``s B A x`` ``[..., out]``, in the adapters'
        dtype."""
        if not self.shared:
            (a, b, scale), *more = self.members[index]
            delta = (x.to(a.dtype) @ a.t()) @ b.t()
            if not more:
                return delta, scale  # scaled inside the add: no kernel of its own
            delta = delta * scale
            for a, b, scale in more:
                delta = delta + (x.to(a.dtype) @ a.t()) @ b.t() * scale
            return delta, 1.0
        if self.last_input is not x:
            self.last_input, self.last_delta = x, (x.to(self.a.dtype) @ self.a.t()) @ self.b.t()
        row, end = self.columns[index]
        delta = self.last_delta[..., row:end]
        if index == self.last:
            self.forget()
        return delta, 1.0

    def forget(self) -> None:
        self.last_input = self.last_delta = None


class FusedLoraLinear(torch.nn.Module):
    """Stands in for one peft ``lora.Linear`` inside :func:`lora_fused`: the base layer's output with its
    group's delta for it added in place (see the module docstring)."""

    def __init__(self, base: torch.nn.Module, group: _Group | None, index: int):
        super().__init__()
        self.base = base
        self.group, self.index = group, index

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        if self.group is None or not self.group.members[self.index]:
            return out
        delta, alpha = self.group.delta(x, self.index)
        return out.add_(delta, alpha=alpha)


def _lora_linears(model):
    from peft.tuners.lora import Linear as LoraLinear

    for name, module in model.named_modules():
        if isinstance(module, LoraLinear):
            yield name, module


def _active(name: str, module) -> list[str]:
    """The adapters ``module`` applies in a forward (none when adapters are disabled), refused if not vanilla."""
    if module.disable_adapters:
        return []
    active = [a for a in module.active_adapters if a in module.lora_A]
    for adapter in active:
        if adapter in getattr(module, "lora_variant", {}):
            kind = type(module.lora_variant[adapter]).__name__
            raise ValueError(
                f"rollout.fuse_lora: {name} adapter {adapter!r} is a LoRA variant ({kind}), which the fused path "
                "does not compute; set rollout.fuse_lora: false"
            )
        if module.lora_B[adapter].bias is not None:
            raise ValueError(
                f"rollout.fuse_lora: {name} adapter {adapter!r} has a lora_B bias (lora_bias), which the fused "
                "path does not add; set rollout.fuse_lora: false"
            )
    return active


def _groups(layers: dict[str, object]) -> list[list[str]]:
    """Names of the LoRA linears grouped by shared input: :data:`SHARED_INPUT` siblings together, in call order."""
    seen: set[str] = set()
    groups = []
    for name in layers:
        if name in seen:
            continue
        parent, _, child = name.rpartition(".")
        group = [name]
        for siblings in SHARED_INPUT:
            if child in siblings:
                prefix = f"{parent}." if parent else ""
                group = [prefix + s for s in siblings if prefix + s in layers]
        seen.update(group)
        groups.append(group)
    return groups


def _check_weights(name: str, module, adapters: list[str]) -> None:
    for adapter in adapters:
        for weight in (module.lora_A[adapter].weight, module.lora_B[adapter].weight):
            if weight.numel() == 0:
                raise RuntimeError(
                    f"rollout.fuse_lora: {name} is partitioned (ZeRO-3 without the rollout's gather); "
                    "set rollout.gather_parameters: true"
                )


def _fused_group(names: list[str], layers: dict) -> tuple[_Group | None, list[tuple[str, FusedLoraLinear]]]:
    """The stand-ins of one group of LoRA linears (:func:`_groups`) and their shared :class:`_Group`."""
    members = []
    for name in names:
        module = layers[name]
        adapters = _active(name, module)
        _check_weights(name, module, adapters)
        members.append([(module.lora_A[a].weight, module.lora_B[a].weight, float(module.scaling[a])) for a in adapters])
    dtypes = {w.dtype for m in members for a, b, _ in m for w in (a, b)}
    if len(dtypes) > 1:
        raise ValueError(
            f"rollout.fuse_lora: the adapters of {names} differ in dtype ({sorted(map(str, dtypes))}); "
            "set rollout.fuse_lora: false"
        )
    group = _Group(members) if dtypes else None
    stand_ins = [(name, FusedLoraLinear(layers[name].get_base_layer(), group, i)) for i, name in enumerate(names)]
    return group, stand_ins


@contextlib.contextmanager
def lora_fused(model):
    """Inside the block every peft ``lora.Linear`` of ``model`` is replaced in its parent by a
    :class:`FusedLoraLinear` computing the same output (module docstring); on exit peft's wrappers go back.
    Yields the number of replaced layers. Writes no weight."""
    layers = dict(_lora_linears(model))
    swapped: list[tuple[torch.nn.Module, str, torch.nn.Module]] = []
    groups: list[_Group] = []
    try:
        for names in _groups(layers):
            group, stand_ins = _fused_group(names, layers)
            groups += [group] if group is not None else []
            for name, stand_in in stand_ins:
                parent_name, _, child = name.rpartition(".")
                parent = model.get_submodule(parent_name)
                setattr(parent, child, stand_in)
                swapped.append((parent, child, layers[name]))
        yield len(swapped)
    finally:
        for parent, child, module in swapped:
            setattr(parent, child, module)
        for group in groups:
            group.forget()
