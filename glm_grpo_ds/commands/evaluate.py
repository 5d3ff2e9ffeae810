"""``glm-grpo evaluate``: did the run help? The base model against one or more adapters (or a full fine-tuning's
``final_model/``: its weights swapped into the one model, model/weight_sets.py) on the same prompts with paired seeds,
per reward: means, the paired difference with a 95 % interval over prompts, the win rate.

    glm-grpo evaluate --config launch/configs/tiny_world.yaml model.path=outputs/world/model \\
        --adapter outputs/world_run/final_adapter --prompts outputs/world/heldout.jsonl --samples-per-prompt 4
    glm-grpo evaluate --model zai-org/GLM-Image --adapter outputs/glm_image_lora/final_adapter \\
        --prompts my_eval.jsonl --rewards ocr --samples-per-prompt 4 --seed 0 --out outputs/evaluate

Everything not given comes from ``--config`` (a training config: model, rewards with their arguments, image
size, sampling, the evaluation decode ``eval.*``, by default the pipeline's own 50 steps) or from the
training defaults; ``--model``, ``--prompts`` and ``--rewards NAME ...`` replace the config's. Without
``--config``, the run that wrote the first ``--adapter`` (its ``config.json`` beside ``final_adapter/`` or above
``checkpoints/step_N/adapter/``) gives what its own evaluation used (:data:`RUN_KEYS`: model, image size,
sampling, the ``eval.*`` decode, seed and K, rewards), one line naming the file and the keys; a flag or a
``key=value`` given here wins. Without either and without ``--rewards``, one line says to give ``--rewards``.
Before sampling, a line says what is coming (models x prompts x samples, size, decode); the count of prompts
follows, at least every 30 s in a log (runtime/progress_count.py). Sampling is
paired (glm_grpo_ds/evaluation/paired.py): every model draws prompt i's tokens with the same noise and decodes
them with the same seed, so the base against itself differs by exactly 0 and the differences measure the
adapters, not the seeds. The seeds follow the in-training evaluation's scheme (evaluation/seeds.py) and
``--seed`` / ``--samples-per-prompt`` / ``--num-prompts`` default to ``eval.seed`` / ``eval.group_size`` /
``eval.num_prompts``: with the run's config, the adapter's figures are the run's final evaluation's samples.
The rewards the adapter's run trained on are marked ``trained on``; the others ``out of domain``
(docs/evaluate.md says why both matter). ``--category-key`` (default ``category``) breaks the results down by
that column when the prompts have it.

Writes ``OUT/evaluate.json`` (settings and every figure), ``OUT/gallery.png`` (per prompt: base | adapter ...),
``OUT/evaluate.png`` (the differences with their intervals) and ``OUT/report.html`` (all of it in one page a person
opens: the protocol, the reward and image-statistics tables, the run's alarms, the images per category;
evaluation/html_report.py), and prints the table. Resumable: every
finished batch of prompts is kept in ``OUT/progress/``, and the same command run again (after an
interruption, or to print the table again) samples only what is missing; other settings with the same
``--out`` are refused unless ``--fresh``, and the settings hold the content of the prompt rows and of each
adapter's weights (sha256), so a prompt file or an adapter changed in place counts as other settings. With
``--export``, a stored batch whose exported files are gone is sampled again, so a resumed export is complete.
A GPU that runs out of memory ends the command with one line and exit 8 (memory/oom.py): while sampling,
:func:`oom_line` (where, torch's figures, the setting that makes that phase smaller, the batches kept); elsewhere
(loading the models, the report) where and torch's figures.

The prompts (``--prompts``, else ``eval.file``) are read as training reads ``eval.file``: any source
``data.train_file`` takes (glm_grpo_ds/data/: ``.txt``, ``.jsonl`` such as LongText-Bench's, CVTG-2K's ``.json``,
tables, dataset directories, Hub dataset ids) with ``eval.split`` / ``eval.revision``.

Several GPUs: ``deepspeed --num_gpus 8 --module glm_grpo_ds.commands.evaluate ...`` (or a hostfile): each rank
samples a contiguous share of the prompts with its own copy of the models (the AR, the decoder and the rewards
must fit one device), rank 0 gathers the rewards and writes the report; each prompt's seeds are its own, so the
figures do not depend on the rank count (up to the batches' floating-point rounding).

Here: the arguments, the run (load the models, sample, score) and the console. The settings (the config, the
adapter's run's, the prompt rows, what is recorded and checked on resume) are in evaluate_settings.py; the
exports, the ranks' results joined and rank 0's report in evaluate_report.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from ..runtime.atomic_files import write_text_atomic
from .cli import parser_for
from .evaluate_report import export_hook, gather_results, write_report
from .evaluate_settings import PROGRESS, load_settings, progress_store, read_rows, run_settings


def parse_args(argv: list[str]) -> argparse.Namespace:
    from ..config.arguments import parse_with_overrides

    p = parser_for("evaluate")
    p.add_argument(
        "--config",
        default=None,
        help="a training config (YAML): model, rewards, size, sampling, eval.* (default: the adapter's run's)",
    )
    p.add_argument("--model", default=None, help="pipeline directory or Hub id (replaces model.path)")
    p.add_argument(
        "--adapter",
        action="append",
        default=[],
        help="a LoRA adapter, or a full fine-tuning's final_model/, to compare with the base (repeatable)",
    )
    p.add_argument("--prompts", default=None, help="the prompt file or dataset (default: eval.file of the config)")
    p.add_argument(
        "--rewards",
        nargs="+",
        default=None,
        metavar="NAME",
        help="reward names, e.g. --rewards pixel_mse ssim (replace the config's or the adapter's run's)",
    )
    p.add_argument(
        "--num-prompts", type=int, default=None, help="the first N prompts (0 = all; default: eval.num_prompts)"
    )
    p.add_argument(
        "--samples-per-prompt", type=int, default=None, help="K samples per prompt and model (default: eval.group_size)"
    )
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seeds every prompt's rollout noise and decode (default: eval.seed, as the run's own evaluation)",
    )
    p.add_argument("--category-key", default="category", help="break the results down by this prompt column")
    p.add_argument("--batch-prompts", type=int, default=4, help="prompts rolled out together")
    p.add_argument("--gallery-prompts", type=int, default=16, help="prompts in gallery.png")
    p.add_argument(
        "--thumbnail",
        type=int,
        default=None,
        help="longest side of a gallery.png tile in pixels, never upscaled (default: logging.gallery_thumbnail, 128)",
    )
    p.add_argument("--device", default="auto", help="auto = cuda when available, else cpu")
    p.add_argument("--out", default="outputs/evaluate", help="output directory")
    p.add_argument(
        "--export",
        nargs=2,
        action="append",
        metavar=("LAYOUT", "DIR"),
        default=[],
        help="also write every model's images in a benchmark's layout: geneval, dpg, longtext or oneig "
        "(glm_grpo_ds/evaluation/exports.py); repeatable",
    )
    p.add_argument(
        "--fresh", action="store_true", help="discard the finished batches OUT/progress/ holds and sample everything"
    )
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)  # the launcher's
    p.add_argument("overrides", nargs="*", help="config overrides, key=value (as for glm-grpo train)")
    args = parse_with_overrides(p, argv)
    # --rewards takes every word after it, overrides too (`--rewards pixel_mse rollout.height=128`); a reward name
    # never holds "=", a config override always does: those go back to the overrides
    if args.rewards:
        args.overrides += [word for word in args.rewards if "=" in word]
        args.rewards = [word for word in args.rewards if "=" not in word] or None
    return args


def start_ranks(device_flag: str) -> tuple[int, int, int, torch.device]:
    """``(rank, world size, local rank, device)``: under the deepspeed launcher (WORLD_SIZE > 1) the process
    group is started and each rank takes its own GPU (CPU ranks on a machine without one); else one process."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from ..ds import engine as ds_engine

        return ds_engine.init_distributed()
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    return 0, 1, 0, torch.device(auto if device_flag == "auto" else device_flag)


def start_line(models: int, prompts: int, k: int, cfg, decode) -> str:
    """What the evaluation is about to sample: models x prompts x samples, the size, the decode and the rewards."""
    steps, guidance = decode.num_inference_steps, decode.guidance_scale
    return (
        f"evaluate: {models} model{'s' * (models > 1)} x {prompts} prompts x {k} samples = {models * prompts * k} "
        f"images at {cfg.rollout.height}x{cfg.rollout.width}, decoded with {steps} DiT step{'s' * (steps != 1)} "
        f"(guidance {guidance:g}), rewards {', '.join(r.name for r in cfg.rewards)}"
    )


def run(a) -> dict | None:
    """The evaluation (collective under the launcher): evaluate.json's content on rank 0, None on the others."""
    from ..decoder import ImageDecoder, resolve_settings
    from ..decoder.compute import check_device
    from ..evaluation.paired import BASE, evaluate_models
    from ..experience import ExperienceMaker
    from ..memory.oom import CommandOutOfMemory
    from ..model.glm_image import resolve_dtype
    from ..model.policy import find_adapter_or_model, load_for_sampling
    from ..rewards import build_rewards
    from ..rollout.backends import ModelSampler
    from ..runtime.oom import out_of_memory
    from ..runtime.progress_count import Count

    adapters = [str(find_adapter_or_model(path).resolve()) for path in a.adapter]
    cfg, prompt_source, lines = load_settings(a, adapters)
    rank, world, local_rank, device = start_ranks(a.device)
    check_device(cfg.decoder, device, resolve_dtype(cfg.decoder.dtype, on_gpu=device.type == "cuda"))  # before loads
    rows, mine, prompts_name = read_rows(a, cfg, prompt_source, rank, world, local_rank)
    m = cfg.model
    flags = ("--model" if a.model is not None else "model.path", "model.revision")  # the one the user gave
    loaded = load_for_sampling(
        m.path,
        m.revision,
        m.dtype,
        m.attn_implementation,
        cfg.grpo.sampling,
        device,
        adapters,
        m.trust_remote_code,
        flags,
    )
    names = [BASE, *loaded.adapter_names]
    reward_fn = build_rewards(cfg.rewards)
    sampler = ModelSampler(loaded.model, loaded.processor, cfg.rollout, loaded.sampling, device)
    maker = ExperienceMaker(sampler, ImageDecoder(loaded.model_dir, cfg.decoder, device), reward_fn, cfg, device)
    decode = resolve_settings(cfg.eval.num_inference_steps, cfg.eval.guidance_scale)
    seed = cfg.eval.seed if a.seed is None else a.seed
    settings = run_settings(a, cfg, loaded, adapters, rows, prompts_name, decode, seed, world)
    on_images = export_hook(a, rows, (cfg.rollout.height, cfg.rollout.width)) if a.export else None
    store = progress_store(Path(a.out) / PROGRESS / f"rank_{rank}", settings, a.fresh)
    if rank == 0:  # every input checked (an error stays one line): where the settings came from, what is coming
        for line in [*lines, start_line(len(names), len(rows), a.samples_per_prompt, cfg, decode)]:
            print(line, file=sys.stderr, flush=True)
    desc = f"evaluate ({len(names)} model{'s' * (len(names) > 1)} x {a.samples_per_prompt} samples)"
    try:
        with Count(len(mine), desc, "prompts", enabled=rank == 0) as bar:
            results = evaluate_models(
                loaded.model, names, maker, mine, a.samples_per_prompt, seed, decode,
                batch_prompts=a.batch_prompts, thumb_side=a.thumbnail, progress=bar.update, store=store,
                on_images=on_images, weight_sets=loaded.weight_sets,
            )  # fmt: skip
    except RuntimeError as err:
        starved = out_of_memory(err)
        if starved is None:
            raise
        raise CommandOutOfMemory(oom_line(starved, a, cfg, store, names)) from err
    results = gather_results(results, names)
    if results is None:  # another rank's: rank 0 reports
        return None
    warnings = dict(zip(loaded.adapter_names, loaded.adapter_warnings))
    return write_report(a, results, settings, rows, loaded.adapter_names, adapters, reward_fn.weights, warnings)


def oom_line(err: BaseException, a, cfg, store: Path, names: list[str]) -> str:
    """The evaluation's one line when the GPU ran out of memory while sampling (memory/oom.py ``command_line``): the
    change that makes the phase it was met in smaller, and the batches of prompts this rank's progress store holds
    for every model in ``names``."""
    from ..memory.oom import command_line, fewer_dit_images

    held = [{path.name for path in (store / name).glob("batch_*.pt")} for name in names]
    kept = len(set.intersection(*held))

    def change(phase: str | None) -> str | None:
        # with decoder.stream_rewards each DiT batch's images are scored as they come: the DiT's batch is the reward's
        if phase == "decode" or (phase == "reward" and cfg.decoder.stream_rewards):
            return fewer_dit_images(cfg.decoder.batch_size)
        if phase in ("rollout", "reward") and a.batch_prompts > 1:
            return (
                f"--batch-prompts {a.batch_prompts // 2} samples and scores half as many images at once (now "
                f"{a.batch_prompts} prompts x {a.samples_per_prompt} samples); it is another setting of the "
                "evaluation: with another --out (what is kept stays there), or --fresh (discards it)"
            )
        return None

    kept_text = "1 finished batch of prompts is" if kept == 1 else f"{kept} finished batches of prompts are"
    return command_line("evaluate", err, change, f"this rank's {kept_text} kept in {store}: the same settings go on")


def main(argv: list[str] | None = None) -> int:
    from ..config import ConfigError
    from ..ds import dist
    from ..evaluation.html_report import REPORT
    from ..evaluation.report import EVALUATE_JSON, alarm_lines, reward_failure_lines
    from ..memory.oom import EXIT_OOM, CommandOutOfMemory, command_line
    from ..runtime.oom import out_of_memory

    a = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        result = run(a)
    except (ConfigError, FileNotFoundError, ValueError) as err:
        print(f"glm-grpo evaluate: {err}", file=sys.stderr)
        dist.shutdown(agreed=False)
        return 2
    except CommandOutOfMemory as err:  # the phase, torch's figures, what to change (memory/oom.py)
        print(err, file=sys.stderr)
        dist.shutdown(agreed=False)
        return EXIT_OOM
    except RuntimeError as err:  # out of memory outside the sampling: loading the models, the report
        starved = out_of_memory(err)
        if starved is None:
            raise
        print(command_line("evaluate", starved, lambda phase: None, f"the progress is in {a.out}"), file=sys.stderr)
        dist.shutdown(agreed=False)
        return EXIT_OOM
    dist.shutdown()
    if result is None:  # not rank 0
        return 0
    write_text_atomic(Path(a.out) / EVALUATE_JSON, json.dumps(result, indent=2) + "\n")  # a rerun's old one whole
    print(result["table"])
    for line in alarm_lines(result["alarms"]):  # the adapters' runs: one line per alarm that fired, or none
        print(line)
    for line in reward_failure_lines(result["reward_failures"]):  # and per reward that failed in them
        print(line)
    print(f"wrote {Path(a.out) / EVALUATE_JSON}")
    print(f"report: {Path(a.out) / REPORT}")
    return 0


if __name__ == "__main__":  # `deepspeed --module glm_grpo_ds.commands.evaluate`: the console of `glm-grpo evaluate`
    from .cli import main as cli_main

    raise SystemExit(cli_main(["evaluate", *sys.argv[1:]]))
