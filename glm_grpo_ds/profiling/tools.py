"""The one list of ``glm-grpo profile`` tools (:data:`PROFILE_TOOLS`): what each runs, its one-line help, its
synopsis, its description and example. ``glm-grpo profile --help`` (commands/profile.py), each ``glm-grpo profile
TOOL --help`` (:func:`parser_for`) and the ``profile`` rows of docs/commands.md's table (commands/cli.py) are made
from it; a new profiler is one entry here.
"""

from __future__ import annotations

from ..runtime.cli_help import Command as ProfileTool

PROFILE_TOOLS: dict[str, ProfileTool] = {
    "bench": ProfileTool(
        "glm_grpo_ds.profiling.bench",
        "benchmark rollout / decode / reward / update and print side-by-side ratios",
        usage=(
            "glm-grpo profile bench [--model DIR\\|ID [--revision R] --data FILE] [--config CFG] [--deepspeed DS.json] "
            "[--size 256] [--group-size 16] "
            "[--steps 3] [--repeats 3] [--out outputs/bench] [--hbm-gbps X] [--count-variants V,...\\|none] "
            "[--gathers [--gathers-micro-batches 2,4,8]] [key=value ...]"
        ),
        doc=(
            "phase throughputs and side-by-side ratios (same as `python -m glm_grpo_ds.profiling.bench`); table "
            "+ `OUT/bench.json`; its `decode_step_counts` section: kernels, module calls, Python calls, host syncs "
            "and tokens/s per decode step of HF generate and the eager / merged / compiled loops, extrapolated to "
            "40 layers (`glm-grpo profile decode-counts` alone; "
            "[benchmarks-2026-11-early.md](benchmarks-2026-11-early.md#glm-grpo-profile-bench-on-the-tiny-model)); "
            "`--gathers`: only what a "
            "LoRA step gathers under ZeRO-3 on 2 ranks per micro-batch size, `OUT/bench_gathers.json` "
            "([memory-and-speed.md](memory-and-speed.md#what-a-step-gathers-under-zero-3))"
        ),
        example=(
            "glm-grpo profile bench --model /tmp/glm_full --data prompts.jsonl --size 1024 --group-size 16 lora.r=64 "
            "model.dtype=bf16"
        ),
        code="(its measurements: `profiling/bench_workers.py`)",
    ),
    "decode-counts": ProfileTool(
        "glm_grpo_ds.profiling.decode_counts",
        "count what one decode step launches (kernels, module calls, Python calls, host syncs) per loop, and tokens/s",
        usage=(
            "glm-grpo profile decode-counts [--layers 2,4] [--group-size 16] [--size 256] [--lora-r 16] [--steps 128] "
            "[--rounds 3] [--variants hf_generate,eager,...] [--device D] [--threads 1] [--seed 0] [--out FILE]"
        ),
        doc=(
            "per decode step of HF generate and the rollout's decode loops (eager LoRA, merged, fused, compiled "
            "step, and the plain model without peft): kernels, module calls, Python calls and host syncs "
            "(deterministic) and tokens/s, on the tiny model at two layer counts extrapolated to GLM-Image's 40, "
            "as ratios over the eager LoRA loop; the `decode_step_counts` section of `glm-grpo profile bench` "
            "([benchmarks-2026-11-early.md](benchmarks-2026-11-early.md#per-decode-step-kernels-module-calls-"
            "python-calls-host-syncs-decode_step_counts))"
        ),
        example="glm-grpo profile decode-counts --layers 2,4 --group-size 16 --size 256 --out counts.json",
        code="(counters: `profiling/decode_counters.py`, report: `profiling/decode_counts_report.py`)",
    ),
    "decode-timing": ProfileTool(
        "glm_grpo_ds.profiling.decode_timing",
        "time the rollout's decode step per variant (eager, LoRA merged, CUDA graph, compiled, HF generate)",
        usage=(
            "glm-grpo profile decode-timing [--model random:glm-image\\|DIR \\| --tiny] [--layers N] [--group-size 16] "
            "[--size 1024] [--steps 64] [--lora-r 64] [--temperature T] [--top-k K] [--top-p P] "
            "[--variants eager,merged,...] [--device D] [--hbm-gbps X] [--seed N] [--out FILE]"
        ),
        doc=(
            "builds the full-size AR (random weights, LoRA) on the GPU, times `--steps` decode steps per variant with "
            "CUDA events from one prefill and the same noise, checks each variant's tokens against its reference, "
            "prints ms per step, tokens/s, x eager and the HBM roofline fraction; `launch/gpu_timing.sh` adds one "
            "training step ([memory-and-speed.md](memory-and-speed.md#the-decode-step-on-a-gpu))"
        ),
        example="glm-grpo profile decode-timing --layers 8 --steps 64",
        code="(the models: `profiling/decode_models.py`)",
    ),
    "dit-timing": ProfileTool(
        "glm_grpo_ds.profiling.dit_timing",
        "time the frozen DiT decode per variant (attention kernels, compiled blocks, FP8) and compare its images",
        usage=(
            "glm-grpo profile dit-timing --model DIR\\|ID [--variants sdpa,compiled,fp8,...] [--batch 8] [--size 1024] "
            "[--steps 1,3] [--guidance 1.5] [--repeats 2] [--seed 0] [--device auto] [--out FILE]"
        ),
        doc=(
            "decodes one batch of one prompt with the trainer's frozen decoder per variant (`sdpa`: diffusers' "
            "pipeline as it is, the reference; the other attention kernels, `compiled`, `fp8`, `fp8_compiled`, "
            "`cudnn_compiled`, `fp8_cudnn_compiled`) from the same prior tokens and seeds, times the decodes at two "
            "step counts (CUDA events) and prints seconds per guided image-step, x sdpa, the setup (compile) seconds,"
            " the images' largest difference and PSNR against sdpa's, the DiT's and the peak GPU memory; a variant "
            "this device cannot run is listed as skipped; `launch/gpu_timing.sh` runs it on the full-size model "
            "([memory-and-speed.md](memory-and-speed.md#the-dit-decode-compile-fp8-guidance-and-one-step-off))"
        ),
        example="glm-grpo profile dit-timing --model outputs/glm_image --variants sdpa,compiled,fp8,fp8_compiled",
    ),
}


def parser_for(tool: str, **kwargs):
    """The ``argparse`` parser of ``glm-grpo profile TOOL``: its :data:`PROFILE_TOOLS` entry's ``doc`` as the
    description (plain text) and its ``example``, every option's default shown (runtime/cli_help.py)."""
    from ..runtime.cli_help import command_parser, plain

    entry = PROFILE_TOOLS[tool]
    text = plain(entry.doc).removesuffix(".")
    return command_parser(f"glm-grpo profile {tool}", f"{text[:1].upper()}{text[1:]}.", entry.example, **kwargs)
