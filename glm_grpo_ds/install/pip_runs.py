"""pip, run for a target machine: the target's tags as pip flags, a dry-run resolution read from pip's
JSON report, a freeze file read, and placeholder wheels that stand for what the target already has.

Everything goes through ``python -m pip`` of the running interpreter (no pip internals: pip has no API).
A resolution with ``offline=True`` ignores every pip configuration and ``PIP_*`` variable of this machine
(``--isolated``, ``PIP_CONFIG_FILE`` = the null device), so a local ``find-links`` or index never
completes a bundle that is in fact incomplete.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name


class BundleError(RuntimeError):
    """A wheelhouse that cannot be built or is incomplete; the message is the one line the user reads."""


@dataclass(frozen=True)
class Target:
    """The machine the wheels are for: a Python ``X.Y`` and a platform tag; None = this machine's."""

    python: str | None = None
    platform: str | None = None

    @property
    def is_here(self) -> bool:
        here = f"{sys.version_info.major}.{sys.version_info.minor}"
        return self.python in (None, here) and self.platform is None

    def describe(self) -> str:
        python = self.python or f"{sys.version_info.major}.{sys.version_info.minor}"
        return f"Python {python}, {self.platform or 'this machine (' + platform.machine() + ')'}"

    def pip_flags(self) -> list[str]:
        """Wheels only (the target builds nothing), for the target's Python and platform tags."""
        flags = ["--only-binary=:all:"]
        if self.python:
            flags += ["--python-version", self.python]
        for tag in platform_tags(self.platform) if self.platform else ():
            flags += ["--platform", tag]
        if not self.is_here:
            flags += ["--implementation", "cp"]
        return flags


def platform_tags(tag: str) -> list[str]:
    """``tag`` and the older tags a machine with it also installs: pip takes ``--platform`` literally, so
    ``manylinux_2_28_x86_64`` alone would miss every ``manylinux_2_17`` (manylinux2014) wheel."""
    match = re.fullmatch(r"(manylinux|musllinux)_(\d+)_(\d+)_(\w+)", tag)
    legacy = re.fullmatch(r"manylinux(2014|2010|1)_(\w+)", tag)
    if legacy:
        glibc = {"2014": 17, "2010": 12, "1": 5}[legacy.group(1)]
        match = re.fullmatch(r"(manylinux)_(\d+)_(\d+)_(\w+)", f"manylinux_2_{glibc}_{legacy.group(2)}")
    if not match:
        return [tag]
    family, major, minor, arch = match.group(1), int(match.group(2)), int(match.group(3)), match.group(4)
    tags = [f"{family}_{major}_{m}_{arch}" for m in range(minor, -1 if family == "musllinux" else 4, -1)]
    if family == "manylinux" and major == 2:
        aliases = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
        tags += [f"{aliases[m]}_{arch}" for m in sorted(aliases, reverse=True) if m <= minor]
    return tags


def run_pip(args: list[str], *, offline: bool = False, extra_env: dict[str, str] | None = None):
    """``python -m pip ARGS`` with its output captured; ``offline``: this machine's pip settings ignored."""
    env = dict(os.environ)
    command = [sys.executable, "-m", "pip"]
    if offline:
        env = {key: value for key, value in env.items() if not key.startswith("PIP_")}
        env["PIP_CONFIG_FILE"] = os.devnull  # pip then reads no configuration file at all
        command.append("--isolated")
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env.update(extra_env or {})
    return subprocess.run(command + args, env=env, capture_output=True, text=True)


@dataclass(frozen=True)
class Resolved:
    """One distribution of a resolution: name, version and where pip would take it from."""

    name: str
    version: str
    url: str

    @property
    def key(self) -> str:
        return canonicalize_name(self.name)


def resolve(
    requirements: list[str],
    constraints: Path,
    target: Target,
    find_links: list[Path],
    workdir: Path,
    *,
    offline: bool = False,
) -> list[Resolved]:
    """What ``pip install requirements`` would install on ``target`` (nothing installed: a dry run with
    ``--ignore-installed``, so this environment's packages count for nothing). Raises :class:`Unresolved`."""
    report = workdir / "report.json"
    report.unlink(missing_ok=True)
    args = ["install", "--dry-run", "--ignore-installed", "--report", str(report), *target.pip_flags()]
    if not target.is_here:
        args += ["--target", str(workdir / "target")]  # pip takes another machine's tags only with --target
    if offline:
        args.append("--no-index")
    for folder in find_links:
        args += ["--find-links", str(folder)]
    proc = run_pip(args + ["-c", str(constraints), *requirements], offline=offline)
    if proc.returncode != 0:
        raise Unresolved(proc.stdout + proc.stderr)  # pip says why on stdout, what failed on stderr
    items = json.loads(report.read_text())["install"]
    return [Resolved(i["metadata"]["name"], i["metadata"]["version"], i["download_info"]["url"]) for i in items]


class Unresolved(BundleError):
    """pip found no installable set. ``missing``: the requirement nothing offers (``hjson``), with
    ``needed_by`` (``deepspeed==0.19.8``); ``conflict``: pip's lines saying which pins clash."""

    def __init__(self, stderr: str):
        self.stderr = stderr
        self.missing = self.needed_by = None
        found = re.findall(r"No matching distribution found for (.+)", stderr)
        # pip's other wording, when a pin meets no distribution inside a conflict report
        absent = re.search(r"no matching distributions available for your environment:\n\s+(\S+)", stderr)
        if found:
            text = found[-1].strip()
            frm = re.search(r"\(from ([^)]*)\)\s*$", text)
            self.needed_by = frm.group(1) if frm else None
            self.missing = text[: frm.start()].strip() if frm else text
        elif absent:
            self.missing = absent.group(1)
            by = re.search(rf"^\s*(\S+ \S+) depends on {re.escape(self.missing)}\b", stderr, re.MULTILINE)
            self.needed_by = by.group(1) if by else None
        # a conflict's "X 1.0 depends on torch>=2.14": (X, torch, ">=2.14")
        self.depends = [
            (who, on, spec.replace(" and ", ","))
            for who, on, spec in re.findall(
                r"^\s*([A-Za-z0-9_.\-]+) \S+ depends on ([A-Za-z0-9_.\-]+)(.*)$", stderr, re.MULTILINE
            )
        ]
        cause = stderr.split("The conflict is caused by:", 1)
        self.conflict = " ".join(cause[1].strip().split("\n\n", 1)[0].split()) if len(cause) == 2 else None
        errors = [line for line in stderr.splitlines() if line.startswith("ERROR:")]
        super().__init__(self.conflict or (errors[-1] if errors else stderr.strip()[-300:]))


def read_freeze(path: Path) -> dict[str, str]:
    """``{canonical name: version}`` of a ``pip freeze`` / ``pip list --format=freeze`` file."""
    pins = {}
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue  # blank, or a pip option line (-e editable installs carry no version)
        name, sep, version = line.partition("==")
        if not sep or not version.strip() or " @ " in line:
            raise BundleError(
                f"{path}:{number}: {line!r} has no version; write the file with `pip list --format=freeze`"
            )
        pins[canonicalize_name(name.strip())] = version.strip()
    return pins


def placeholder_wheels(pins: dict[str, str], folder: Path) -> None:
    """One empty wheel per ``name==version``: for a resolution, the packages the target already has
    (their own dependencies are in the same freeze, so the placeholders need none)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, version in pins.items():
        stem = f"{re.sub(r'[-.]+', '_', name)}-{version}"
        files = {
            f"{stem}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
            f"{stem}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: glm-grpo-ds\nRoot-Is-Purelib: true\n"
            "Tag: py3-none-any\n",
        }
        files[f"{stem}.dist-info/RECORD"] = "".join(f"{p},,\n" for p in files) + f"{stem}.dist-info/RECORD,,\n"
        with zipfile.ZipFile(folder / f"{stem}-py3-none-any.whl", "w") as wheel:
            for member, text in files.items():
                wheel.writestr(member, text)
