"""The ``--help`` of every ``glm-grpo`` command: a full description, one example, every default shown.

:func:`command_parser` builds a command's ``argparse`` parser with :class:`HelpFormatter`, which appends
``(default: X)`` to an option's help unless the help already says its default (``default`` in the text) or there
is none to show (``None``, an off flag, an empty list). :func:`plain` turns the Markdown of docs/commands.md's
table (where the descriptions are written once, in ``commands/subcommands.py``) into terminal text. A test
(tests/unit/test_command_help.py) runs every command's ``--help`` and parses every example with its parser.
"""

from __future__ import annotations

import argparse
import re
import shutil
import textwrap
from typing import NamedTuple

_LINK = re.compile(r"\[([^\]]+)\]\(([^)]+)\)")


class Command(NamedTuple):
    """One ``glm-grpo`` subcommand (commands/subcommands.py) or ``glm-grpo profile`` tool (profiling/tools.py): the one
    place it is listed (its ``--help`` and its row of docs/commands.md's table are made from it)."""

    target: str  # "module" or "module:function" taking argv and returning the exit status
    help: str  # one line, for `glm-grpo --help` (a tool's: `glm-grpo profile --help`)
    usage: str  # the synopsis of docs/commands.md's table
    doc: str  # what it does (Markdown), docs/commands.md, and the description of its `--help`
    example: str  # one command line (or a few) shown by `--help`; tests/unit/test_command_help.py parses each
    code: str = ""  # where else its code lives (Markdown), after its module in docs/commands.md


def plain(markdown: str) -> str:
    """docs/commands.md's Markdown as terminal text: ``[text](page.md#part)`` -> ``text (docs/page.md#part)`` (only
    ``docs/page.md#part`` when the text is the page's name), no backticks or bold, ``\\|`` -> ``|``."""

    def link(match: re.Match) -> str:
        text, target = match.groups()
        target = target if "/" in target or target.startswith("http") else f"docs/{target}"
        page = target.partition("#")[0].rpartition("/")[2]
        return target if text == page else f"{text} ({target})"

    text = _LINK.sub(link, markdown)
    return text.replace("**", "").replace("`", "").replace("\\|", "|")


def _shown(default) -> bool:
    """Whether a default is worth printing: not None / SUPPRESS / an off flag / an empty list."""
    return not (default is None or default is False or default == argparse.SUPPRESS or default == [])


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The description and the example as written (they are wrapped by :func:`command_parser`), and each
    option's default after its help."""

    def _get_help_string(self, action: argparse.Action) -> str:  # argparse calls it for an action with a help
        text = action.help
        if action.option_strings and _shown(action.default) and "default" not in text:
            text += " (default: %(default)s)"
        return text

    def _format_action(self, action: argparse.Action) -> str:
        if not action.help and action.option_strings and _shown(action.default):
            action.help = "default: %(default)s"  # argparse prints no help line for an option without help
        return super()._format_action(action)


def _wrap(text: str) -> str:
    width = min(100, shutil.get_terminal_size((100, 24)).columns) - 2
    fill = textwrap.TextWrapper(width, break_long_words=False, break_on_hyphens=False).fill  # paths stay whole
    return "\n\n".join(fill(part) for part in text.split("\n\n"))


class CommandParser(argparse.ArgumentParser):
    """A command's parser whose refusal is one line, as every other bad input's: argparse's own printed the usage
    first (eight lines for estimate-memory) above the line that says what is wrong."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def command_parser(prog: str, description: str, example: str, **kwargs) -> argparse.ArgumentParser:
    """``prog``'s parser: ``description`` (plain text, paragraphs split by a blank line) wrapped to the terminal,
    then the parser's options, then ``example`` (one command line, or several lines) under ``example:``."""
    epilog = "example:\n" + "\n".join(f"  {line}" for line in example.strip().splitlines())
    return CommandParser(
        prog=prog, description=_wrap(description), epilog=epilog, formatter_class=HelpFormatter, **kwargs
    )
