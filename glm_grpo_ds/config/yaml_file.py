"""A config file's YAML, read strictly: what PyYAML's ``safe_load`` would change or drop without a word is kept or
refused here, with the file and line.

* A key given twice in one mapping is an error (``safe_load`` keeps the last: a second ``grpo:`` section replaced
  the first whole).
* An empty value (``lora:`` with its keys commented out) is :data:`EMPTY`, not null: for a section that may be null
  it is ambiguous (``lora: null`` means full fine-tuning) and the conversion refuses it; elsewhere it reads as null.
* A plain scalar that YAML reads as a number keeps its text (:func:`source`): a text setting takes what was written
  (``revision: 0777`` is "0777", not "511"; ``1.10`` is not "1.1"), every other setting the number.

    tree = read_yaml("run.yaml")     # dict, or ConfigError naming the file (and line)
    plain(value)                     # the same value with plain ints / floats / None, for free-form mappings
"""

from __future__ import annotations

from pathlib import Path

import yaml

from .fields import ConfigError


class _Empty:
    """The value of a key written with nothing after it."""

    def __repr__(self) -> str:
        return "EMPTY"


EMPTY = _Empty()


class _SourcedInt(int):
    source: str


class _SourcedFloat(float):
    source: str


def source(value) -> str | None:
    """The text a YAML number was written as (None for anything else)."""
    return getattr(value, "source", None)


def plain(value):
    """``value`` with :data:`EMPTY` as None and the numbers as plain ``int`` / ``float``, in lists and mappings too."""
    if value is EMPTY:
        return None
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, _SourcedInt):
        return int(value)
    if isinstance(value, _SourcedFloat):
        return float(value)
    return value


class _StrictLoader(yaml.SafeLoader):
    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {key!r} is given twice in one mapping (first on line {seen[key] + 1}); keep one",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)


def _int(loader, node):
    return _sourced(yaml.SafeLoader.construct_yaml_int(loader, node), node.value)


def _float(loader, node):
    return _sourced(yaml.SafeLoader.construct_yaml_float(loader, node), node.value)


def _null(loader, node):
    return EMPTY if node.value == "" else None


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _int)
_StrictLoader.add_constructor("tag:yaml.org,2002:float", _float)
_StrictLoader.add_constructor("tag:yaml.org,2002:null", _null)


def _sourced(number, text: str):
    value = _SourcedFloat(number) if isinstance(number, float) else _SourcedInt(number)
    value.source = text
    return value


def parse_scalar(text: str):
    """A command-line ``key=value``'s value: YAML syntax (numbers, true/false, null, [lists], {maps}) read as the
    file's would be (a number keeps its text for a text setting), ``1e-4`` a number too (YAML 1.1 reads it as text)
    and an empty one :data:`EMPTY` as in the file (``lora=`` with an unset shell variable is refused, not full
    fine-tuning; :func:`plain` reads it as null); text that is not YAML stays text."""
    if not text.strip():
        return EMPTY  # an empty YAML document: None, not the empty-value node
    try:
        value = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError:
        return text
    if isinstance(value, str):
        try:
            return _sourced(float(value) if any(c in value for c in ".eE") else int(value), value)
        except ValueError:
            return value
    return value


def read_yaml(path: str) -> dict:
    """The mapping of config file ``path`` ({} for an empty file); ConfigError naming the file for one that is
    missing, a directory, not UTF-8, not YAML, or not a mapping."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"config file {path} is a directory; give the YAML file in it")
    if not p.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        loaded = yaml.load(p.read_text(encoding="utf-8"), Loader=_StrictLoader)  # noqa: S506 - a SafeLoader
    except UnicodeDecodeError as err:
        raise ConfigError(f"config file {path} is not UTF-8 text ({err.reason} at byte {err.start})") from None
    except OSError as err:  # unreadable: permissions, a file gone from shared storage
        raise ConfigError(f"config file {path} cannot be read ({err.strerror or err}); check its permissions") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"config file {path}{where} is not valid YAML: {getattr(err, 'problem', err)}") from None
    if loaded is None or loaded is EMPTY:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {path} must hold a mapping of config keys")
    bad = _non_text_key(loaded)
    if bad is not None:
        raise ConfigError(f"config file {path}: key {bad!r} is not a name; config keys are text (quote it)")
    return loaded


def _non_text_key(tree):
    """The first mapping key in ``tree`` (sections, lists of sections) that is not a string, else None."""
    if isinstance(tree, list):
        return next((k for item in tree for k in [_non_text_key(item)] if k is not None), None)
    if not isinstance(tree, dict):
        return None
    for key, value in tree.items():
        if not isinstance(key, str):
            return key
        found = _non_text_key(value)
        if found is not None:
            return found
    return None
