"""docs/config_reference.md is generated from the config's field help, and every field has help."""

import dataclasses
import typing
from pathlib import Path

from glm_grpo_ds.commands import config_docs
from glm_grpo_ds.config import TrainConfig

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "config_reference.md"
COMMANDS = Path(__file__).resolve().parents[2] / "docs" / "commands.md"


def _fields(cls, prefix=""):
    """(dotted key, field, section dataclass or None) of every field of the TrainConfig tree."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        sub = config_docs._section_type(hints[f.name])
        yield prefix + f.name, f, sub
        if sub is not None:
            list_items = typing.get_origin(hints[f.name]) is list
            yield from _fields(sub, prefix + f.name + ("[]." if list_items else "."))


def test_committed_reference_is_current():
    assert REFERENCE.read_text(encoding="utf-8") == config_docs.render(), (
        "docs/config_reference.md is stale; regenerate with: glm-grpo config-docs > docs/config_reference.md"
    )


def test_every_field_has_help():
    keys = {key: f for key, f, _ in _fields(TrainConfig)}
    assert {"lora", "model.dtype", "grpo.sampling.top_p", "rewards[].args", "eval.gallery", "force_collectives"} <= set(
        keys
    )
    missing = [key for key, f in keys.items() if not f.metadata.get("help", "").strip()]
    assert not missing, (
        f"fields without help (add metadata={{'help': ...}} via setting in glm_grpo_ds/config/*_sections.py): {missing}"
    )


def test_every_key_and_choice_is_in_the_reference():
    text = config_docs.render()
    for key, f, section in _fields(TrainConfig):
        assert (f"## `{key}" if section else f"| `{key}` |") in text, key
        assert " ".join(f.metadata["help"].split()).replace("|", "\\|") in text, key
    for choice in ("dr_grpo", "normalize_then_sum", "paged_adamw_8bit", "flash_attention_2", "tensorboard", "online"):
        assert f"`{choice}`" in text


def test_check_flag(tmp_path, capsys):
    good = tmp_path / "good.md"
    good.write_text(config_docs.render(), encoding="utf-8")
    assert config_docs.main(["--check", str(good)]) == 0
    stale = tmp_path / "stale.md"
    stale.write_text(config_docs.render() + "edited by hand\n", encoding="utf-8")
    assert config_docs.main(["--check", str(stale)]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"{stale} is stale; regenerate with: glm-grpo config-docs > {stale}"
    assert config_docs.main(["--check", str(tmp_path / "missing.md")]) == 1
    assert config_docs.main([]) == 0
    assert capsys.readouterr().out == config_docs.render()


def test_committed_commands_table_is_current(tmp_path, capsys):
    """docs/commands.md's table is generated from the one list of subcommands (glm_grpo_ds/commands/subcommands.py)."""
    from glm_grpo_ds.commands import cli

    text = COMMANDS.read_text(encoding="utf-8")
    assert config_docs.with_commands_table(text) == text, (
        "docs/commands.md's commands table is stale; regenerate with: glm-grpo config-docs --commands docs/commands.md"
    )
    table = cli.commands_table()
    for name, sub in cli.SUBCOMMANDS.items():
        assert f"| `glm-grpo {name}" in table and sub.usage.startswith(f"glm-grpo {name}"), name
    stale = tmp_path / "commands.md"
    stale.write_text(text.replace("| `glm-grpo env` |", "| `glm-grpo env --old` |"), encoding="utf-8")
    assert config_docs.main(["--check-commands", str(stale)]) == 1
    assert "stale" in capsys.readouterr().err
    assert config_docs.main(["--commands", str(stale)]) == 0
    assert stale.read_text(encoding="utf-8") == text
