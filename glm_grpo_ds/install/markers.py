"""A bundle's wheels' own requirements, their markers evaluated for the target, not for the machine that built it.

pip evaluates dependency markers for the machine it runs on, even with ``--python-version`` / ``--platform``
(pypa/pip#11664): a bundle built on Python 3.12 for a 3.10 node lacked ``tomli; python_version < "3.11"`` (of
huggingface_hub), one built on a Mac for Linux lacked torch's ``platform_system == "Linux"`` CUDA wheels, and the
check, resolving on the same machine, passed it. :func:`lacking` reads every wheel's ``Requires-Dist`` and names what
the target needs that neither the bundle nor the target's own packages hold.

    lacking(folder, kept, target, own_extras)   # ["tomli (huggingface_hub needs it on Python 3.10, Linux x86_64)"]
"""

from __future__ import annotations

import re
import sys
import zipfile
from email.message import Message
from email.parser import Parser
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

# a platform tag's operating system as the markers name it: (platform_system, sys_platform, os_name)
SYSTEMS = {
    "manylinux": ("Linux", "linux", "posix"),
    "musllinux": ("Linux", "linux", "posix"),
    "linux": ("Linux", "linux", "posix"),
    "macosx": ("Darwin", "darwin", "posix"),
    "win": ("Windows", "win32", "nt"),
}
MACHINES = {"amd64": "AMD64", "win32": "x86", "universal2": "arm64"}  # tag -> platform_machine where they differ
TAG = r"(?P<family>manylinux|musllinux|macosx|linux|win)(?:_\d+_\d+|\d+)?_(?P<arch>\w+)"  # a wheel platform tag


def target_environment(python: str | None, platform: str | None) -> dict[str, str]:
    """The marker environment of a target (a Python ``X.Y``, a wheel platform tag; None = this machine's)."""
    env = dict(default_environment())
    if python:
        env["python_version"] = python
        env["python_full_version"] = f"{python}.0"
    if platform:
        found = re.fullmatch(TAG, "win_win32" if platform == "win32" else platform)
        if found is None:
            raise ValueError(f"platform tag {platform!r}: not a {', '.join(SYSTEMS)} wheel tag")
        env["platform_system"], env["sys_platform"], env["os_name"] = SYSTEMS[found["family"]]
        env["platform_machine"] = MACHINES.get(found["arch"], found["arch"])
    env.setdefault("implementation_name", sys.implementation.name)
    return env


def wheel_metadata(wheel: Path) -> Message:
    """The METADATA of ``wheel`` (its name, Requires-Dist, Provides-Extra, ...)."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return Parser().parsestr(archive.read(name).decode("utf-8"))


def requirements(metadata: Message) -> list[Requirement]:
    """Every Requires-Dist of ``metadata``, markers and all."""
    return [Requirement(line) for line in metadata.get_all("Requires-Dist") or []]


def lacking(folder: Path, kept: dict[str, str], env: dict[str, str], own: str, own_extras: list[str]) -> list[str]:
    """What the wheels in ``folder`` require on the target (``env``: :func:`target_environment`) that neither the
    folder nor ``kept`` (the target's own packages) holds, one ``"name (who needs it)"`` each. The extras of package
    ``own`` are ``own_extras``; another wheel's extras are not followed (none of ours needs one)."""
    wheels = sorted(folder.glob("*.whl"))
    held = {canonicalize_name(parse_wheel_filename(w.name)[0]) for w in wheels} | set(kept)
    out = []
    for wheel in wheels:
        metadata = wheel_metadata(wheel)
        name, requires = metadata["Name"], requirements(metadata)
        extras = ["", *own_extras] if canonicalize_name(name) == canonicalize_name(own) else [""]
        for req in requires:
            if req.marker is not None and not any(req.marker.evaluate({**env, "extra": e}) for e in extras):
                continue
            if canonicalize_name(req.name) not in held:
                out.append(f"{req.name} ({name} needs it)")
    return sorted(set(out))
