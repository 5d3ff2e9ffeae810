"""A checkpoint carried to another world size or ZeRO stage: DeepSpeed's universal checkpoint.

A DeepSpeed checkpoint (``ds/``, ds/io.py) holds each rank's flat partition of the optimizer state, cut for the world
size and ZeRO stage that wrote it. DeepSpeed's own converter (``python -m deepspeed.checkpoint.ds_to_universal``)
turns those partitions into one folder per parameter (``zero/<name>/fp32.pt``, ``exp_avg.pt``, ``exp_avg_sq.pt``,
``step.pt``), which an engine built with ``"checkpoint": {"load_universal": true}`` cuts again for its own ranks and
stage (:func:`load`). Around DeepSpeed's code, three things it does not do for us:

* bitsandbytes' 8-bit AdamW keeps its moments as uint8 codes with one absmax per 256 elements of a rank's flat
  partition (``state1``/``absmax1``/``qmap1``, ``state2``/...); the converter knows only ``exp_avg``/``exp_avg_sq``.
  :func:`convert` dequantizes each rank's moments into those names first (a staging copy of the optimizer files),
  and :func:`load` quantizes them again on the new partitioning (:func:`quantize_blocks`, bitsandbytes' layout and
  maps): blocks of 256 that fall where they fell before get their very codes back; a block the new partition cuts
  elsewhere gets another scale, so the state is not bit for bit (docs/checkpoints.md gives the measured difference).
* the engine reads the model-states file (lr scheduler, step counters) under its own stage's name
  (``mp_rank_00_model_states.pt`` at ZeRO-1/2, ``zero_pp_rank_0_mp_rank_00_model_states.pt`` at ZeRO-3): the
  converted folder holds it under both, so a checkpoint moves between stages too.
* ``universal/source.json`` names the DeepSpeed files it was made from; a folder that does not match its source is
  refused (:func:`check_converted`) rather than loaded.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from ..runtime import log
from ..runtime.file_modes import follow_umask

UNIVERSAL = "universal"  # the converted folder beside ds/ in a checkpoint (the tag the engine loads it by)
SOURCE = "source.json"
MODEL_STATES = ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt")  # ZeRO-1/2, ZeRO-3
BNB_BLOCK = 256  # bitsandbytes' 8-bit optimizers quantize their state in blocks of 256 (optim/optimizer.py)


def _load(path: Path):
    """A DeepSpeed checkpoint file, unpickling nothing but tensors, containers and the three DeepSpeed types its
    optimizer files hold (a stage enum, the loss scaler, the fragment addresses): no code runs from a file."""
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    with torch.serialization.safe_globals([ZeroStageEnum, LossScaler, fragment_address]):
        return torch.load(path, map_location="cpu", weights_only=True)


class ConversionError(RuntimeError):
    """DeepSpeed's converter failed or the converted folder does not match its source (the message says which)."""


def universal_config(ds_config: dict) -> dict:
    """``ds_config`` for an engine that loads a universal checkpoint (DeepSpeed reads the flag when the engine is
    built, not at the load)."""
    return {**ds_config, "checkpoint": {**ds_config.get("checkpoint", {}), "load_universal": True}}


def cannot_load(ds_config: dict) -> str | None:
    """Why an engine of ``ds_config`` cannot load a universal checkpoint, or None: DeepSpeed's NVMe optimizer offload
    restores its state from its own swap files and skips the ZeRO load (engine.load_checkpoint)."""
    if ds_config.get("zero_optimization", {}).get("offload_optimizer", {}).get("device") == "nvme":
        return (
            "zero_optimization.offload_optimizer.device=nvme cannot load a checkpoint of another world size or ZeRO "
            "stage (DeepSpeed restores NVMe-offloaded state from its own swap files): resume with offload to cpu or "
            "none, or on the world size and stage that wrote it"
        )
    return None


def source_record(ds_dir: Path) -> dict:
    """The DeepSpeed files a conversion is made from: name -> size (the ranks' files of one save)."""
    return {p.name: p.stat().st_size for p in sorted(ds_dir.iterdir()) if p.is_file()}


def check_converted(universal: Path, ds_dir: Path) -> bool:
    """True when ``universal`` holds a complete conversion of ``ds_dir``, False when there is none yet;
    ConversionError when it was made from other files (a checkpoint copied over another, a hand edit)."""
    record = universal / SOURCE
    if not record.is_file():
        if universal.is_dir() and any(universal.iterdir()):  # a hand-run conversion there would block ours
            raise ConversionError(
                f"{universal} was not made by glm-grpo's conversion of {ds_dir} (it has no {SOURCE}); delete "
                f"{universal} to convert the checkpoint"
            )
        return False
    made_from = json.loads(record.read_text(encoding="utf-8"))
    if made_from != source_record(ds_dir):
        raise ConversionError(
            f"{universal} was not converted from {ds_dir} (its {SOURCE} names other DeepSpeed files); delete "
            f"{universal} to convert the checkpoint again"
        )
    return True


BNB_PACKED = "__bnb_optimizer_quant_state__"  # where bitsandbytes >= 0.48's state_dict puts its 8-bit state


def _bnb(state: dict) -> dict:
    """A bitsandbytes state's own keys (``state1``, ``absmax1``, ...), packed in its state_dict or not."""
    return state.get(BNB_PACKED, state)


def _link(source: Path, target: Path) -> None:
    """``target`` the same file as ``source``: a hard link, a copy where the file system has none."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _base_state(sd: dict) -> dict:
    """The client optimizer's per-group state in a rank's optimizer file (ZeRO-1/2 and ZeRO-3 nest it apart)."""
    osd = sd["optimizer_state_dict"]
    inner = osd.get("base_optimizer_state", osd.get("optimizer_state_dict"))
    return inner["state"]


def _dequantized(state: dict) -> dict:
    """A bitsandbytes Adam state (8-bit or its 32-bit form for small tensors) as fp32 ``exp_avg``/``exp_avg_sq``."""
    import bitsandbytes.functional as F

    moments, step, state = {}, state["step"], _bnb(state)
    for key, name in (("1", "exp_avg"), ("2", "exp_avg_sq")):
        codes = state[f"state{key}"]
        if codes.dtype == torch.uint8:
            moments[name] = F.dequantize_blockwise(
                codes, absmax=state[f"absmax{key}"], code=state[f"qmap{key}"], blocksize=BNB_BLOCK
            ).float()
        else:
            moments[name] = codes.float()
    return {"step": step, **moments}


def _staged_8bit(ds_dir: Path, staging: Path) -> bool:
    """A copy of ``ds_dir`` in ``staging`` with every optimizer file's bitsandbytes state dequantized (the other files
    linked, not copied); False, nothing written, when the state is not bitsandbytes' (every rank's file holds the same
    optimizer: the first one tells, and each file is read once)."""
    optim = sorted(ds_dir.glob("*_optim_states.pt"))
    for i, path in enumerate(optim):
        sd = _load(path)
        state = _base_state(sd)
        if i == 0:
            if not any("state1" in _bnb(s) for s in state.values()):
                return False
            staging.mkdir(parents=True)
        for group, s in list(state.items()):
            state[group] = _dequantized(s)
        torch.save(sd, staging / path.name)
    for path in sorted(p for p in ds_dir.iterdir() if p.is_file() and p not in optim):
        _link(path, staging / path.name)
    return bool(optim)


def disk_plan(ds_dir: Path, eight_bit: bool) -> tuple[int, int, int]:
    """(bytes of ``ds_dir``, bytes the universal folder keeps, bytes the conversion holds at its peak). The converted
    state is ~12 bytes per trainable parameter (an fp32 weight and two fp32 moments), as much as an fp32 AdamW
    checkpoint's optimizer files and twice an 8-bit one's (4 + 2 bytes); while converting, DeepSpeed's converter
    keeps a temporary copy of the fragments as large again, and 8-bit moments first go through an fp32 copy of the
    optimizer files."""
    size = sum(f.stat().st_size for f in ds_dir.iterdir() if f.is_file())
    kept = 2 * size if eight_bit else size
    return size, kept, (3 * kept if eight_bit else 2 * kept)


def convert(ds_dir: Path, universal: Path, workers: int | None = None) -> None:
    """Rank 0, before any engine loads it: ``ds_dir`` (one save of every rank) into ``universal`` with DeepSpeed's
    converter, in a subprocess (its worker pool forks from a clean interpreter). Written inside ``<universal>.tmp/``
    and moved when complete, so a killed conversion leaves no folder that looks finished. ``workers``: the
    converter's extraction processes (default: half the CPUs, at most 8)."""
    workers = workers or max(1, min(8, (os.cpu_count() or 2) // 2))
    work = universal.with_name(universal.name + ".tmp")  # the converter also writes a `latest_universal` beside
    tmp, staging = work / universal.name, work / "dequantized"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    try:  # whatever happens, nothing but a complete `universal` stays
        _convert_in(ds_dir, universal, tmp, staging, workers)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _convert_in(ds_dir: Path, universal: Path, tmp: Path, staging: Path, workers: int) -> None:
    """:func:`convert`'s steps, written under ``tmp`` (and ``staging`` for 8-bit state) and moved to ``universal``."""
    try:
        source = staging if _staged_8bit(ds_dir, staging) else ds_dir
    except (KeyError, OSError, RuntimeError, pickle.UnpicklingError) as err:
        raise ConversionError(
            f"the optimizer state in {ds_dir} cannot be read ({err!r}); the checkpoint is unchanged"
        ) from err
    command = [
        sys.executable,
        "-m",
        "deepspeed.checkpoint.ds_to_universal",
        "--input_folder",
        str(source),
        "--output_folder",
        str(tmp),
        "--inject_missing_state",  # ZeRO-1/2 write the universal metadata only under tensor parallelism
        "--num_extract_workers",
        str(workers),
        "--num_merge_workers",
        str(max(1, workers // 2)),
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ConversionError(
            f"DeepSpeed's universal conversion of {ds_dir} failed (exit {done.returncode}): {tail[0]}; the checkpoint "
            f"is unchanged; resume it on its own world size and ZeRO stage, or run `{' '.join(command[1:3])} "
            f"--input_folder {ds_dir} --output_folder SCRATCH_DIR` to see the whole error (not into {universal}: "
            "the resume converts there itself)"
        )
    log.debug(done.stdout)
    # the engine reads the model-states file under its own stage's name: hold it under both
    have = [name for name in MODEL_STATES if (tmp / name).is_file()]
    if not have:
        raise ConversionError(f"DeepSpeed's universal conversion of {ds_dir} wrote no model-states file")
    for name in MODEL_STATES:
        if not (tmp / name).is_file():
            _link(tmp / have[0], tmp / name)
    try:
        _for_both_stages(tmp)
    except (KeyError, OSError, RuntimeError, pickle.UnpicklingError) as err:
        raise ConversionError(f"the universal checkpoint converted from {ds_dir} is incomplete ({err!r})") from err
    (tmp / SOURCE).write_text(json.dumps(source_record(ds_dir), indent=2), encoding="utf-8")
    follow_umask(tmp)
    os.replace(tmp, universal)


def _for_both_stages(universal: Path) -> None:
    """Complete the converted folder for the loader of the other stage. The converter writes the optimizer's common
    state (``zero/optimizer_state.pt``) in the source stage's layout: from ZeRO-3 the whole of rank 0's optimizer
    state dict (its moments included), from ZeRO-1/2 the param groups beside the wrapper's scalars, with the step in
    each parameter's ``step.pt``. ZeRO-3's loader reads the step from ``optimizer_state_dict.state[0]``; ZeRO-1/2's
    reads a ``ds_version``, each parameter's ``step.pt``, and its tensors as ``{"param": tensor}`` in the parameter's
    shape (ZeRO-3's converter writes bare flat tensors, which ZeRO-3's loader takes either way). All are written
    here, and rank 0's moments dropped from the common file (every rank of a ZeRO-3 load reads it whole; the moments
    are in the parameters' files)."""
    import deepspeed

    common = universal / "zero" / "optimizer_state.pt"
    sd = _load(common)
    params = [p for p in (universal / "zero").iterdir() if p.is_dir()]
    if "optimizer_state_dict" in sd:  # from ZeRO-3
        step = sd["optimizer_state_dict"]["state"][0]["step"]
        # its parameters' files hold bare flat tensors; ZeRO-1/2's loader reads {"param": tensor of the shape}
        model_states = _load(universal / MODEL_STATES[1])
        shapes = {name: shape for group in model_states["param_shapes"] for name, shape in group.items()}
        for param in params:
            for file in param.glob("*.pt"):
                value = _load(file)
                if torch.is_tensor(value) and file.stem != "step":
                    torch.save({"param": value.reshape(shapes[param.name])}, file)
            torch.save(step, param / "step.pt")
        sd.setdefault("ds_version", deepspeed.__version__)
    else:  # from ZeRO-1/2
        step = _load(params[0] / "step.pt") if params else 0
    sd["optimizer_state_dict"] = {"state": {0: {"step": step}}, "param_groups": sd["param_groups"]}
    torch.save(sd, common)


def load(engine, checkpoint_dir: Path) -> None:
    """Restore the weights, optimizer state, scheduler and step counters of ``checkpoint_dir/universal`` into an
    engine built with :func:`universal_config` (collective), cut for this world size and stage; bitsandbytes' 8-bit
    state then quantized on this rank's partition."""
    path, _ = engine.load_checkpoint(
        str(checkpoint_dir), tag=UNIVERSAL, load_optimizer_states=True, load_lr_scheduler_states=True
    )
    if path is None:
        raise ConversionError(f"no universal checkpoint in {checkpoint_dir / UNIVERSAL}")
    _requantize(engine.optimizer.optimizer, engine.optimizer)


def _partitions(optimizer, zero) -> list[tuple[int, int, torch.Tensor]]:
    """``(group index, index in the group, tensor)`` of each fp32 partition the inner ``optimizer`` steps. ZeRO-3
    fills its groups' ``params`` only during the step, one flat partition of a sub-group at a time (its
    ``_optimizer_step``): its partitions are the sub-groups', each the only one of its group then."""
    flats = getattr(zero, "fp32_partitioned_groups_flat", None)
    if flats is not None:
        return [(zero.sub_group_to_group_id[i], 0, flat) for i, flat in enumerate(flats)]
    return [(g, i, p) for g, group in enumerate(optimizer.param_groups) for i, p in enumerate(group["params"])]


def _requantize(optimizer, zero) -> None:
    """A bitsandbytes optimizer's state from the fp32 moments the universal load wrote (``exp_avg``/``exp_avg_sq``,
    a tensor ``step``): its own ``init_state`` for this partition's tensors, then the moments quantized into them."""
    if not hasattr(optimizer, "init_state"):
        return  # torch AdamW, DeepSpeed's CPU Adam: the universal load wrote their own state names
    for gindex, pindex, p in _partitions(optimizer, zero):
        group = optimizer.param_groups[gindex]
        loaded = optimizer.state.get(p, {})
        if "exp_avg" not in loaded:
            continue
        moments = (loaded.pop("exp_avg"), loaded.pop("exp_avg_sq"))
        step = int(loaded.pop("step"))
        loaded.clear()
        params = group["params"]
        group["params"] = params or [p]  # ZeRO-3's are empty but in its step, which sets [the partition] (bnb reads it)
        optimizer.init_state(group, p, gindex, pindex)
        group["params"] = params
        state = optimizer.state[p]
        for key, moment in zip(("1", "2"), moments):
            target = state[f"state{key}"]
            moment = moment.to(device=target.device, dtype=torch.float32).reshape(target.shape)
            if target.dtype == torch.uint8:
                codes, scales = quantize_blocks(moment, state[f"qmap{key}"])
                target.copy_(codes.view_as(target))
                state[f"absmax{key}"].copy_(scales)
            else:
                target.copy_(moment)
        state["step"] = step


def quantize_blocks(
    values: torch.Tensor, qmap: torch.Tensor, block: int = BNB_BLOCK
) -> tuple[torch.Tensor, torch.Tensor]:
    """``values`` in bitsandbytes' blockwise 8-bit layout (one uint8 index into ``qmap`` per value, one scale per
    ``block`` values; value = qmap[code] * scale), each block scaled so that both its largest and its most negative
    value are codes of the map. bitsandbytes' own ``quantize_blockwise`` scales by the largest magnitude, so a block
    whose extreme is negative (the signed map ends at -0.993 and +1.0) comes back one code off after a dequantize:
    through this, a state dequantized and quantized again on the same blocks gets its very codes and scales back
    (tests/unit/test_portable.py), and only blocks the new partition cuts elsewhere change."""
    flat = values.flatten().float()
    rows = torch.nn.functional.pad(flat, (0, (-flat.numel()) % block)).view(-1, block)
    scale = rows.amax(1).clamp_min(0) / qmap.max()
    if qmap.min() < 0:
        scale = torch.maximum(scale, rows.amin(1).clamp_max(0) / qmap.min())
    normalized = rows / torch.where(scale > 0, scale, torch.ones_like(scale))[:, None]
    ordered, order = qmap.sort()
    nearest = torch.bucketize(normalized, (ordered[1:] + ordered[:-1]) / 2)
    return order[nearest].to(torch.uint8).flatten()[: flat.numel()], scale
