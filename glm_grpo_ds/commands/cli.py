"""The ``glm-grpo`` command: one entry point, one subcommand per tool.

    glm-grpo tiny-model OUT_DIR [--seed N]          build the offline tiny GLM-Image pipeline
    glm-grpo tiny-world OUT_DIR                     the learnable tiny world (model + prompts) of the demo
    glm-grpo render --model DIR|ID [--adapter DIR] --prompt TEXT ...   render prompts (adapter unmerged)
    glm-grpo verify-logprobs --model DIR|ID ...      sampler vs teacher-forced log-prob parity
    glm-grpo reward-server --reward NAME --port P   serve a reward over HTTP for the `remote` reward
    glm-grpo plot OUTPUT_DIR                        training curves of a (running) run
    glm-grpo push OUTPUT_DIR [--repo-id NS/NAME]    upload a run's weights + model cards to the Hugging Face Hub
    glm-grpo progress OUTPUT_DIR --best BEST.json   fraction of the way from the start to the best reward
    glm-grpo check-run OUTPUT_DIR [--verify FILE]   PASS/FAIL verdicts of a short check run (launch/gpu_check.sh)
    glm-grpo estimate-memory | merge | score | bench | tiny-data   (see `glm-grpo --help`)
    glm-grpo env                                    versions and hardware for a bug report
    glm-grpo --version                              the package version

Each subcommand lives in its own module and is imported only when it runs, so
``glm-grpo --help`` stays fast.
"""

from __future__ import annotations

import importlib
import sys

# subcommand -> ("module" or "module:function" taking argv and returning the exit status, one-line help)
SUBCOMMANDS = {
    "train": ("glm_grpo_ds.train", "GRPO training (one process; use the deepspeed launcher for more)"),
    "estimate-memory": (
        "glm_grpo_ds.commands.estimate_memory",
        "per-GPU memory plan of a run before launch (no weights needed)",
    ),
    "merge": ("glm_grpo_ds.commands.merge", "merge a LoRA adapter into GLM-Image and write a pipeline directory"),
    "push": (
        "glm_grpo_ds.commands.push",
        "upload a run's final weights (+ checkpoint adapters) with their model cards to the Hugging Face Hub",
    ),
    "render": ("glm_grpo_ds.commands.render", "render prompts to PNG files with a GLM-Image pipeline"),
    "score": ("glm_grpo_ds.commands.score", "score images with a reward (one number per image)"),
    "reward-server": (
        "glm_grpo_ds.commands.reward_server",
        "serve a reward over HTTP for the `remote` reward (reward models on other GPUs / nodes)",
    ),
    "verify-logprobs": ("glm_grpo_ds.commands.verify_logprobs", "check sampler vs teacher-forced log-prob parity"),
    "bench": (
        "glm_grpo_ds.commands.bench",
        "benchmark rollout / decode / reward / update and print side-by-side ratios",
    ),
    "plot": ("glm_grpo_ds.commands.plot", "plot reward, KL and clip fractions of a run (OUTPUT_DIR/reward_curve.png)"),
    "progress": (
        "glm_grpo_ds.commands.progress",
        "fraction of the way from a run's start reward to the best (eval and train)",
    ),
    "config-docs": (
        "glm_grpo_ds.commands.config_docs",
        "print the config key reference (docs/config_reference.md) or --check it",
    ),
    "check-run": (
        "glm_grpo_ds.commands.check_run",
        "PASS/FAIL: finite steps, first-iteration ratio 1, log-prob parity, peak vs plan",
    ),
    "env": ("glm_grpo_ds.commands.env", "versions and hardware for a bug report (paste it into the issue)"),
    "tiny-model": ("glm_grpo_ds.commands.tiny:tiny_model", "write a random-weight tiny GLM-Image pipeline directory"),
    "tiny-data": (
        "glm_grpo_ds.commands.tiny:tiny_data",
        "write a learnable prompt set with target images for the tiny model",
    ),
    "tiny-world": (
        "glm_grpo_ds.commands.tiny:tiny_world",
        "write the learnable tiny world: colour-block decoder, colour prompts",
    ),
}


# commands that set up their console themselves: train (run_log.setup, per rank) and reward-server (uvicorn's
# request lines); env imports no library that talks
OWN_CONSOLE = {"train", "reward-server", "env"}


def _log_level(args: list[str]) -> tuple[str | None, list[str]]:
    """``--log-level LEVEL`` (anywhere among a tool's arguments) taken out: (level, the other arguments);
    (None, args) after printing the error for a bad level."""
    from ..log import LEVELS

    level, rest, i = "info", [], 0
    while i < len(args):
        arg = args[i]
        if arg == "--log-level" or arg.startswith("--log-level="):
            value = arg.partition("=")[2] if "=" in arg else (args[i + 1] if i + 1 < len(args) else "")
            i += 1 if "=" in arg else 2
            if value not in LEVELS:
                print(f"glm-grpo: --log-level {value!r}: choose one of {', '.join(LEVELS)}", file=sys.stderr)
                return None, args
            level = value
            continue
        rest.append(arg)
        i += 1
    return level, rest


def _usage() -> str:
    lines = ["usage: glm-grpo <command> [args]  |  glm-grpo --version", "", "commands:"]
    lines += [f"  {name:<16} {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    lines += [
        "",
        "Run `glm-grpo <command> --help` for a command's options. Every command prints its own lines and library",
        "errors; `--log-level debug` (any command) adds the libraries' warnings, info and progress bars.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from .env import version

        print(f"glm-grpo-ds {version()}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        import difflib

        close = difflib.get_close_matches(name, SUBCOMMANDS, n=3)
        hint = f" (did you mean: {', '.join(close)}?)" if close else ""
        print(f"glm-grpo: unknown command {name!r}{hint}; see `glm-grpo --help`", file=sys.stderr)
        return 2
    if name not in OWN_CONSOLE:
        level, rest = _log_level(rest)
        if level is None:
            return 2
        from .. import run_log

        run_log.setup_tool(level)  # before the command's imports: bitsandbytes warns as it is imported
    module_name, _, function = SUBCOMMANDS[name][0].partition(":")
    entry = getattr(importlib.import_module(module_name), function or "main")
    return int(entry(rest) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
