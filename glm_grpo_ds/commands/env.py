"""``glm-grpo env``: the versions and hardware a bug report needs, as one block to paste into an issue::

    glm-grpo env

Lists Python, glm-grpo-ds and each library the trainer runs on (``not installed`` when absent),
the platform, torch's CUDA build next to the NVIDIA driver's version (and the newest CUDA it supports:
a driver older than torch's build leaves CUDA unusable), whether CUDA is usable, the GPUs (count, names, memory) and the
NCCL version. Versions come from the installed packages' metadata, so nothing heavy is imported but
torch (for the CUDA facts; a torch that cannot be imported is reported, not raised); no model loads.

Then every dependency against its supported range (setup.py's floor .. the tested top, constraints.txt):
one that is missing or outside gets its ``pip install`` line, and the exit status is 1 (0 when all fit).
From a checkout that is not pip-installed (``PYTHONPATH=. python -m glm_grpo_ds env``) there is no package
metadata: one line says so, glm-grpo-ds's row shows setup.py's version, and the ranges are read from setup.py
(install/ranges.py).
"""

from __future__ import annotations

import platform
import sys

from ..install.ranges import BUNDLE_HINT, DIST, checkout_version, declared, dependency_rows
from ..runtime.cuda_check import driver_cuda, driver_version
from ..runtime.versions import NOT_INSTALLED, framework_versions
from .cli import parser_for


def _torch_facts() -> list[tuple[str, str]]:
    """CUDA build, availability, GPUs and NCCL, from torch (imported here: the only heavy import)."""
    try:
        import torch
    except Exception as err:  # noqa: BLE001 - a broken torch install is what a bug report must show, not a crash
        return [("torch import", f"failed: {type(err).__name__}: {' '.join(str(err).split())[:200]}")]
    facts = [("torch CUDA build", torch.version.cuda or "none (CPU-only build)")]
    try:
        available = torch.cuda.is_available()
    except Exception as err:  # noqa: BLE001 - e.g. a driver mismatch: report it
        return facts + [("CUDA available", f"error: {type(err).__name__}: {err}")]
    facts.append(("CUDA available", str(available)))
    if available:
        count = torch.cuda.device_count()
        gpus = []
        for index in range(count):
            props = torch.cuda.get_device_properties(index)
            gpus.append(f"{props.name} ({props.total_memory / 2**30:.1f} GiB)")
        same = len(set(gpus)) == 1
        facts.append(("GPUs", f"{count} x {gpus[0]}" if same else f"{count}: " + ", ".join(gpus)))
    else:
        facts.append(("GPUs", "0"))
    try:
        nccl = torch.cuda.nccl.version()
        facts.append(("NCCL", ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)))
    except Exception as err:  # noqa: BLE001 - torch built without NCCL (CPU wheels): say so
        facts.append(("NCCL", f"n/a ({type(err).__name__})"))
    return facts


def _driver() -> str:
    """The NVIDIA driver's version and the newest CUDA it supports, or ``none``."""
    version = driver_version()
    if version is None:
        return "none"
    cuda = driver_cuda()
    return f"{version} (CUDA <= {cuda})" if cuda else version


def report() -> str:
    """The paste-able block."""
    rows = [("Python", platform.python_version()), ("Platform", platform.platform())]
    versions = framework_versions()
    if versions[DIST] == NOT_INSTALLED and (version := checkout_version()) is not None:
        versions[DIST] = f"{NOT_INSTALLED} (a checkout: setup.py says {version})"
    rows += list(versions.items())
    facts = _torch_facts()
    at = next((i + 1 for i, (name, _) in enumerate(facts) if name == "torch CUDA build"), len(facts))
    facts.insert(at, ("NVIDIA driver", _driver()))  # next to torch's build: the pair decides if CUDA works
    rows += facts
    width = max(len(name) for name, _ in rows)
    lines = ["Copy-and-paste the text below into your bug report.", ""]
    lines += [f"- {name + ':':<{width + 1}} {value}" for name, value in rows]
    return "\n".join(lines)


def ranges() -> tuple[str, int]:
    """The dependencies against their supported range, and how many are missing or outside it."""
    source = declared().setup_py
    rows = dependency_rows()
    width = max(len(row.name) for row in rows)
    lines = [""]
    if source is not None:
        lines.append(
            f"{DIST} is not installed (running from the checkout {source.parent}): the ranges below are read "
            f"from {source} and constraints.txt"
        )
    lines.append("Dependencies: installed, supported from the floor (setup.py) .. the tested top (constraints.txt):")
    for row in rows:
        flag = f"  OUTSIDE: {row.fix}" if row.problem else ("  newer than tested" if row.note else "")
        lines.append(f"  {row.name:<{width}}  {row.installed or 'missing':<12} {row.tested_range}{flag}")
    problems = [row.problem for row in rows if row.problem]
    if problems:
        lines.append(f"{len(problems)} outside the supported range: {'; '.join(problems)}.")
        lines.append(f"Fix with the pip install line(s) above ({BUNDLE_HINT}).")
    else:
        lines.append("Every dependency is inside its supported range.")
    return "\n".join(lines), len(problems)


def main(argv: list[str] | None = None) -> int:
    parser = parser_for("env")
    parser.parse_args(argv)
    print(report())
    try:
        text, problems = ranges()
    except FileNotFoundError as err:  # neither installed nor a checkout: the block above still stands
        print(f"glm-grpo env: {err}", file=sys.stderr)
        return 2
    print(text)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
