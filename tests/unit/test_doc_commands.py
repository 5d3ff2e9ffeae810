"""Every command the user is shown parses (issue #27: launch/configs/tiny_cpu.yaml's header still showed
`glm-grpo tiny-data --model ... --height ...`, options the tool had lost).

The commands: lines of the fenced shell blocks of README.md and docs/*.md, and the comment headers of
launch/configs/*.yaml, that run `glm-grpo SUB`, `python -m glm_grpo_ds...` or the training module under
the `deepspeed` launcher. Each is parsed by the tool's own argument parser in-process (nothing runs: the
parse is stopped once it succeeded), and a training line's config file and key=value overrides are
loaded and validated. Synopsis lines (with `...`, `[`, `<`) are skipped; an all-capitals config name
(`CFG.yaml`) is a placeholder."""

import argparse
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHELL = ("bash", "sh", "shell", "console", "")  # fenced blocks read as commands
RUNS = re.compile(
    r"^(?:[A-Z_]+=\S*\s+)*"  # environment assignments
    r"(glm-grpo\s+[a-z-]+(?:\s|$)|python -m glm_grpo_ds|deepspeed\s.*--module glm_grpo_ds)"
)


def _lines(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".md":
        blocks = [b for lang, b in re.findall(r"```(\w*)\n(.*?)```", text, re.S) if lang in SHELL]
        lines = [line for b in blocks for line in re.sub(r"\\\n\s*", " ", b).splitlines()]
    else:  # a config's header: "#   command", continued with a trailing backslash
        header = "\n".join(line[1:] for line in text.splitlines() if line.startswith("#"))
        lines = re.sub(r"\\\n\s*", " ", header).splitlines()
    return [line.strip() for line in lines]


def doc_commands() -> list[tuple[str, str]]:
    docs, configs = sorted((ROOT / "docs").glob("*.md")), sorted((ROOT / "launch/configs").glob("*.yaml"))
    files = [ROOT / "README.md", *docs, *configs]
    found = []
    for path in files:
        for line in _lines(path):
            line = re.split(r"\s+#\s", line)[0].strip()  # a trailing comment
            if RUNS.match(line) and not re.search(r"\.\.\.|\[|<", line):
                found += [(f"{path.relative_to(ROOT)}: {cmd.strip()}", cmd.strip()) for cmd in line.split("&&")]
    return found


class _Parsed(Exception):
    def __init__(self, ns):
        self.ns = ns


@pytest.fixture
def parse_only(monkeypatch):
    """The parsers' success ends the command (raising _Parsed); their failure is argparse's SystemExit(2)."""
    parse_args = argparse.ArgumentParser.parse_args
    known_intermixed = argparse.ArgumentParser.parse_known_intermixed_args

    def stop_after(self, *a, **k):
        raise _Parsed(parse_args(self, *a, **k))

    def stop_if_complete(self, *a, **k):
        ns, unknown = known_intermixed(self, *a, **k)
        if unknown:  # the caller reports them (parse_with_overrides)
            return ns, unknown
        raise _Parsed(ns)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", stop_after)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_intermixed_args", stop_if_complete)


def _argv(cmd: str) -> tuple[str, list[str]]:
    """(what runs, its arguments): a glm-grpo subcommand, a module, or the training module."""
    words = shlex.split(cmd)
    cut = [i for i, w in enumerate(words) if w in ("&", "|", ";", ">", ">>", "2>", "2>&1") or w.startswith(">")]
    words = [w for w in words[: cut[0] if cut else None] if not re.fullmatch(r"[A-Z_]+=\S*", w)]
    if words[0] == "glm-grpo":
        return words[1], words[2:]
    i = words.index("-m") if "-m" in words else words.index("--module")
    module = words[i + 1]
    return ("train" if module == "glm_grpo_ds.train" else module), words[i + 2 :]


def _check_config(ns) -> None:
    from glm_grpo_ds.config import load_config

    config = getattr(ns, "config", None)
    if config and re.fullmatch(r"[A-Z_]+(\.yaml)?", Path(config).name):
        return  # a placeholder
    if config:
        assert (ROOT / config).is_file(), f"config {config} does not exist"
    if config or getattr(ns, "overrides", None):
        load_config(str(ROOT / config) if config else None, list(getattr(ns, "overrides", None) or []))


def test_there_are_commands_to_check():
    cmds = [c for _, c in doc_commands()]
    assert len(cmds) > 20 and any(c.startswith("glm-grpo tiny-data") for c in cmds)


@pytest.mark.parametrize("where,cmd", doc_commands(), ids=[w for w, _ in doc_commands()])
def test_documented_command_parses(where, cmd, parse_only, monkeypatch):
    import importlib

    from glm_grpo_ds.commands import cli

    monkeypatch.chdir(ROOT)
    what, argv = _argv(cmd)
    if what == "train":
        from glm_grpo_ds.config.arguments import parse_train_args

        with pytest.raises(_Parsed) as parsed:
            parse_train_args(argv)
    elif what in cli.SUBCOMMANDS:
        with pytest.raises(_Parsed) as parsed:
            cli.main([what, *argv])
    else:
        with pytest.raises(_Parsed) as parsed:
            importlib.import_module(what).main(argv)
    _check_config(parsed.value.ns)
