"""Every ``glm-grpo`` command's ``--help``: the whole description (not a first line cut mid-sentence, no reST or
Markdown marks), one example that its own parser accepts, and every option's default shown or, where there is no
default, a help saying what the option does (runtime/cli_help.py)."""

import argparse
import shlex

import pytest

from glm_grpo_ds.commands import cli
from glm_grpo_ds.config.arguments import TRAIN_EXAMPLE
from glm_grpo_ds.profiling.tools import PROFILE_TOOLS
from glm_grpo_ds.runtime.cli_help import HelpFormatter, command_parser, plain


class _Built(Exception):
    def __init__(self, parser):
        self.parser = parser


def _parser_of(name: str, monkeypatch) -> argparse.ArgumentParser:
    """The parser ``glm-grpo NAME`` builds (NAME: a subcommand, or ``profile TOOL``), caught as it parses (nothing of
    the command runs)."""

    def caught(self, args=None, namespace=None):
        raise _Built(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", caught)
    verb, _, tool = name.partition(" ")
    module, _, function = cli.SUBCOMMANDS[verb].target.partition(":")
    entry = getattr(__import__(module, fromlist=["_"]), function or "main")
    with pytest.raises(_Built) as built:
        entry([tool, "--help"] if tool else ["--help"])
    monkeypatch.undo()
    return built.value.parser


def _entry(name: str):
    """``name``'s row: its :data:`SUBCOMMANDS` entry, or for ``profile TOOL`` the tool's :data:`PROFILE_TOOLS` one."""
    verb, _, tool = name.partition(" ")
    return PROFILE_TOOLS[tool] if tool else cli.SUBCOMMANDS[verb]


# every subcommand, and every profiler as `profile TOOL`
NAMES = [*cli.SUBCOMMANDS, *(f"profile {tool}" for tool in PROFILE_TOOLS)]


def _arguments(parser):
    return [a for a in parser._actions if a.help != argparse.SUPPRESS and a.dest != "help"]


@pytest.mark.parametrize("name", NAMES)
def test_help_shows_the_description_an_example_and_every_default(name, monkeypatch):
    parser = _parser_of(name, monkeypatch)
    assert parser.prog == f"glm-grpo {name}"
    assert parser.formatter_class is HelpFormatter
    text = parser.format_help()
    description = parser.description
    for mark in ("``", "`", "**", "]("):
        assert mark not in description, (name, mark, description)
    if name != "train":  # train's description is its own (the training path does not import commands/)
        whole = " ".join(plain(_entry(name).doc).split())
        assert whole[1:].removesuffix(".") in " ".join(description.split()), name  # all of it, not its first line
    assert description.rstrip().endswith("."), (name, description[-40:])
    assert "example:\n  glm-grpo " + name in text or (name == "train" and "example:\n  glm-grpo train" in text)
    for action in _arguments(parser):
        formatter = parser._get_formatter()
        shown = formatter._expand_help(action) if action.help else formatter._get_help_string(action)
        assert action.help, (name, action.option_strings or action.dest, "an argument without help")
        if action.option_strings and not (
            action.default is None or action.default is False or action.default in ([], argparse.SUPPRESS)
        ):
            assert "default" in shown, (name, action.option_strings, shown)


@pytest.mark.parametrize("name", NAMES)
def test_each_example_is_accepted_by_its_own_parser(name, monkeypatch):
    example = TRAIN_EXAMPLE if name == "train" else _entry(name).example
    first = shlex.split(example.splitlines()[0])
    words = name.split()
    assert first[: 1 + len(words)] == ["glm-grpo", *words], first
    if name == "profile":  # `glm-grpo profile TOOL ...`: the tool's own parser reads the rest
        assert first[2] in PROFILE_TOOLS, first
        words = first[1:3]
    parser = _parser_of(" ".join(words), monkeypatch)
    args, unknown = parser.parse_known_intermixed_args(first[1 + len(words) :])
    assert unknown == [], (name, unknown)


@pytest.mark.parametrize("name", NAMES)
def test_a_bad_argument_is_one_line_naming_the_help(name, monkeypatch, capsys):
    """argparse printed its usage first (eight lines for estimate-memory) above the line saying what was wrong."""
    parser = _parser_of(name, monkeypatch)
    with pytest.raises(SystemExit) as stopped:
        parser.parse_args(["--no-such-option"])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"glm-grpo {name}: error: ") and err.endswith(f"(see glm-grpo {name} --help)\n"), err


def test_defaults_are_appended_unless_said_and_off_flags_stay_quiet():
    p = command_parser("glm-grpo x", "What x does.", "glm-grpo x --n 3")
    p.add_argument("--n", type=int, default=4, help="how many")
    p.add_argument("--m", type=int, default=5, help="how many more (default: the config's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--flag", action="store_true", help="on or off")
    p.add_argument("--out", default=None, help="where")
    text = " ".join(p.format_help().split())
    assert "how many (default: 4)" in text
    assert "how many more (default: the config's)" in text and "default: 5" not in text
    assert "--seed SEED default: 0" in text
    assert "on or off" in text and "default: False" not in text
    assert "where" in text and "default: None" not in text
    assert text.endswith("example: glm-grpo x --n 3")


def test_markdown_links_become_paths():
    assert plain("see [training.md](training.md#decode)") == "see docs/training.md#decode"
    assert plain("the [intervals](evaluate.md#intervals), `--out`, **3**, a\\|b") == (
        "the intervals (docs/evaluate.md#intervals), --out, 3, a|b"
    )


def test_train_says_what_it_runs_without_a_config(monkeypatch):
    """--config is optional for train (the defaults plus key=value overrides make a run); its help says so."""
    (config,) = [a for a in _parser_of("train", monkeypatch)._actions if "--config" in a.option_strings]
    assert not config.required and "optional: without it the run is the defaults" in config.help


@pytest.mark.parametrize("name", NAMES)
def test_the_synopsis_names_every_option(name, monkeypatch):
    """docs/commands.md's table and ``glm-grpo --help`` show each command's synopsis (its SUBCOMMANDS / PROFILE_TOOLS
    ``usage``), written by hand: an option added to the parser and not to it was missing from the manual (train's
    --check, evaluate's --gallery-prompts, tiny-world's --seed-layout...)."""
    parser = _parser_of(name, monkeypatch)
    usage = _entry(name).usage
    missing = [
        action.option_strings[-1]
        for action in _arguments(parser)
        if action.option_strings and not any(option in usage for option in action.option_strings)
    ]
    assert not missing, (name, missing)
    assert "|" not in usage.replace("\\|", ""), "a bare | splits the cell of docs/commands.md's table: write \\|"
