"""Benchmarks of a GRPO step, phase by phase, plus side-by-side comparisons reported as ratios.

    python -m glm_grpo_ds.commands.bench [--model DIR] [--size 256] [--group-size 16] [--steps 3] [--out outputs/bench] [key=value ...]
    glm-grpo bench ...                      # the same

    # GPU, full-size random-init AR (LoRA r=64, 8-bit AdamW, checkpointing, ZeRO-3 world 1, G=16, 1024²):
    glm-grpo tiny-model /tmp/glm_full --full-size-ar
    glm-grpo bench --model /tmp/glm_full --size 1024 --group-size 16 lora.r=64 lora.alpha=128 model.dtype=bf16

Without ``--model`` it builds the tiny GLM-Image and its learnable dataset in a temp dir (CPU).
Prints a table and writes ``OUT/bench.json``. Measured:

* phases of ``Trainer.step`` (ZeRO-3, one process, LoRA, 8-bit AdamW, checkpointing): rollout
  tokens/s, decode images/s, reward images/s, update tokens/s, peak memory (median of the steps
  after a warm-up step);
* ``rollout_vs_pipeline``: our KV-cached rollout vs ``GlmImagePipeline.generate_prior_tokens``, same
  model, batch (G rows of one prompt) and size, tokens/s ratio;
* ``zero3_gathered_vs_sharded``: ZeRO-3 rollout on 2 ranks (``deepspeed --num_gpus 2``; CPU ranks
  without a GPU) with the parameters gathered once vs left sharded, tokens/s ratio;
* ``update_peak_mb2_vs_mbG``: peak memory of one update at micro-batch 2 vs micro-batch G, each in a
  fresh process (CPU: resident set, with glibc told to unmap freed blocks above 16 KiB so it
  follows the live tensors, its peak reset through /proc/self/clear_refs before the update; GPU:
  ``torch.cuda.max_memory_allocated`` after a reset).
"""

from __future__ import annotations

from dataclasses import dataclass

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

CONFIG = Path(__file__).resolve().parents[2] / "launch" / "configs" / "tiny_cpu.yaml"
ZERO3 = Path(__file__).resolve().parents[2] / "ds_configs" / "zero3.json"


# ----------------------------------------------------------------------------- memory probes
def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    else:
        Path("/proc/self/clear_refs").write_text("5")  # Linux: resets VmHWM (peak RSS) to the current RSS


@dataclass
class BenchConfig:
    """``glm-grpo bench``: phase throughputs and side-by-side ratios (see the module docstring)."""

    size: int = 256  # image height = width
    group_size: int = 16
    steps: int = 3  # timed training steps after one warm-up step
    repeats: int = 3  # repeats of each side-by-side comparison (median reported)
    out: str = "outputs/bench"


def _proc_status_bytes(field: str) -> int:
    """A size field of /proc/self/status (``VmHWM`` peak RSS, ``VmRSS`` current RSS) in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def peak_memory_bytes(device: torch.device) -> int:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else _proc_status_bytes("VmHWM")


def current_memory_bytes(device: torch.device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else _proc_status_bytes("VmRSS")


# ----------------------------------------------------------------------------- workers
def _trainer(a, extra: list[str]):
    from ..config import load_config
    from ..train import Trainer

    overrides = [
        f"model.path={a.model}", f"data.train_file={a.data}", f"output_dir={a.workdir}/run",
        f"rollout.height={a.size}", f"rollout.width={a.size}", f"grpo.group_size={a.group_size}",
        "batch.prompts_per_rank=1", "logging.progress_bar=false", "logging.plot=false", f"max_steps={a.steps + 1}",
        *a.overrides, *extra,
    ]
    return Trainer(load_config(a.config, overrides), a.deepspeed)


def _rollout(trainer, gather: bool, seed: int):
    from ..experience import sample

    gen = torch.Generator(device=trainer.device).manual_seed(seed)
    t0 = time.perf_counter()
    batch = sample(trainer.engine, trainer.processor, ["a red cube on a table"], gen, trainer.cfg, trainer.device, gather=gather)
    return batch, time.perf_counter() - t0


def worker_phases(a) -> dict:
    """Trainer.step phase timings and the rollout vs pipeline comparison, one process."""
    trainer = _trainer(a, [f"batch.micro_batch_size={a.micro_batch}"])
    records = [trainer.step(s) for s in range(a.steps + 1)][1:]  # step 0 warms up
    n = trainer.cfg.sequences_per_rank
    med = lambda key: statistics.median(r[key] for r in records)  # noqa: E731
    mem_key = "peak_gpu_memory_mb" if trainer.device.type == "cuda" else "peak_rss_mb"
    out = {
        "rollout_tokens_per_s": med("rollout_tokens_per_s"),
        "decode_images_per_s": n / med("time/decode"),
        "reward_images_per_s": n / med("time/reward"),
        "update_tokens_per_s": med("update_tokens_per_s"),
        "step_time_s": med("time/rollout") + med("time/decode") + med("time/reward") + med("time/update"),
        "time_split_s": {k: med(f"time/{k}") for k in ("rollout", "decode", "reward", "update")},
        "peak_memory_mb": max(r[mem_key] for r in records),
        "sequences": n,
    }
    if trainer.device.type == "cuda":
        out.update(_gpu_checks(trainer, a, out))
    # Ours vs the diffusers pipeline's own AR loop (HF generate): same weights (the pipeline loads
    # the same directory), G rows of one prompt, same size; our rollout here runs outside DeepSpeed.
    from diffusers import GlmImagePipeline

    pipe = GlmImagePipeline.from_pretrained(a.model, torch_dtype=trainer.dtype).to(trainer.device)
    ours, theirs = [], []
    for rep in range(a.repeats):
        batch, dt = _rollout(trainer, gather=True, seed=rep)
        ours.append(batch.completion_ids.numel() / dt)
        gen = torch.Generator(device=trainer.device).manual_seed(rep)
        t0 = time.perf_counter()
        with torch.no_grad():
            pipe.generate_prior_tokens(["a red cube on a table"] * n, a.size, a.size, device=trainer.device, generator=gen)
        theirs.append(batch.completion_ids.numel() / (time.perf_counter() - t0))
    out["rollout_ours_tokens_per_s"] = statistics.median(ours)
    out["rollout_pipeline_tokens_per_s"] = statistics.median(theirs)
    return out


# Peak HBM bandwidth (bytes/s) of GPUs we plan for; --hbm-gbps overrides.
HBM_BYTES_PER_S = {"H100": 3.35e12, "H200": 4.8e12, "A100": 2.04e12, "B200": 8.0e12}


def _gpu_checks(trainer, a, phases: dict) -> dict:
    """Planner vs measured peak, and the AR decode's fraction of the HBM-bandwidth roofline: every
    decode step reads all language-model weights once, so bytes/step / (s/step) vs peak bandwidth."""
    from ..ds import engine as ds_engine
    from ..ds.ds_config import read_ds_config
    from ..memory_plan import EstimateConfig, grid_tokens, model_sizes, plan

    sizes = model_sizes(trainer.cfg)
    est = EstimateConfig(num_gpus=1, num_nodes=1, gpu_memory_gb=torch.cuda.get_device_properties(0).total_memory / 2**30)
    planned = plan(trainer.cfg, read_ds_config(a.deepspeed), est, sizes)
    name = torch.cuda.get_device_name(0)
    peak_bw = a.hbm_gbps * 1e9 if a.hbm_gbps else next((v for k, v in HBM_BYTES_PER_S.items() if k in name), None)
    # language model + lm_head (+ adapters): the vision tower and VQ model do not run for text-to-image
    lm_params = sum(getattr(q, "ds_numel", q.numel()) for n, q in ds_engine.unwrap(trainer.engine).named_parameters()
                    if "language_model" in n or "lm_head" in n)
    bytes_per_step = lm_params * trainer.dtype.itemsize
    step_s = phases["time_split_s"]["rollout"] / grid_tokens(a.size, a.size)  # prefill folded in: a small overestimate
    out = {"planner_peak_mb": planned["total_bytes"] / 2**20, "measured_peak_mb": phases["peak_memory_mb"],
           "decode_step_s": step_s, "weight_bytes_per_step": bytes_per_step}
    if peak_bw:
        out["roofline_fraction"] = bytes_per_step / step_s / peak_bw
    return out


def worker_update_memory(a) -> dict:
    """Peak memory of one update (reference pass + micro-batched loss + step) above the pre-update level."""
    from ..grpo import group_advantages
    from ..update import grpo_update

    trainer = _trainer(a, [f"batch.micro_batch_size={a.micro_batch}", "grpo.beta=0.04"])
    batch, _ = _rollout(trainer, gather=True, seed=0)
    adv = group_advantages(torch.linspace(0, 1, len(batch)), trainer.cfg.grpo.group_size)
    grpo_update(trainer.engine, batch, adv, trainer.cfg, trainer.ref_engine)  # warm-up: optimizer states exist
    before = current_memory_bytes(trainer.device)
    reset_peak_memory(trainer.device)
    t0 = time.perf_counter()
    grpo_update(trainer.engine, batch, adv, trainer.cfg, trainer.ref_engine)
    return {"update_peak_above_start_mb": (peak_memory_bytes(trainer.device) - before) / 2**20,
            "update_time_s": time.perf_counter() - t0, "micro_batch": a.micro_batch}


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
    return {"world_size": trainer.world, "tokens_per_rank": tokens,
            "gathered_tokens_per_s": tokens * trainer.world / statistics.median(times[True]),
            "sharded_tokens_per_s": tokens * trainer.world / statistics.median(times[False])}


WORKERS = {"phases": worker_phases, "update-memory": worker_update_memory, "zero3-rollout": worker_zero3_rollout}


# ----------------------------------------------------------------------------- driver
def _run_worker(a, name: str, nprocs: int = 1, extra: tuple = ()) -> dict:
    """Each measurement in its own process(es): fresh peak-memory counters, one DeepSpeed init."""
    result = Path(a.workdir) / f"{name}{''.join(extra)}.json"
    args = ["--worker", name, "--result", str(result), "--model", a.model, "--data", a.data, "--workdir", a.workdir,
            "--size", str(a.size), "--group-size", str(a.group_size), "--steps", str(a.steps), "--repeats", str(a.repeats),
            "--config", a.config, "--deepspeed", a.deepspeed, *extra, *a.overrides]
    if a.hbm_gbps:
        args += ["--hbm-gbps", str(a.hbm_gbps)]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    if name == "update-memory":
        # glibc serves allocations above this size with mmap and unmaps them on free, so the
        # resident set follows the live tensors instead of keeping freed heap pages
        env["MALLOC_MMAP_THRESHOLD_"] = "16384"
    if nprocs > 1:
        launcher = shutil.which("deepspeed", path=str(Path(sys.executable).parent)) or "deepspeed"
        from ..ds.engine import free_port

        cmd = [launcher, "--num_gpus", str(nprocs), "--master_port", str(free_port()), "--module", "glm_grpo_ds.commands.bench", *args]
        if not torch.cuda.is_available():
            env["DS_ACCELERATOR"] = "cpu"
    else:
        cmd = [sys.executable, "-m", "glm_grpo_ds.commands.bench", *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0 or not result.is_file():
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-25:])
        raise RuntimeError(f"benchmark worker {name} failed ({proc.returncode}):\n{tail}")
    return json.loads(result.read_text())


def run_all(a) -> dict:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    res = {"device": torch.cuda.get_device_name(0) if device == "cuda" else f"cpu ({os.cpu_count()} cores)",
           "model": a.model, "size": a.size, "group_size": a.group_size, "steps": a.steps}
    res["phases"] = _run_worker(a, "phases", extra=("--micro-batch", "2"))
    res["phases"]["micro_batch"] = 2
    res["update_memory"] = {m: _run_worker(a, "update-memory", extra=("--micro-batch", str(m))) for m in (2, a.group_size)}
    res["zero3_rollout_2_ranks"] = _run_worker(a, "zero3-rollout", nprocs=2, extra=("--micro-batch", "2"))
    p, z, u = res["phases"], res["zero3_rollout_2_ranks"], res["update_memory"]
    res["ratios"] = {
        "rollout_ours_over_pipeline": p["rollout_ours_tokens_per_s"] / p["rollout_pipeline_tokens_per_s"],
        "zero3_gathered_over_sharded": z["gathered_tokens_per_s"] / z["sharded_tokens_per_s"],
        f"update_peak_mb2_over_mb{a.group_size}": u[2]["update_peak_above_start_mb"] / u[a.group_size]["update_peak_above_start_mb"],
    }
    return res


def format_table(r: dict) -> str:
    p, z, u = r["phases"], r["zero3_rollout_2_ranks"], r["update_memory"]
    g = r["group_size"]
    rows = [
        ("rollout (ZeRO-3, 1 rank)", f"{p['rollout_tokens_per_s']:,.0f} tokens/s"),
        ("decode (DiT + VAE)", f"{p['decode_images_per_s']:.2f} images/s"),
        ("reward", f"{p['reward_images_per_s']:.1f} images/s"),
        ("update (micro-batch 2)", f"{p['update_tokens_per_s']:,.0f} tokens/s"),
        ("step time", f"{p['step_time_s']:.2f} s (" + ", ".join(f"{k} {v:.2f}" for k, v in p["time_split_s"].items()) + ")"),
        ("peak memory", f"{p['peak_memory_mb']:,.0f} MB"),
        ("rollout: ours / pipeline", f"{r['ratios']['rollout_ours_over_pipeline']:.2f}x  "
                                      f"({p['rollout_ours_tokens_per_s']:,.0f} vs {p['rollout_pipeline_tokens_per_s']:,.0f} tokens/s)"),
        ("ZeRO-3 2 ranks: gathered / sharded", f"{r['ratios']['zero3_gathered_over_sharded']:.2f}x  "
                                                f"({z['gathered_tokens_per_s']:,.0f} vs {z['sharded_tokens_per_s']:,.0f} tokens/s)"),
        (f"update peak: mb 2 / mb {g}", f"{r['ratios'][f'update_peak_mb2_over_mb{g}']:.2f}  "
                                         f"({u[2]['update_peak_above_start_mb']:,.1f} vs {u[g]['update_peak_above_start_mb']:,.1f} MB above start)"),
    ]
    if "planner_peak_mb" in p:
        rows.append(("peak: measured / planner", f"{p['measured_peak_mb']:,.0f} / {p['planner_peak_mb']:,.0f} MB"))
        if "roofline_fraction" in p:
            rows.append(("AR decode vs HBM roofline", f"{100 * p['roofline_fraction']:.1f}% ({p['decode_step_s'] * 1e3:.1f} ms/step)"))
    head = f"device: {r['device']}; model: {r['model']}; {r['size']}x{r['size']}, G={g}, {r['steps']} timed steps"
    width = max(len(k) for k, _ in rows)
    return "\n".join([head] + [f"  {k:<{width}}  {v}" for k, v in rows])


def parse_args(argv):
    d = BenchConfig()
    p = argparse.ArgumentParser(prog="glm-grpo bench", description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="GLM-Image pipeline directory (default: build the tiny one)")
    p.add_argument("--data", default=None, help="prompt file (default: the tiny learnable set)")
    p.add_argument("--config", default=str(CONFIG), help="training YAML the runs start from")
    p.add_argument("--deepspeed", default=str(ZERO3))
    p.add_argument("--size", type=int, default=d.size)
    p.add_argument("--group-size", type=int, default=d.group_size)
    p.add_argument("--steps", type=int, default=d.steps, help="timed steps after one warm-up step")
    p.add_argument("--repeats", type=int, default=d.repeats, help="repeats of each side-by-side comparison")
    p.add_argument("--out", default=d.out)
    p.add_argument("--hbm-gbps", type=float, default=None, help="GPU memory bandwidth for the roofline (default: by device name)")
    p.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--workdir", help=argparse.SUPPRESS)
    p.add_argument("--micro-batch", type=int, default=2, help=argparse.SUPPRESS)
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("overrides", nargs="*", help="training config overrides (key=value), as for `glm-grpo train`")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if a.worker:
        from ..ds.dist import shutdown

        result = WORKERS[a.worker](a)
        if int(os.environ.get("RANK", "0")) == 0:
            Path(a.result).write_text(json.dumps(result))
        shutdown()
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="glm_grpo_bench_"))
    try:
        if a.model is None:
            from ..testing.tiny import build_tiny_pipeline

            a.model = str(build_tiny_pipeline(tmp / "tiny"))
        if a.data is None:  # the learnable prompt set, its targets rendered by this model's decoder
            from ..config import DecoderConfig
            from ..testing.tiny_data import write_tiny_dataset

            a.data = str(write_tiny_dataset(a.model, tmp / "data", a.size, a.size, DecoderConfig(num_inference_steps=2)))
        a.workdir = str(tmp)
        result = run_all(a)
    except RuntimeError as err:  # a worker failed: its own output tail is in the message
        print(f"glm-grpo bench: {err}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(result, indent=2))
    print(format_table(result))
    print(f"wrote {out / 'bench.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
