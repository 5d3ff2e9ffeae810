"""``glm-grpo wheelhouse``: every wheel glm-grpo-ds needs on a GPU node without a package index, in one
folder to copy there, checked complete (glm_grpo_ds/install/bundle.py; docs/install.md)::

    # on a machine with an index, for a node whose image has its own torch:
    glm-grpo wheelhouse wheels/ --python 3.12 --platform manylinux_2_28_x86_64 --skip-installed node-freeze.txt
    # on the node (node-freeze.txt came from `pip list --format=freeze` there):
    pip install --no-index --find-links wheels -c wheels/constraints.txt glm-grpo-ds     # or: sh wheels/install.sh
    # after copying, or to see what a deleted wheel breaks:
    glm-grpo wheelhouse --check wheels/

Exit 0 with the bundle complete; 2 when it cannot be built or is incomplete (one line naming what).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..install import bundle as wheels
from ..install.pip_runs import BundleError, Target
from .cli import parser_for

EXTRAS = ("ocr", "tracking", "server", "dev")


def _parser() -> argparse.ArgumentParser:
    parser = parser_for("wheelhouse")
    parser.add_argument("out", type=Path, help="the bundle folder (new or empty)")
    parser.add_argument("--python", default=None, help="the target's Python X.Y (default: this interpreter's)")
    parser.add_argument(
        "--platform",
        default=None,
        help="the target's platform tag, e.g. manylinux_2_28_x86_64; older manylinux tags are implied "
        "(default: this machine)",
    )
    parser.add_argument(
        "--skip-installed",
        type=Path,
        default=None,
        metavar="FREEZE",
        help="the target's `pip list --format=freeze`: what it has in glm-grpo-ds's range (torch above all) "
        "is not shipped, and the install keeps it",
    )
    parser.add_argument(
        "--extras",
        default="",
        help=f"comma-separated extras to bundle too: {', '.join(EXTRAS)} (default: none)",
    )
    parser.add_argument(
        "--constraints",
        type=Path,
        default=None,
        help="versions for what the target lacks (default: the checkout's constraints.txt, the tested top)",
    )
    parser.add_argument(
        "--find-links",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="a folder of wheels you built for the target (repeatable), for a dependency with no wheel",
    )
    parser.add_argument("--project", type=Path, default=None, help="the glm-grpo-ds checkout (default: this one)")
    parser.add_argument(
        "--check",
        action="store_true",
        help="only check the bundle in OUT: resolve it for its target with no index (installs nothing)",
    )
    return parser


def _summary(bundle: wheels.Bundle, checked_only: bool) -> str:
    mb = bundle.size_bytes / 1e6
    lines = [
        f"bundle complete for {bundle.target.describe()}: {bundle.folder} ({len(bundle.wheels)} wheels, "
        f"{mb:.1f} MB; pip resolved it with no index)"
    ]
    if bundle.kept:
        heavy = [f"{name} {bundle.kept[name]}" for name in ("torch", "torchvision") if name in bundle.kept]
        lines.append(
            f"  relies on {len(bundle.kept)} of the target's packages" + (f" ({', '.join(heavy)})" if heavy else "")
        )
    for name, (have, shipped) in bundle.upgraded.items():
        lines.append(f"  the target's {name} {have} is outside glm-grpo-ds's range: the bundle ships {shipped}")
    if bundle.relaxed:
        lines.append(f"  to fit the target's packages, not constraints.txt's tested top: {', '.join(bundle.relaxed)}")
    if bundle.built:
        lines.append(f"  built here from source: {', '.join(bundle.built)}")
    if not checked_only:
        lines += ["install on the target (copy the folder there first):", f"  {bundle.install_command()}"]
        lines.append(f"  or: sh {bundle.folder}/install.sh")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    extras = [e.strip() for e in args.extras.split(",") if e.strip()]
    try:
        if args.check:
            bundle = wheels.check(args.out)
        else:
            constraints = args.constraints or wheels.project_root(args.project) / "constraints.txt"
            bundle = wheels.build(
                args.out,
                target=Target(args.python, args.platform),
                constraints=constraints,
                installed=args.skip_installed,
                extras=extras,
                find_links=args.find_links,
                project=args.project,
            )
    except (BundleError, OSError) as err:
        print(f"glm-grpo wheelhouse: {err}", file=sys.stderr)
        return 2
    print(_summary(bundle, args.check))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
