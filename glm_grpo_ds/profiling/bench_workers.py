"""The measurements of ``glm-grpo profile bench``, each run in its own process(es) by glm_grpo_ds/profiling/bench.py
(``--worker NAME``): fresh peak-memory counters and one DeepSpeed initialisation per measurement."""

from __future__ import annotations

import statistics
import time
from dataclasses import replace

import torch

from ..runtime.memory_probe import current_bytes, peak_bytes, reset_peak

BENCH_PROMPT = "a red cube on a table"  # the one prompt of every rollout measurement


# ----------------------------------------------------------------------------- workers
def _trainer(a, extra: list[str]):
    from ..config import load_config
    from ..train import Trainer

    overrides = [
        f"model.path={a.model}",
        f"data.train_file={a.data}",
        f"output_dir={a.workdir}/run",
        "overwrite_output_dir=true",  # scratch: every worker starts its own trainer there
        f"rollout.height={a.size}",
        f"rollout.width={a.size}",
        f"grpo.group_size={a.group_size}",
        "batch.prompts_per_rank=1",
        "logging.progress_bar=false",
        "logging.plot=false",
        f"max_steps={a.steps + 1}",
        *a.overrides,
        *extra,
    ]
    return Trainer.from_config(load_config(a.config, overrides), a.deepspeed)


def _rollout(trainer, gather: bool, seed: int, compile: bool = False, cast: bool = False):
    from ..rollout.backends import EngineSampler

    cfg = replace(
        trainer.run.cfg, rollout=replace(trainer.run.cfg.rollout, compile=compile, adapters_in_model_dtype=cast)
    )
    sampler = EngineSampler(
        trainer.run.engine,
        trainer.run.processor,
        cfg,
        trainer.run.device,
        gather=gather,
        base_copy=trainer.run.base_copy,
    )
    t0 = time.perf_counter()
    batch = sampler.sample([BENCH_PROMPT], [seed], cfg.grpo.group_size).batch
    return batch, time.perf_counter() - t0


def worker_phases(a) -> dict:
    """Trainer.step phase timings and the rollout vs pipeline comparison, one process."""
    trainer = _trainer(a, [f"batch.micro_batch_size={a.micro_batch}"])
    records = [trainer.step(s) for s in range(a.steps + 1)][1:]  # step 0 warms up
    n = trainer.run.cfg.sequences_per_rank
    med = lambda key: statistics.median(r[key] for r in records)  # noqa: E731
    mem_key = "peak_gpu_memory_mb" if trainer.run.device.type == "cuda" else "peak_rss_mb"
    out = {
        "rollout_tokens_per_s": med("rollout_tokens_per_s"),
        "decode_images_per_s": n / med("time/decode"),
        "reward_images_per_s": n / med("time/reward"),
        "update_tokens_per_s": med("update_tokens_per_s"),
        # the image statistics and diversity of the monitor (monitoring/image_stats.py), on the step's images
        "image_stats_ms": 1e3 * med("time/image_stats"),
        "image_stats_over_decode": med("time/image_stats") / med("time/decode"),
        "step_time_s": med("time/rollout") + med("time/decode") + med("time/reward") + med("time/update"),
        "time_split_s": {k: med(f"time/{k}") for k in ("rollout", "decode", "reward", "update")},
        "peak_memory_mb": max(r[mem_key] for r in records),
        "sequences": n,
    }
    if trainer.run.device.type == "cuda":
        out.update(_gpu_checks(trainer, a, out))
    # Ours vs the diffusers pipeline's own AR loop (HF generate): same weights (the pipeline loads
    # the same directory), G rows of one prompt, same size; our rollout here runs outside DeepSpeed.
    from ..decoder.image_decoder import load_pipeline

    pipe = load_pipeline(a.model, trainer.run.dtype, trainer.run.device).to(trainer.run.device)
    variants = {"compiled": lambda seed: _rollout(trainer, gather=True, seed=seed, compile=True)}
    if trainer.run.cfg.lora is not None and trainer.run.dtype != torch.float32:  # peft's fp32 adapters on a bf16 base
        variants["cast"] = lambda seed: _rollout(trainer, gather=True, seed=seed, cast=True)
    out.update(
        rollout_vs_pipeline(
            lambda seed: _rollout(trainer, gather=True, seed=seed),
            pipe,
            n,
            a.size,
            trainer.run.device,
            a.repeats,
            variants,
        )
    )
    return out


def rollout_vs_pipeline(
    ours, pipe, rows: int, size: int, device: torch.device, repeats: int, variants: dict | None = None
) -> dict:
    """Tokens/s of our rollout vs ``pipe.generate_prior_tokens`` (HF generate), alternating, median of
    ``repeats``. ``ours(seed) -> (batch, seconds)`` samples ``rows`` rows of BENCH_PROMPT at ``size``²;
    both are credited with our batch's token count (the pipeline generates the same grids + end token).
    ``variants``: name -> ours with other settings (``compiled``: ``rollout.compile``; ``cast``:
    ``rollout.adapters_in_model_dtype``), each after an untimed first call (a compile), reported as
    ``rollout_<name>_tokens_per_s``. Also used by benchmarks/slice_report.py on the real-width slice."""
    variants = variants or {}
    ours_tps, theirs_tps = [], []
    variant_tps: dict[str, list[float]] = {name: [] for name in variants}
    for run in variants.values():
        run(0)
    for rep in range(repeats):
        batch, dt = ours(rep)
        ours_tps.append(batch.completion_ids.numel() / dt)
        for name, run in variants.items():
            _, dt = run(rep)
            variant_tps[name].append(batch.completion_ids.numel() / dt)
        gen = torch.Generator(device=device).manual_seed(rep)
        t0 = time.perf_counter()
        with torch.no_grad():
            pipe.generate_prior_tokens([BENCH_PROMPT] * rows, size, size, device=device, generator=gen)
        theirs_tps.append(batch.completion_ids.numel() / (time.perf_counter() - t0))
    out = {
        "rollout_ours_tokens_per_s": statistics.median(ours_tps),
        "rollout_pipeline_tokens_per_s": statistics.median(theirs_tps),
    }
    out.update({f"rollout_{name}_tokens_per_s": statistics.median(tps) for name, tps in variant_tps.items()})
    return out


# Peak HBM bandwidth (bytes/s) of GPUs we plan for; --hbm-gbps overrides.
HBM_BYTES_PER_S = {"H100": 3.35e12, "H200": 4.8e12, "A100": 2.04e12, "B200": 8.0e12}


def _gpu_checks(trainer, a, phases: dict) -> dict:
    """Planner vs measured peak, and the AR decode's fraction of the HBM-bandwidth roofline: every
    decode step reads all language-model weights once, so bytes/step / (s/step) vs peak bandwidth."""
    from ..ds import engine as ds_engine
    from ..ds.ds_config import read_ds_config
    from ..memory.plan import EstimateConfig, grid_tokens, plan
    from ..memory.sizes import model_sizes

    sizes = model_sizes(trainer.run.cfg)
    est = EstimateConfig(
        num_gpus=1, num_nodes=1, gpu_memory_gb=torch.cuda.get_device_properties(0).total_memory / 2**30
    )
    planned = plan(trainer.run.cfg, read_ds_config(a.deepspeed), est, sizes)
    name = torch.cuda.get_device_name(0)
    peak_bw = a.hbm_gbps * 1e9 if a.hbm_gbps else next((v for k, v in HBM_BYTES_PER_S.items() if k in name), None)
    # language model + lm_head (+ adapters): the vision tower and VQ model do not run for text-to-image
    lm_params = sum(
        getattr(q, "ds_numel", q.numel())
        for n, q in ds_engine.unwrap(trainer.run.engine).named_parameters()
        if "language_model" in n or "lm_head" in n
    )
    bytes_per_step = lm_params * trainer.run.dtype.itemsize
    step_s = phases["time_split_s"]["rollout"] / grid_tokens(a.size, a.size)  # prefill folded in: a small overestimate
    out = {
        "planner_peak_mb": planned["total_bytes"] / 2**20,
        "measured_peak_mb": phases["peak_memory_mb"],
        "decode_step_s": step_s,
        "weight_bytes_per_step": bytes_per_step,
    }
    if peak_bw:
        out["roofline_fraction"] = bytes_per_step / step_s / peak_bw
    return out


def worker_update_memory(a) -> dict:
    """Peak memory of one update (reference pass + micro-batched loss + step) above the pre-update level."""
    from ..advantages import group_advantages
    from ..update import grpo_update

    trainer = _trainer(a, [f"batch.micro_batch_size={a.micro_batch}", "grpo.beta=0.04"])
    batch, _ = _rollout(trainer, gather=True, seed=0)
    adv = group_advantages(torch.linspace(0, 1, len(batch)), trainer.run.cfg.grpo.group_size)
    grpo_update(
        trainer.run.engine, batch, adv, trainer.run.cfg, trainer.run.ref_engine
    )  # warm-up: optimizer states exist
    before = current_bytes(trainer.run.device)
    reset_peak(trainer.run.device)
    t0 = time.perf_counter()
    grpo_update(trainer.run.engine, batch, adv, trainer.run.cfg, trainer.run.ref_engine)
    return {
        "update_peak_above_start_mb": (peak_bytes(trainer.run.device) - before) / 2**20,
        "update_time_s": time.perf_counter() - t0,
        "micro_batch": a.micro_batch,
    }


def worker_zero3_rollout(a) -> dict:
    """Alternate gathered / sharded ZeRO-3 rollouts (all ranks take part in both)."""
    trainer = _trainer(a, [f"batch.micro_batch_size={a.micro_batch}"])
    _rollout(trainer, gather=True, seed=99)  # warm-up
    times = {True: [], False: []}
    tokens = 0
    for rep in range(a.repeats):
        for gather in (True, False):
            batch, dt = _rollout(trainer, gather, seed=rep)
            times[gather].append(dt)
            tokens = batch.completion_ids.numel()
    return {
        "world_size": trainer.run.world,
        "tokens_per_rank": tokens,
        "gathered_tokens_per_s": tokens * trainer.run.world / statistics.median(times[True]),
        "sharded_tokens_per_s": tokens * trainer.run.world / statistics.median(times[False]),
    }


def worker_zero3_gathers(a) -> dict:
    """What one LoRA step gathers under ZeRO-3 (DeepSpeed's comms logger), with the reference log-probs
    computed in the update through the engine (``before``: as until 2026-11-25) and inside the rollout's
    gather (``after``: the trainer now), in units of the whole AR (1.0 = every parameter gathered once)."""
    from ..advantages import group_advantages
    from ..ds import engine as ds_engine
    from ..rollout.backends import EngineSampler
    from ..update import grpo_update, logprobs_before_update

    trainer = _trainer(a, [f"batch.micro_batch_size={a.micro_batch}", "grpo.beta=0.04"])
    cfg, engine = trainer.run.cfg, trainer.run.engine
    ar_bytes = ds_engine.parameter_bytes(engine)

    def whole_ars(counts) -> float:  # the logger records each rank's shard of an all-gather
        return sum(c["bytes"] for name, c in counts.items() if "gather" in name) * trainer.run.world / ar_bytes

    def step(in_rollout: bool) -> dict:
        fn = (lambda policy, batch: logprobs_before_update(policy, batch, cfg)) if in_rollout else None
        sampler = EngineSampler(
            engine, trainer.run.processor, cfg, trainer.run.device, fn, base_copy=trainer.run.base_copy
        )
        with ds_engine.counted_comms() as rollout:
            got = sampler.sample([BENCH_PROMPT], [0], cfg.grpo.group_size)
        batch = got.batch
        adv = group_advantages(torch.linspace(0, 1, len(batch)), cfg.grpo.group_size)
        with ds_engine.counted_comms() as update:
            grpo_update(
                engine, batch, adv, cfg, trainer.run.ref_engine, ref_logps=got.ref_logps, old_logps=got.old_logps
            )
        return {"rollout": whole_ars(rollout), "update": whole_ars(update)}

    step(False)  # warm-up: optimizer states, the prefetch trace
    before, after = step(False), step(True)
    return {
        "micro_batch": a.micro_batch,
        "sequences": cfg.sequences_per_rank,
        "world_size": trainer.run.world,
        "before": {**before, "step": before["rollout"] + before["update"]},
        "after": {**after, "step": after["rollout"] + after["update"]},
    }


def worker_decode_counts(a) -> dict:
    """Per decode step: kernels, module calls, Python calls, host syncs and tokens/s of HF generate and the decode
    loop's variants (eager LoRA, merged, compiled), on the tiny model's configuration at 2 and 4 layers with random
    weights, extrapolated to 40 layers, one CPU thread (glm_grpo_ds/profiling/decode_counts.py; ``--model`` is not
    read)."""
    from .decode_counts import decode_counts

    variants = [v for v in a.count_variants.split(",") if v]
    return decode_counts((2, 4), variants, group_size=a.group_size, size=a.size, threads=1)


WORKERS = {
    "decode-counts": worker_decode_counts,
    "phases": worker_phases,
    "update-memory": worker_update_memory,
    "zero3-rollout": worker_zero3_rollout,
    "zero3-gathers": worker_zero3_gathers,
}
