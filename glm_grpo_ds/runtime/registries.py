"""The one registry helper of the package: a named table of variants (advantage estimators, reward
combinations, loss aggregations, built-in rewards), the pattern of verl's ``core_algos.py``.

    ESTIMATORS = Registry("advantage estimator")

    @ESTIMATORS.register("group")
    def group_zscore(rewards, group_size, eps): ...

    ESTIMATORS.get("group")       # the entry; an unknown name raises ValueError listing the registered ones
    tuple(ESTIMATORS)             # the names, in registration order (the config's choices read this live)

A name cannot be registered twice (ValueError). ``registry[name] = entry`` registers too (with the same
check) and ``del registry[name]`` takes a name back out, so a test can add a variant for its own duration
with ``monkeypatch.setitem``. Standard library only: the pure-torch math modules (grpo.py, advantages.py)
import it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")
_REQUIRED = object()


class Registry(Generic[T]):
    """name -> entry, in registration order; ``kind`` names an entry in the errors ("unknown <kind> ...")."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str, entry: T | None = None) -> Callable[[T], T] | T:
        """``register(name, entry)``, or ``@register(name)`` on a function or class; returns the entry."""
        if entry is not None:
            self[name] = entry
            return entry

        def decorator(obj: T) -> T:
            self[name] = obj
            return obj

        return decorator

    def get(self, name: str, default=_REQUIRED) -> T:
        """The entry of ``name``; without ``default``, an unknown name raises ValueError listing the names."""
        if name not in self._entries:
            if default is not _REQUIRED:
                return default
            raise ValueError(f"unknown {self.kind} {name!r}; expected one of {tuple(self._entries)}")
        return self._entries[name]

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def __setitem__(self, name: str, entry: T) -> None:
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = entry

    def __delitem__(self, name: str) -> None:
        del self._entries[name]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self._entries)})"
