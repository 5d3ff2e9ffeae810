"""``glm-grpo profile TOOL [args]``: the profilers of glm_grpo_ds/profiling/ under one verb. TOOL is one of
:data:`~glm_grpo_ds.profiling.tools.PROFILE_TOOLS` (bench, decode-counts, decode-timing, dit-timing); its arguments
go to the tool, imported only when it runs. ``glm-grpo profile --help`` lists the tools with their one-line help.
"""

from __future__ import annotations

import argparse
import importlib

from ..profiling.tools import PROFILE_TOOLS
from .cli import parser_for


def parser() -> argparse.ArgumentParser:
    """``glm-grpo profile``'s own parser: its description and example, and TOOL's choices with their help."""
    p = parser_for("profile")
    tools = p.add_subparsers(
        title="tools",
        dest="tool",
        metavar="TOOL",
        required=True,
        help="the profiler to run, then its own arguments (glm-grpo profile TOOL --help)",
    )
    for name, tool in PROFILE_TOOLS.items():
        tools.add_parser(name, help=tool.help, add_help=False)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(argv or [])
    if argv and argv[0] in PROFILE_TOOLS:
        module_name, _, function = PROFILE_TOOLS[argv[0]].target.partition(":")
        entry = getattr(importlib.import_module(module_name), function or "main")
        return int(entry(argv[1:]) or 0)
    parser().parse_args(argv)  # --help, or the error naming the tools
    return 2
