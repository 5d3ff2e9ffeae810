"""Building blocks of the config dataclasses: the error type, fields with help text, and the check of
``Literal[...]`` choices that validation and loading share."""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import field
from typing import Literal


def is_repo_id(name: str) -> bool:
    """``namespace/name`` that the Hub accepts as a repository id (and that is not spelled like a path):
    ``hub.repo_id``, a model id for ``model.path`` / ``--model``, the base model a card names."""
    if not name or name.count("/") != 1 or name.startswith((".", "~")):
        return False
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


class ConfigError(ValueError):
    """A configuration problem; the message names the key and the fix."""


def setting(default=dataclasses.MISSING, help: str = "", *, factory=dataclasses.MISSING, **metadata):
    """A dataclass field with its help text in ``metadata["help"]`` (TRL-style), the one place it is
    written: docs/config_reference.md is generated from it (``glm-grpo config-docs``).
    ``noun`` in ``metadata`` names a ``Literal`` field's values in its error (default: field name)."""
    return field(default=default, default_factory=factory, metadata={"help": help, **metadata})


def default_of(section, name: str):
    """The dataclass default of field ``name`` of ``section`` (a section instance or class): what a setting left
    unset holds, for the rules that tell a value given from the default."""
    f = {f.name: f for f in dataclasses.fields(section)}[name]
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


# dtype names of model.dtype and decoder.dtype.
Dtype = Literal["auto", "bf16", "fp32", "fp16"]


def literal_choices(tp) -> tuple | None:
    """The values a ``Literal[...]`` annotation (or ``Literal[...] | None``) allows, else None."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        tp = args[0] if len(args) == 1 else tp
    return typing.get_args(tp) if typing.get_origin(tp) is typing.Literal else None


def choice_error(value, choices: tuple, where: str, noun: str) -> str:
    """One line: the key, the bad value, a close match if any, the valid values."""
    from .trl_names import trl_value_hint

    known = [str(c) for c in choices]
    trl = trl_value_hint(where, value)  # TRL's word for one of ours: say which, not the closest-looking name
    close = difflib.get_close_matches(str(value), known, n=1, cutoff=0.5)
    if trl is not None:
        hint = f"{trl}; known: "
    else:
        hint = f"did you mean {', '.join(repr(c) for c in close)}? known: " if close else "known: "
    return f"{where}: unknown {noun} {value!r}; {hint}{', '.join(known)}"


def choice_problems(obj, prefix: str = "") -> list[str]:
    """One line per value of dataclass ``obj`` (nested sections and list items included) that its
    ``Literal[...]`` annotation does not allow. A nested section with ``problems()`` of its own
    (every section of the training config) is left to it."""
    problems: list[str] = []
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value, tp = getattr(obj, f.name), hints[f.name]
        if isinstance(value, list):
            tp = (typing.get_args(tp) or (typing.Any,))[0]
            items = [(f"{prefix}{f.name}[{i}]", v) for i, v in enumerate(value)]
        else:
            items = [(prefix + f.name, value)]
        choices = literal_choices(tp)
        for where, v in items:
            if dataclasses.is_dataclass(v):
                if not hasattr(v, "problems"):
                    problems += choice_problems(v, where + ".")
            elif choices is not None and v is not None and v not in choices:
                problems.append(choice_error(v, choices, where, f.metadata.get("noun", f.name.replace("_", " "))))
    return problems
