"""The dependency ranges glm-grpo-ds declares, the tested top of each, and where the installed versions
stand against them (``glm-grpo env``).

The floor of each dependency is setup.py's ``>=`` (the oldest version CI tests: constraints-floor.txt,
``make test-floor``); the tested top is constraints.txt, which setup.py also publishes as the ``tested``
extra (``pip install "glm-grpo-ds[tested]"`` installs exactly those versions). Both are read from the
installed package's metadata, so this works from a wheel as well as from an installed checkout. A checkout that
is not installed (``PYTHONPATH=. python -m glm_grpo_ds env``, as a bug report or a GPU node often runs it) has no
metadata: then setup.py's ``REQUIRES`` list is read with :mod:`ast` (setup() is not run) and the ``tested`` extra
rebuilt from constraints.txt as setup.py builds it, and :func:`declared` says so::

    from glm_grpo_ds.install.ranges import dependency_rows
    [row for row in dependency_rows() if row.problem]   # what is missing or older than its floor
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from ..runtime.versions import NOT_INSTALLED, package_version

DIST = "glm-grpo-ds"
TESTED_EXTRA = "tested"
BUNDLE_HINT = "a node without a package index: glm-grpo wheelhouse on a machine with one, docs/install.md"
CHECKOUT = Path(__file__).resolve().parents[2]  # the checkout this package runs from, when it is one (setup.py)


@dataclass(frozen=True)
class DependencyRow:
    """One declared dependency: its range, the tested top, the installed version and what is wrong."""

    name: str
    specifier: SpecifierSet  # setup.py's range, e.g. >=2.11.0
    tested: str | None  # the tested top (constraints.txt), None when not pinned there
    installed: str | None  # None when not installed

    @property
    def floor(self) -> str | None:
        """The oldest release in range: ``>=2.11.0a0`` (which admits the NGC containers' own ``2.11.0a0+...``
        builds of a release) is the 2.11.0 floor CI tests."""
        lows = [spec.version for spec in self.specifier if spec.operator in (">=", "==", "~=")]
        return Version(lows[0]).base_version if lows else None

    @property
    def tested_range(self) -> str:
        if self.floor and self.tested and self.floor != self.tested:
            return f"{self.floor} .. {self.tested}"
        return self.tested or self.floor or "any"

    @property
    def problem(self) -> str | None:
        """Why this row keeps glm-grpo-ds from running as tested, or None."""
        if self.installed is None:
            return f"{self.name} is not installed"
        if not self.specifier.contains(self.installed, prereleases=True):
            return f"{self.name} {self.installed} is outside the supported range {self.specifier}"
        return None

    @property
    def note(self) -> str | None:
        """A version above the tested top: allowed, but untested."""
        if self.installed is None or self.tested is None or self.problem:
            return None
        try:
            newer = Version(self.installed).release > Version(self.tested).release
        except InvalidVersion:
            return None
        return f"{self.name} {self.installed} is newer than the tested {self.tested}" if newer else None

    @property
    def fix(self) -> str:
        """The install line that brings this dependency into its tested range."""
        upper = f",<={self.tested}" if self.tested else ""
        return f'pip install "{self.name}{self.specifier}{upper}"'


@dataclass(frozen=True)
class Declared:
    """What ``dist`` declares: its requirements, and where they were read (None: the installed metadata)."""

    requirements: list[Requirement]
    setup_py: Path | None = None


def _setup_py_values(setup_py: Path) -> tuple[list[str], str | None]:
    """``(REQUIRES, version)`` of setup.py, read from its syntax tree: the module-level ``REQUIRES = [...]`` list
    and the ``version=`` literal of its ``setup()`` call (nothing in the file is run)."""
    tree = ast.parse(setup_py.read_text(encoding="utf-8"), str(setup_py))
    requires, version = None, None
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "REQUIRES" for t in node.targets):
            requires = ast.literal_eval(node.value)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setup":
            version = next((ast.literal_eval(k.value) for k in node.keywords if k.arg == "version"), None)
    if not isinstance(requires, list):
        raise ValueError(f"{setup_py} has no REQUIRES = [...] list of requirement strings")
    return requires, version


def _canonical(requirement: str) -> str:
    return canonicalize_name(re.split(r"[<>=!~; \[]", requirement, maxsplit=1)[0])


def checkout_requirements(setup_py: Path) -> list[Requirement]:
    """setup.py's ``REQUIRES`` and, as the ``tested`` extra, constraints.txt's pin of each of them (what setup.py's
    ``tested()`` publishes in an installed package's metadata)."""
    requires, _ = _setup_py_values(setup_py)
    pins = {}
    for line in (setup_py.parent / "constraints.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            pins[_canonical(line)] = line
    names = dict.fromkeys(_canonical(req) for req in requires)
    tested = [Requirement(f'{pins[name]}; extra == "{TESTED_EXTRA}"') for name in names if name in pins]
    return [Requirement(req) for req in requires] + tested


def checkout_version(setup_py: Path = CHECKOUT / "setup.py") -> str | None:
    """The ``version=`` setup.py gives, or None without a setup.py."""
    return _setup_py_values(setup_py)[1] if setup_py.is_file() else None


def declared(dist: str = DIST, setup_py: Path = CHECKOUT / "setup.py") -> Declared:
    """``dist``'s requirements from its installed metadata; not installed: from the checkout's ``setup_py``
    (``Declared.setup_py`` says so). Neither: FileNotFoundError naming both and the fix."""
    try:
        return Declared([Requirement(line) for line in importlib.metadata.requires(dist) or []])
    except importlib.metadata.PackageNotFoundError:
        if not setup_py.is_file():
            raise FileNotFoundError(
                f"{dist} is not installed and there is no {setup_py} to read its ranges from; "
                "pip install -e . in the checkout"
            ) from None
        return Declared(checkout_requirements(setup_py), setup_py)


def _requirements(dist: str = DIST) -> list[Requirement]:
    return declared(dist).requirements


def tested_pins(dist: str = DIST) -> dict[str, str]:
    """``{canonical name: version}`` of the ``tested`` extra (constraints.txt's pins of the direct dependencies)."""
    pins = {}
    for req in _requirements(dist):
        if req.marker is None or not req.marker.evaluate({"extra": TESTED_EXTRA}):
            continue
        exact = [spec.version for spec in req.specifier if spec.operator == "=="]
        if exact:
            pins[canonicalize_name(req.name)] = exact[0]
    return pins


def dependency_rows(dist: str = DIST) -> list[DependencyRow]:
    """One row per dependency that every install needs (no extra), in setup.py's order."""
    tested = tested_pins(dist)
    rows: dict[str, DependencyRow] = {}
    for req in _requirements(dist):
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # an extra's dependency (ocr, tracking, tested, ...)
        key = canonicalize_name(req.name)
        if key not in rows:
            installed = package_version(req.name)
            rows[key] = DependencyRow(
                req.name, req.specifier, tested.get(key), None if installed == NOT_INSTALLED else installed
            )
    return list(rows.values())
