"""YAML file + dotted ``key=value`` overrides -> a validated :class:`TrainConfig`.

Unknown keys fail with a close-match suggestion; values are converted to the annotated type (``X | None``,
lists, nested sections, ``Literal`` choices) with a one-line error naming the dotted key; a list of
``Literal`` choices also takes one choice alone (``report_to: wandb``, as transformers does). A renamed key
(:data:`RENAMED`) is still read under its old name, with one warning naming the new one; both names at once
are an error.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import re
import types
import typing

from ..runtime import log
from .fields import ConfigError
from .other_names import other_key_hint
from .train_config import TrainConfig
from .trl_names import trl_key_hint
from .yaml_file import EMPTY, parse_scalar, plain, read_yaml, source

# old dotted key -> new dotted key (same section): configs and command lines written before a rename still load
RENAMED = {"grpo.advantage_scale": "grpo.advantage_estimator"}


def _warn_renamed(old: str) -> None:
    log.warning_once(f"renamed-{old}", f"glm-grpo: warning: {old} is now {RENAMED[old]}; write the new name")


def _new_name(dotted: str) -> str:
    """``dotted`` under its current name (an old one of :data:`RENAMED` warned about once)."""
    if dotted not in RENAMED:
        return dotted
    _warn_renamed(dotted)
    return RENAMED[dotted]


def _rename_keys(tree: dict) -> None:
    """Move every old key of :data:`RENAMED` in the YAML ``tree`` to its new name (in place)."""
    for old, new in RENAMED.items():
        *sections, old_key = old.split(".")
        node = tree
        for section in sections:
            node = node.get(section) if isinstance(node, dict) else None
        if not isinstance(node, dict) or old_key not in node:
            continue
        new_key = new.rsplit(".", 1)[1]
        if new_key in node:
            raise ConfigError(f"{old} and {new} are the same setting ({old} is its old name): give {new} only")
        node[new_key] = node.pop(old_key)
        _warn_renamed(old)


def _config_keys(cls=TrainConfig, prefix: str = "") -> list[str]:
    """Every dotted key of the config (sections' fields included; a list of sections counts its fields)."""
    keys = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        keys.append(prefix + f.name)
        sub = _section_type(hints[f.name])
        if sub is not None:
            keys += _config_keys(sub, prefix + f.name + ".")
    return keys


def _elsewhere(key: str, where: str) -> list[str]:
    """Our dotted keys whose last part is ``key``, in another section than ``where`` (``grpo.lr`` ->
    ``optimizer.lr``)."""
    return [k for k in _config_keys() if k.rsplit(".", 1)[-1] == key and k != where + key]


def _unknown_hint(key: str, known: typing.Iterable[str], where: str) -> str:
    """What an unknown ``where + key`` most likely means: another trainer's name for one of ours (TRL's, the
    seeds' plan's, OpenRLHF's, verl's: their close matches here would mislead, num_generations is not
    num_iterations), our key of that name in another section, a close spelling, else the section's keys."""
    foreign = trl_key_hint(key) or other_key_hint(key)
    if foreign is not None:
        return foreign
    moved = _elsewhere(key, where)
    if moved:
        return f"it is {' or '.join(repr(m) for m in moved)}"
    close = difflib.get_close_matches(key, list(known), n=3, cutoff=0.5)
    if close:
        return f"did you mean {', '.join(repr(where + c) for c in close)}?"
    return f"known keys under it: {', '.join(sorted(known))}"


def _unknown(key: str, known: typing.Iterable[str], where: str) -> ConfigError:
    return ConfigError(f"unknown config key {where + key!r}; {_unknown_hint(key, known, where)}")


def _unknown_keys(cls, data, prefix: str = "") -> list[tuple[str, str]]:
    """``(dotted key, hint)`` per key of the mapping ``data`` (and of its sections, lists of sections included)
    that ``cls`` does not have: every unknown key of a config at once, not one per attempt."""
    if not isinstance(data, dict):
        return []  # a section that is not a mapping: the conversion says so, with its key
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    lines = []
    for key, value in data.items():
        if key not in names:
            lines.append((prefix + key, _unknown_hint(key, names, prefix)))
            continue
        sub = _section_type(hints[key])
        if sub is None:
            continue
        if isinstance(value, list):
            for i, item in enumerate(value):
                lines += _unknown_keys(sub, item, f"{prefix}{key}[{i}].")
        else:
            lines += _unknown_keys(sub, value, f"{prefix}{key}.")
    return lines


def _section_type(tp):
    """The section dataclass of a field's type: ``X``, ``X | None`` or ``list[X]``; else None."""
    found = _dataclass_type(tp)
    if found is None and typing.get_origin(tp) is list:
        (item,) = typing.get_args(tp) or (None,)
        found = _dataclass_type(item)
    return found


def _dataclass_type(tp):
    """The dataclass inside ``tp`` (``X``, ``X | None``) or None."""
    if dataclasses.is_dataclass(tp):
        return tp
    if typing.get_origin(tp) not in (typing.Union, types.UnionType):
        return None
    for arg in typing.get_args(tp):
        if dataclasses.is_dataclass(arg):
            return arg
    return None


def _convert(value, tp, where: str):
    """Coerce a YAML/JSON value to the annotated type ``tp``."""
    optional = type(None) in typing.get_args(tp) and (typing.get_origin(tp) in (typing.Union, types.UnionType))
    if value is EMPTY:  # `key:` with nothing after it (yaml_file.py)
        section = _dataclass_type(tp)
        if section is not None and optional:
            keys = ", ".join(f.name for f in dataclasses.fields(section))
            raise ConfigError(
                f"{where} is empty (`{where}:` with nothing under it, or `{where}=`): give its keys ({keys}), or write "
                f"`{where}: null` if null is what you mean (docs/config_reference.md says what it does)"
            )
        value = {} if section is not None else None  # a section that is always there: its defaults
    if value is None:
        if optional:
            return None
        if tp is str:  # `eval.file=` / `key: null` on a text field: empty, which such fields read as "off"
            return ""
        kind = getattr(tp, "__name__", str(tp))
        article = "an" if kind[:1] in "aeiou" else "a"
        raise ConfigError(f"{where} cannot be null: write {article} {kind} value ({where}=VALUE), or leave the key out")
    dc = _dataclass_type(tp)
    if dc is not None:
        if isinstance(value, dc):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a mapping of {dc.__name__} fields, got {value!r}")
        return _from_dict(dc, value, where + ".")
    base = [a for a in typing.get_args(tp) if a is not type(None)][0] if optional else tp
    origin = typing.get_origin(base)
    choice = origin is typing.Literal
    if choice:
        # converted like its values (str); validate() checks the choice, with every other problem (a TRL
        # value such as scale_rewards' true included: trl_names.py names ours)
        base, origin = type(typing.get_args(base)[0]), None
    if origin is list:
        (item,) = typing.get_args(base) or (typing.Any,)
        if isinstance(value, str) and typing.get_origin(item) is typing.Literal:
            value = [value]  # one choice alone, as transformers' report_to takes "wandb" for ["wandb"]
        if not isinstance(value, list):
            raise ConfigError(f"{where} must be a list, got {value!r}")
        return [_convert(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if base is dict or origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a mapping, got {value!r}")
        return plain(value)
    if base is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
        raise ConfigError(f"{where} must be true or false, got {value!r}")
    if base in (int, float):
        if isinstance(value, bool):
            raise ConfigError(f"{where} must be a number, got {value!r}")
        kind = "n integer" if base is int else " number"
        try:
            number = float(value)  # "1e3" too: YAML 1.1 reads it as text in a file, not on the command line
            if base is int:
                if number != int(number):
                    raise ValueError(value)
                number = int(value) if isinstance(value, int) else int(number)
        except (TypeError, ValueError, OverflowError):  # OverflowError: .inf for an integer
            raise ConfigError(f"{where} must be a{kind}, got {plain(value)!r}") from None
        return number
    if base is str:
        if isinstance(value, (dict, list)) or (isinstance(value, bool) and not choice):
            quote = ' (quote it: "...")' if isinstance(value, bool) else ""
            raise ConfigError(f"{where} must be a string{quote}, got {value!r}")
        return source(value) or str(value)  # a revision 0777 stays "0777", 1.10 stays "1.10"
    return plain(value)


def _from_dict(cls, data: dict, prefix: str = ""):
    """``cls`` from its mapping; ConfigError naming every value of the wrong type, one line each (not the first)."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs, problems = {}, []
    for key, value in data.items():
        if key not in names:
            raise _unknown(key, names, prefix)
        try:
            kwargs[key] = _convert(value, hints[key], prefix + key)
        except ConfigError as err:
            problems.append(str(err))
    if problems:
        raise ConfigError("\n".join(problems))
    return cls(**kwargs)


def apply_override(tree: dict, dotted: str, value, unknown: list | None = None) -> None:
    """Set ``tree[a][b][c] = value`` for ``a.b.c``, checking every key against the dataclasses. An unknown key
    raises, or, given the list ``unknown``, adds its ``(dotted key, hint)`` there and sets nothing."""
    keys = _new_name(dotted).split(".")
    cls, node = TrainConfig, tree
    for depth, key in enumerate(keys):
        names = {f.name for f in dataclasses.fields(cls)} if cls else set()
        where = ".".join(keys[:depth])
        item = _ITEM.match(key)
        if cls is not None and item and item.group(1) in names:  # rewards[1].weight=0.5: one entry of a list
            cls, node = _list_item(cls, node, item.group(1), int(item.group(2)), where, depth == len(keys) - 1, value)
            if cls is None:
                return
            continue
        if cls is not None and key not in names:
            prefix = where + "." if where else ""
            if unknown is None:
                raise _unknown(key, names, prefix)
            unknown.append((prefix + key, _unknown_hint(key, names, prefix)))
            return
        if depth == len(keys) - 1:
            node[key] = value
            return
        tp = typing.get_type_hints(cls)[key] if cls else None
        sub = _dataclass_type(tp) if tp is not None else None
        if not isinstance(node.get(key), dict):
            if sub is None:
                node[key] = {}  # free-form mapping (e.g. rewards args)
            else:
                # start from the current value so sibling fields keep theirs (lora was null -> defaults)
                current = node.get(key)
                node[key] = {} if current is None else dict(current) if isinstance(current, dict) else {}
        cls, node = sub, node[key]


_ITEM = re.compile(r"^(\w+)\[(\d+)\]$")


def _list_item(cls, node: dict, name: str, index: int, where: str, last: bool, value):
    """``key[index]`` of an override: the entry's section class and mapping to descend into, or ``(None, None)``
    once ``value`` replaced the entry (``key[index]`` was the override's last part). The entry must exist."""
    key = f"{where}.{name}" if where else name
    hint = typing.get_type_hints(cls)[name]
    section = _section_type(hint)
    entries = node.get(name)
    if section is None or typing.get_origin(hint) is not list:
        raise ConfigError(f"{key}[{index}]: {key} is not a list of sections; write {key}=...")
    if not isinstance(entries, list) or index >= len(entries):
        count = len(entries) if isinstance(entries, list) else 0
        raise ConfigError(
            f"{key}[{index}]: the config has {count} {key} entr{'y' if count == 1 else 'ies'} before this override; "
            f"give the whole list ({key}=[...]) to add one"
        )
    if last:
        entries[index] = value
        return None, None
    if not isinstance(entries[index], dict):
        entries[index] = {}
    return section, entries[index]


def _raise_unknown(unknown: list[tuple[str, str]], path: str | None) -> None:
    """Every unknown key at once: one as before (``unknown config key 'k'; hint``), several as a line each."""
    unknown = list(dict.fromkeys(unknown))  # a key in the file and again as an override: once
    if len(unknown) == 1:
        ((key, hint),) = unknown
        raise ConfigError(f"unknown config key {key!r}; {hint}")
    if unknown:
        where = f" (config file {path} and the key=value overrides)" if path else ""
        lines = [f"{key}: {hint}" for key, hint in unknown]
        raise ConfigError("\n".join([f"{len(lines)} unknown config keys{where}:", *lines]))


def load_config(path: str | None, overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """YAML file (optional) + ``key=value`` overrides -> validated TrainConfig."""
    tree: dict = {}
    if path:
        tree = read_yaml(path)
        _rename_keys(tree)
    unknown = _unknown_keys(TrainConfig, tree)
    given = {item.split("=", 1)[0].strip() for item in overrides}
    for old, new in RENAMED.items():
        if old in given and new in given:  # as in a file: which one was meant is not for us to guess
            raise ConfigError(f"{old} and {new} are the same setting ({old} is its old name): give {new} only")
    _apply_overrides(tree, overrides, unknown)
    _raise_unknown(unknown, path)
    return _built(tree)


def with_overrides(cfg: TrainConfig, overrides: list[str] | tuple[str, ...]) -> TrainConfig:
    """``cfg`` with ``key=value`` overrides applied, validated: a run's config changed in memory, whatever its file
    holds now (it may have been edited or removed since the run loaded it)."""
    tree, unknown = to_dict(cfg), []
    _apply_overrides(tree, overrides, unknown)
    _raise_unknown(unknown, None)
    return _built(tree)


def _apply_overrides(tree: dict, overrides, unknown: list) -> None:
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key=value (e.g. grpo.beta=0.0)")
        key, text = item.split("=", 1)
        apply_override(tree, key.strip(), parse_scalar(text), unknown)


def _built(tree: dict) -> TrainConfig:
    cfg = _from_dict(TrainConfig, tree)
    _expand_home(cfg)
    cfg.validate()
    return cfg


def _expand_home(cfg: TrainConfig) -> None:
    """``~/...`` in the path settings as the shell would expand it (model.path is, by model/source.py): a YAML
    value or a quoted override keeps the ``~``, and output_dir made a directory named ``~`` in the working one."""
    for section, key in (
        (cfg, "output_dir"),
        (cfg.data, "train_file"),
        (cfg.eval, "file"),
        (cfg, "resume_from"),
        (cfg.lora, "init_from"),
    ):
        value = getattr(section, key, None) if section is not None else None
        if isinstance(value, str) and value.startswith("~"):
            setattr(section, key, os.path.expanduser(value))


def to_dict(cfg) -> dict:
    """Plain dict (for saving the config a run used next to its outputs)."""
    return json.loads(json.dumps(dataclasses.asdict(cfg)))
