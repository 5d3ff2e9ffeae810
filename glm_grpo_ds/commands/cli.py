"""The ``glm-grpo`` command: one entry point, one subcommand per tool.

The subcommands are listed once, in :data:`SUBCOMMANDS` (commands/subcommands.py): ``glm-grpo --help`` prints
them and the table of docs/commands.md is generated from them (:func:`commands_table`, ``glm-grpo config-docs
--commands``; tests/unit/test_config_docs.py checks the committed table). Each subcommand lives in its own module
and is imported only when it runs, so ``glm-grpo --help`` stays fast.
"""

from __future__ import annotations

import importlib
import os
import shlex
import sys

from ..profiling.tools import PROFILE_TOOLS
from .subcommands import SUBCOMMANDS


def parser_for(name: str, **kwargs):
    """The ``argparse`` parser of ``glm-grpo NAME``: its :data:`SUBCOMMANDS` entry's ``doc`` as the description
    (plain text) and its ``example``, every option's default shown (runtime/cli_help.py)."""
    from ..runtime.cli_help import command_parser, plain

    sub = SUBCOMMANDS[name]
    text = plain(sub.doc).removesuffix(".")
    return command_parser(f"glm-grpo {name}", f"{text[:1].upper()}{text[1:]}.", sub.example, **kwargs)


# commands that set up their console themselves: train (run_log.setup, per rank) and reward-server (uvicorn's
# request lines); env imports no library that talks (it takes --log-level as every command does, with nothing to add)
OWN_CONSOLE = {"train", "reward-server", "env"}
SILENT = {"env"}
EXIT_BROKEN_PIPE = 128 + 13  # a reader that stopped early (`glm-grpo env | head -1`): what a shell gives SIGPIPE


def _log_level(args: list[str]) -> tuple[str | None, list[str]]:
    """``--log-level LEVEL`` (anywhere among a tool's arguments) taken out: (level, the other arguments);
    (None, args) after printing the error for a bad level."""
    from ..runtime.log import LEVELS

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
    lines += [f"  {name:<16} {sub.help}" for name, sub in SUBCOMMANDS.items()]
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
        from ..runtime.versions import package_version

        print(f"glm-grpo-ds {package_version('glm-grpo-ds')}")
        return 0
    name, rest = argv[0], argv[1:]
    if name in PROFILE_TOOLS:  # the profilers were verbs of their own
        print(f"glm-grpo {name} moved: run {shlex.join(['glm-grpo', 'profile', name, *rest])}", file=sys.stderr)
        return 2
    if name not in SUBCOMMANDS:
        import difflib

        close = difflib.get_close_matches(name, SUBCOMMANDS, n=3)
        hint = f" (did you mean: {', '.join(close)}?)" if close else ""
        print(f"glm-grpo: unknown command {name!r}{hint}; see `glm-grpo --help`", file=sys.stderr)
        return 2
    if name not in OWN_CONSOLE or name in SILENT:
        level, rest = _log_level(rest)
        if level is None:
            return 2
    if name not in OWN_CONSOLE:
        from ..runtime import run_log

        run_log.setup_tool(level)  # before the command's imports: bitsandbytes warns as it is imported
    module_name, _, function = SUBCOMMANDS[name].target.partition(":")
    entry = getattr(importlib.import_module(module_name), function or "main")
    try:
        code = int(entry(rest) or 0)
        sys.stdout.flush()  # here, not at the interpreter's exit: a pipe closed early is then met below
        return code
    except BrokenPipeError:  # not the command's failure (exit 1 reads as one: env's is a dependency out of range)
        if not _stdout_reader_gone():  # a socket or a child's pipe of the command's own: its error, as it came
            raise
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's last flush at exit would raise it again
        return EXIT_BROKEN_PIPE


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (Linux's poll says POLLERR on such a pipe's write end)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no fileno (captured), no poll (not Linux / macOS)
        return False


VERSION_ROW = ("glm-grpo --version", "the installed package version (`glm-grpo-ds 0.1.0`)", "commands/cli.py")
TABLE_BEGIN = (
    "<!-- commands table: generated from glm_grpo_ds/commands/subcommands.py by `glm-grpo config-docs --commands` -->"
)
TABLE_END = "<!-- end of the generated commands table -->"


def commands_table() -> str:
    """The table of docs/commands.md (between :data:`TABLE_BEGIN` and :data:`TABLE_END`), from :data:`SUBCOMMANDS`,
    the ``profile`` row followed by one row per tool of :data:`~glm_grpo_ds.profiling.tools.PROFILE_TOOLS`."""
    entries = []
    for name, sub in SUBCOMMANDS.items():
        entries += [sub, *(PROFILE_TOOLS.values() if name == "profile" else ())]
    rows = [
        (s.usage, s.doc, s.target.partition(":")[0].removeprefix("glm_grpo_ds.").replace(".", "/") + ".py", s.code)
        for s in entries
    ]
    rows.append((*VERSION_ROW, ""))
    lines = [TABLE_BEGIN, "| command | what it does | module |", "|---|---|---|"]
    lines += [f"| `{usage}` | {doc} | `{module}`{' ' + code if code else ''} |" for usage, doc, module, code in rows]
    return "\n".join([*lines, TABLE_END]) + "\n"


def console_main() -> int:
    """The `glm-grpo` console script: :func:`main`, then the process exits at once (runtime/process_exit.py)."""
    from ..runtime import process_exit

    return process_exit.exit_now(main())


if __name__ == "__main__":
    raise SystemExit(console_main())
