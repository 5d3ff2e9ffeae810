"""Command lines that take dotted ``key=value`` config overrides anywhere among their options.

argparse stops a ``nargs="*"`` positional at the first option, so plain ``parse_args`` fails on
``--config C key=v --deepspeed D key2=v`` with "unrecognized arguments"; users (and the ``deepspeed``
launcher, which puts ``--local_rank`` first) mix them. :func:`parse_with_overrides` parses with
``parse_known_intermixed_args``, so overrides may come before, between or after the options.

An option the parser does not know but that names a config key (``--max_steps 3``,
``--max-steps=3``, ``--grpo.beta 0``) is a flag-style override; it fails with one line that says
what to write instead (``write max_steps=3``).
"""

from __future__ import annotations

import argparse
import dataclasses
import typing

from .loading import _dataclass_type
from .train_config import TrainConfig


def is_config_key(dotted: str) -> bool:
    """Whether ``dotted`` (``max_steps``, ``grpo.beta``, ``grpo.sampling``) names a TrainConfig field."""
    cls = TrainConfig
    for key in dotted.split("."):
        if cls is None or key not in {f.name for f in dataclasses.fields(cls)}:
            return False
        cls = _dataclass_type(typing.get_type_hints(cls)[key])
    return True


def flag_style_override(token: str, following: str | None) -> str | None:
    """``max_steps=3`` for an option-looking ``token`` (``--max_steps`` followed by ``3``, or
    ``--max-steps=3``) that names a config key; None when it names none."""
    if not token.startswith("-"):
        return None
    name, eq, value = token.lstrip("-").partition("=")
    key = name.replace("-", "_")
    if not key or not is_config_key(key):
        return None
    if not eq:
        # the next word is the value unless it is itself an option or an override
        value = following if following is not None and not following.startswith("--") and "=" not in following else ""
    return f"{key}={value or 'VALUE'}"


def parse_with_overrides(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``parser.parse_intermixed_args(argv)``, with a one-line hint (exit 2) for a config key
    written as an option. The parser's ``nargs="*"`` positional collects the overrides."""
    args, unknown = parser.parse_known_intermixed_args(argv)
    for token in unknown:
        i = argv.index(token)
        override = flag_style_override(token, argv[i + 1] if i + 1 < len(argv) else None)
        if override is not None:
            parser.exit(
                2,
                f"{parser.prog}: error: unknown option {token.partition('=')[0]}; config keys are overrides "
                f"without dashes: write {override}\n",
            )
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


TRAIN_DESCRIPTION = (
    "GRPO training of GLM-Image's AR policy with DeepSpeed: samples groups of images per prompt, scores them with "
    "the config's rewards and updates the AR (LoRA or full) with the group-relative advantages; the DiT decoder is "
    "frozen. One process as written; several GPUs or nodes: deepspeed --module glm_grpo_ds.train ... "
    "(docs/training.md). "
    "The run's files (config.json, metrics.jsonl, checkpoints, final_adapter/) go to output_dir; the same command "
    "with resume_from=auto continues from its last checkpoint (docs/checkpoints.md).\n\n"
    "Every config key can be set on the command line as key=value (docs/config_reference.md lists them with "
    "their defaults)."
)
TRAIN_EXAMPLE = """\
glm-grpo train --config launch/configs/tiny_cpu.yaml --deepspeed ds_configs/zero2.json model.path=outputs/tiny
deepspeed --num_gpus 8 --module glm_grpo_ds.train --config launch/configs/glm_image_lora.yaml \\
    --deepspeed ds_configs/zero2.json grpo.beta=0.0
glm-grpo train --check --config launch/configs/glm_image_lora.yaml --deepspeed ds_configs/zero2.json --num-gpus 8"""


def gib(text: str) -> float:
    """An argparse type: a GPU's memory in GiB, a positive finite number (nan planned into a ValueError)."""
    value = float(text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of GiB, got {text}")
    return value


def parse_train_args(argv: list[str]) -> argparse.Namespace:
    """The command line of ``glm-grpo train`` / ``python -m glm_grpo_ds.train`` / ``deepspeed --module``."""
    from ..runtime.cli_help import command_parser
    from ..runtime.log import LEVELS

    p = command_parser("glm-grpo train", TRAIN_DESCRIPTION, TRAIN_EXAMPLE)
    p.add_argument(
        "--config",
        help="YAML config file (optional: without it the run is the defaults of docs/config_reference.md plus the "
        "key=value overrides)",
    )
    p.add_argument("--deepspeed", required=True, help="ds_configs/zero{1,2,3}.json or your own")
    p.add_argument("--debug", action="store_true", help="show the full traceback of input errors")
    check = p.add_argument_group(
        "preflight (--check: every input checked with this very command line, no model loaded, in seconds; exit 0 "
        "when the job would start, 2 on a bad input, 3 when only the memory plan does not fit)"
    )
    check.add_argument("--check", action="store_true", help="check the job instead of running it (default: off)")
    check.add_argument("--num-gpus", type=int, default=None, help="GPUs per node the job will have (default: 8)")
    check.add_argument("--num-nodes", type=int, default=None, help="nodes the job will have (default: 1)")
    check.add_argument(
        "--hostfile", default=None, help="the job's DeepSpeed hostfile: its nodes and slots (default: none)"
    )
    check.add_argument(
        "--gpu-memory-gb", type=gib, default=None, help="GiB per GPU to plan against (default: estimate-memory's, 80)"
    )
    check.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default=None,
        help="the ranks' device: cpu = CPU ranks (DS_ACCELERATOR=cpu; model.dtype auto is fp32 there) (default: cuda)",
    )
    p.add_argument(
        "--log-level", choices=LEVELS, default="info", help="console verbosity of rank 0 (other ranks: errors)"
    )
    # set by the deepspeed launcher
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("overrides", nargs="*", help="dotted key=value overrides, anywhere on the line, e.g. grpo.beta=0.0")
    args = parse_with_overrides(p, argv)
    # the job's shape is the launcher's to give: without --check these would be ignored, and the run one process
    shape = ("num_gpus", "num_nodes", "hostfile", "gpu_memory_gb", "device")
    given = [flag for flag in shape if getattr(args, flag) is not None]
    if given and not args.check:
        flags = ", ".join("--" + flag.replace("_", "-") for flag in given)
        p.error(
            f"{flags} {'describe' if len(given) > 1 else 'describes'} the job for --check only; to run on several "
            "GPUs or nodes start this command with the deepspeed launcher (deepspeed --num_gpus N --module "
            "glm_grpo_ds.train ..., docs/training.md), or add --check"
        )
    return args
