"""Reading what a training run left in its output_dir (metrics, file trees, DeepSpeed checkpoints), for the
integration tests.

    from run_files import assert_no_frozen_parameters, jsonl, metrics, tree_hash   # tests/ is on the path
"""

import hashlib
import json
from pathlib import Path

import torch


def jsonl(path) -> list[dict]:
    """The records of a .jsonl file (metrics.jsonl, eval.jsonl, a prompt file), one per line."""
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def metrics(run_dir) -> list[dict]:
    """The records of ``run_dir/metrics.jsonl``, one per step."""
    return jsonl(Path(run_dir) / "metrics.jsonl")


def tree_hash(root: Path) -> str:
    """One hash of every path and file content under ``root``: equal before and after = nothing touched."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(str(p.relative_to(root)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def _tensors(obj):
    if torch.is_tensor(obj):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


def assert_no_frozen_parameters(ds_dir):
    """The DeepSpeed state of a checkpoint holds no frozen (base model) parameter: every named tensor is a
    trainable parameter (the optimizer's param_shapes) or a buffer, and all its tensors together are at
    most 4 fp32 copies of the trainable parameters (module copy, fp32 master, Adam's two moments)."""
    states = [torch.load(f, weights_only=False, map_location="cpu") for f in sorted(ds_dir.glob("*.pt"))]
    models = [s for s in states if "module" in s]
    assert models, f"no model states in {ds_dir}"
    trainable = {}
    for s in models:
        for shapes in s["param_shapes"]:
            trainable.update(shapes)
    for s in models:
        assert s["frozen_param_fragments"] is None and s["frozen_param_shapes"] is None
        assert set(s["module"]) <= set(trainable) | set(s["buffer_names"]), set(s["module"]) - set(trainable)
    numel = sum(shape.numel() for shape in trainable.values())
    stored = sum(t.numel() * t.element_size() for s in states for t in _tensors(s))
    assert stored <= 4 * 4 * numel + 4096, (stored, numel)


def write_ds_files(checkpoint: Path, world: int, stage: int) -> None:
    """The files DeepSpeed writes into a checkpoint's ``ds/`` on ``world`` ranks at ZeRO ``stage`` (torch archives of
    nothing), for a test checkpoint that a resume's file check (lifecycle/checkpoint_files.py) takes as whole."""
    ds = checkpoint / "ds"
    ds.mkdir(parents=True, exist_ok=True)
    names = ["mp_rank_00_model_states.pt"] if stage < 3 else []
    names += [f"zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in range(world) if stage == 3]
    names += [f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(world) if stage >= 1]
    for name in names:
        torch.save({}, ds / name)
