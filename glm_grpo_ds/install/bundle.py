"""The offline bundle: every wheel glm-grpo-ds needs on a target machine, minus what the target already
has, checked complete with pip and no index (``glm-grpo wheelhouse``; docs/install.md).

The build, in order:

1. glm-grpo-ds's own wheel from the checkout (``pip wheel --no-deps``).
2. A dry-run resolution for the target, wheels only: the tested top (constraints.txt) for what the
   target lacks, the target's own version for what it has (``--skip-installed``, standing in as
   placeholder wheels). A dependency with no wheel (DeepSpeed ships only a source archive) is built into
   a wheel here and the resolution runs again; a built wheel must be pure Python for another target.
3. ``pip download`` of what the target lacks; the built wheels copied beside them.
4. The check: the same resolution with ``--no-index`` and the bundle as the only source. A wheel missing
   from the bundle (or deleted later: ``glm-grpo wheelhouse --check OUT``) is named, exit 2.

The bundle folder gets ``constraints.txt`` (every resolved version: installing with ``-c`` keeps the
target's packages as they are), ``installed.txt`` (the target's packages it relies on), ``bundle.json``
and ``install.sh`` (the one install command). It is built in ``OUT.partial`` and renamed when complete.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

from packaging.requirements import Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name, parse_wheel_filename

from .markers import lacking, requirements, target_environment, wheel_metadata
from .pip_runs import (
    BundleError,
    Resolved,
    Target,
    Unresolved,
    placeholder_wheels,
    read_freeze,
    resolve,
    run_pip,
)

PROJECT = "glm-grpo-ds"
# resolutions before giving up: each one builds a wheel from source (DeepSpeed, the one known today) or
# lets a tested-top pin give way to the target's packages
MAX_ROUNDS = 20
# DeepSpeed's source archive builds its CUDA ops only when asked; its wheel stays pure Python and the
# ops build at run time on the GPU machine (what a pip install from the index does too).
SOURCE_BUILD_ENV = {"DS_BUILD_OPS": "0"}


@dataclass
class Bundle:
    """What a build or a check found, for the command's summary."""

    folder: Path
    target: Target
    extras: list[str]
    wheels: list[Path] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)  # the target's packages the bundle relies on
    upgraded: dict[str, tuple[str, str]] = field(default_factory=dict)  # name: (target's, shipped)
    built: list[str] = field(default_factory=list)  # wheels built here from source archives
    relaxed: list[str] = field(default_factory=list)  # tested-top pins that did not fit the target's packages

    @property
    def requirement(self) -> str:
        return f"{PROJECT}[{','.join(self.extras)}]" if self.extras else PROJECT

    @property
    def size_bytes(self) -> int:
        return sum(wheel.stat().st_size for wheel in self.wheels)

    def install_command(self, folder: str | Path | None = None) -> str:
        where = folder or self.folder
        return f'pip install --no-index --find-links {where} -c {where}/constraints.txt "{self.requirement}"'


def project_root(start: Path | None = None) -> Path:
    """The checkout glm-grpo-ds is installed from (its setup.py), for its own wheel."""
    root = (start or Path(__file__).resolve().parents[2]).resolve()
    if not (root / "setup.py").is_file():
        raise BundleError(
            f"{root} has no setup.py: glm-grpo wheelhouse builds glm-grpo-ds from its source; "
            "run it from a checkout (pip install -e .) or pass --project DIR"
        )
    return root


def _wheel_requirements(wheel: Path, extras: list[str]) -> list[Requirement]:
    """The Requires-Dist of ``wheel`` that apply with ``extras``."""
    metadata = wheel_metadata(wheel)
    known = set(metadata.get_all("Provides-Extra") or [])
    unknown = sorted(set(extras) - known)
    if unknown:
        raise BundleError(f"--extras {','.join(unknown)}: glm-grpo-ds has the extras {', '.join(sorted(known))}")
    reqs = requirements(metadata)
    applies = lambda r: r.marker is None or any(r.marker.evaluate({"extra": e}) for e in ["", *extras])  # noqa: E731
    return [r for r in reqs if applies(r)]


def _build_wheel(spec: str, folder: Path, *, source_only: str | None = None) -> Path:
    """``pip wheel --no-deps spec`` into ``folder``; the new wheel's path."""
    before = set(folder.glob("*.whl"))
    args = ["wheel", "--no-deps", "--quiet", "-w", str(folder)]
    if source_only:
        args += ["--no-binary", source_only]
    proc = run_pip(args + [spec], extra_env=SOURCE_BUILD_ENV)
    new = sorted(set(folder.glob("*.whl")) - before)
    if proc.returncode != 0 or not new:
        errors = [line for line in proc.stderr.splitlines() if line.strip()]
        raise BundleError(f"building a wheel of {spec} failed: {errors[-1] if errors else 'no wheel written'}")
    return new[0]


def _check_tags(wheel: Path, target: Target) -> None:
    """A wheel built here installs on another target only when it is pure Python."""
    if target.is_here:
        return
    tags = parse_wheel_filename(wheel.name)[3]
    if not any(tag.abi == "none" and tag.platform == "any" for tag in tags):
        raise BundleError(
            f"{wheel.name} has no wheel for {target.describe()} and builds here only for this machine: "
            f"build it on a machine like the target (pip wheel --no-deps) and pass its folder with --find-links"
        )


def _pinned_constraints(path: Path, kept: dict[str, str], out: Path) -> None:
    """``path``'s pins, except those of packages the target has, which are pinned at the target's version."""
    lines = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if line and canonicalize_name(line.split("==", 1)[0].split(">", 1)[0].split("<", 1)[0]) not in kept:
            lines.append(line)
    lines += [f"{name}=={version}" for name, version in kept.items()]
    out.write_text("\n".join(lines) + "\n")


def build(
    out: Path,
    *,
    target: Target,
    constraints: Path,
    installed: Path | None = None,
    extras: list[str] = (),
    find_links: list[Path] = (),
    project: Path | None = None,
    log=print,
) -> Bundle:
    """Build the bundle in ``out`` (which must not exist or be empty); see the module docstring."""
    _check_inputs(out, constraints, installed)
    freeze = read_freeze(installed) if installed else {}
    freeze.pop(canonicalize_name(PROJECT), None)  # an older glm-grpo-ds there is what the bundle replaces
    bundle = Bundle(out, target, sorted(set(extras)))
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="wheelhouse-") as tmp:
        work = Path(tmp)
        built, stand_ins = work / "built", work / "installed"
        built.mkdir()
        root = project_root(project)
        log(f"glm-grpo wheelhouse: building glm-grpo-ds's wheel from {root}")
        own = _build_wheel(str(root), built)
        _replace_out_of_range(own, bundle, freeze)
        bundle.kept = freeze
        placeholder_wheels(freeze, stand_ins)
        pins = work / "constraints.txt"
        _pinned_constraints(constraints, freeze, pins)
        resolved = _resolve_rounds(bundle, pins, [built, stand_ins, *find_links], work, built, log)
        _record_versions(bundle, resolved)
        _fetch(resolved, freeze, target, partial)
        _write_records(partial, bundle, resolved)
    check(partial)
    if out.exists():
        out.rmdir()
    partial.rename(out)
    bundle.wheels = sorted(out.glob("*.whl"))
    return bundle


def _check_inputs(out: Path, constraints: Path, installed: Path | None) -> None:
    """Refuse a used ``out`` and missing input files before anything is built."""
    if out.exists() and any(out.iterdir()):
        raise BundleError(f"{out} is not empty: choose a new folder (nothing in it was changed)")
    if not constraints.is_file():
        raise BundleError(f"--constraints {constraints}: no such file")
    if installed is not None and not installed.is_file():
        raise BundleError(
            f"--skip-installed {installed}: no such file (on the target: pip list --format=freeze > FILE)"
        )


def _replace_out_of_range(own: Path, bundle: Bundle, freeze: dict[str, str]) -> None:
    """The target's version of a direct dependency outside glm-grpo-ds's range is replaced, and said so: it
    leaves ``freeze`` (the target's packages the bundle keeps) for ``bundle.upgraded``."""
    for req in _wheel_requirements(own, bundle.extras):
        have = freeze.get(canonicalize_name(req.name))
        if have is not None and not req.specifier.contains(have, prereleases=True):
            bundle.upgraded[req.name] = (have, "")
            freeze.pop(canonicalize_name(req.name))


def _resolve_rounds(bundle: Bundle, pins: Path, sources: list[Path], work: Path, built: Path, log) -> list[Resolved]:
    """Resolve until pip finds a set of wheels (at most :data:`MAX_ROUNDS` tries): each failed round builds the
    missing wheel from its source archive or relaxes the tested-top pins that clash with the target's packages."""
    target, freeze = bundle.target, bundle.kept
    for _ in range(MAX_ROUNDS):
        try:
            return resolve([bundle.requirement], pins, target, sources, work)
        except Unresolved as err:
            if err.missing is None or canonicalize_name(Requirement(err.missing).name) in freeze:
                # A tested-top pin that does not fit the target's own packages (torchvision 0.29.2 needs
                # torch >= 2.14, the target has 2.11) gives way: pip then picks the newest version that fits.
                relax = [name for name in _misfits(err, freeze) if _unpin(pins, name)]
                if not relax:
                    raise BundleError(_conflict_message(err, freeze)) from None
                bundle.relaxed.extend(relax)
                continue
            name = canonicalize_name(Requirement(err.missing).name)
            if name in bundle.built:
                raise BundleError(f"{err.missing} (needed by {err.needed_by}): {err}") from None
            log(f"glm-grpo wheelhouse: {name} has no wheel for {target.describe()}: building one from source")
            wheel = _build_wheel(_pinned_spec(err.missing, pins), built, source_only=name)
            _check_tags(wheel, target)
            bundle.built.append(name)
    raise BundleError(
        f"no resolution for {target.describe()} after {MAX_ROUNDS} tries: {bundle.built + bundle.relaxed}"
    )


def _record_versions(bundle: Bundle, resolved: list[Resolved]) -> None:
    """The shipped version of every relaxed pin and of every target package the bundle upgrades."""
    shipped_of = {r.key: r.version for r in resolved}
    bundle.relaxed = [f"{name} {shipped_of[name]}" for name in bundle.relaxed if name in shipped_of]
    for name, (have, _) in bundle.upgraded.items():
        shipped = next(r.version for r in resolved if r.key == canonicalize_name(name))
        bundle.upgraded[name] = (have, shipped)


def _pinned_spec(missing: str, pins: Path) -> str:
    """The missing requirement at its pinned version when the constraints pin one."""
    name = canonicalize_name(Requirement(missing).name)
    for line in pins.read_text().splitlines():
        if "==" in line and canonicalize_name(line.split("==", 1)[0]) == name:
            return line.strip()
    return missing


def _misfits(err: Unresolved, kept: dict[str, str]) -> list[str]:
    """The packages of a conflict whose requirement on one of the target's packages its version misses."""
    names = []
    for who, on, spec in err.depends:
        have = kept.get(canonicalize_name(on))
        if have is not None and canonicalize_name(who) not in kept:
            try:
                if not SpecifierSet(spec.strip()).contains(have, prereleases=True):
                    names.append(canonicalize_name(who))
            except InvalidSpecifier:
                continue  # a requirement pip printed in a form we do not parse: not ours to relax
    return list(dict.fromkeys(names))


def _unpin(pins: Path, name: str) -> bool:
    """Drop ``name``'s pin from the constraints file ``pins``; False when it had none."""
    lines = pins.read_text().splitlines()
    kept = [line for line in lines if canonicalize_name(line.split("==", 1)[0]) != name]
    pins.write_text("\n".join(kept) + "\n")
    return len(kept) < len(lines)


def _conflict_message(err: Unresolved, kept: dict[str, str]) -> str:
    hint = ""
    if kept:
        hint = "; if the target's own version of a package is the clash, delete its line from --skip-installed"
    return f"no set of wheels satisfies glm-grpo-ds for the target: {err}{hint}"


def _local_wheel(url: str) -> Path | None:
    """The file a ``file://`` URL of a resolution names (a wheel built here or one of a --find-links folder)."""
    if not url.startswith("file:"):
        return None
    path = Path(url2pathname(urlparse(url).path))
    return path if path.is_file() else None


def _fetch(resolved: list[Resolved], kept: dict[str, str], target: Target, folder: Path) -> None:
    """Download what the target lacks into ``folder``; copy the wheels pip took from this machine (built here, or
    from a --find-links folder: downloaded by name instead, the index's build, or nothing, replaced the user's)."""
    wanted = [item for item in resolved if item.key not in kept]
    local = {item.url: _local_wheel(item.url) for item in wanted}
    for item in wanted:
        if local[item.url] is not None:
            shutil.copy2(local[item.url], folder / local[item.url].name)
    remote = [f"{item.name}=={item.version}" for item in wanted if local[item.url] is None]
    if remote:
        proc = run_pip(["download", "--no-deps", "--quiet", "-d", str(folder), *target.pip_flags(), *remote])
        if proc.returncode != 0:
            errors = [line for line in proc.stderr.splitlines() if line.startswith("ERROR")]
            raise BundleError(f"pip download failed: {errors[-1] if errors else proc.stderr.strip()[-300:]}")


def _write_records(folder: Path, bundle: Bundle, resolved: list[Resolved]) -> None:
    pins = sorted(f"{item.name}=={bundle.kept.get(item.key, item.version)}" for item in resolved)
    (folder / "constraints.txt").write_text(
        "# Every version this bundle resolves to, the target's own packages included (glm-grpo wheelhouse):\n"
        "# installing with -c keeps what the target has as it is.\n" + "\n".join(pins) + "\n"
    )
    (folder / "installed.txt").write_text(
        "# The target's own packages this bundle relies on (from --skip-installed); not shipped.\n"
        + "".join(f"{name}=={version}\n" for name, version in sorted(bundle.kept.items()))
    )
    record = {
        "python": bundle.target.python,
        "platform": bundle.target.platform,
        "extras": bundle.extras,
        "requirement": bundle.requirement,
        "built_from_source": bundle.built,
        "not_the_tested_top": bundle.relaxed,
        "upgraded": {name: {"target": have, "shipped": new} for name, (have, new) in bundle.upgraded.items()},
    }
    (folder / "bundle.json").write_text(json.dumps(record, indent=2) + "\n")
    script = folder / "install.sh"
    script.write_text(
        "#!/bin/sh\n# Install glm-grpo-ds from this folder, with no package index (made by glm-grpo wheelhouse).\n"
        "# PYTHON=/path/to/python sh install.sh  picks the interpreter; extra arguments go to pip.\n"
        'here=$(cd "$(dirname "$0")" && pwd)\n'
        f'exec "${{PYTHON:-python3}}" -m pip install --no-index --find-links "$here" -c "$here/constraints.txt" '
        f'"{bundle.requirement}" "$@"\n'
    )
    script.chmod(0o755)


def check(folder: Path) -> Bundle:
    """Resolve the bundle in ``folder`` for its target with no index and nothing but its own wheels (and
    placeholders for the target's packages it relies on). Raises :class:`BundleError` naming what is missing."""
    try:
        record = json.loads((folder / "bundle.json").read_text())
    except FileNotFoundError:
        raise BundleError(f"{folder} has no bundle.json: not a folder written by glm-grpo wheelhouse") from None
    bundle = Bundle(folder, Target(record["python"], record["platform"]), record["extras"])
    bundle.kept = read_freeze(folder / "installed.txt")
    bundle.built = record["built_from_source"]
    with tempfile.TemporaryDirectory(prefix="wheelhouse-check-") as tmp:
        work = Path(tmp)
        placeholder_wheels(bundle.kept, work / "installed")
        try:
            resolve(
                [bundle.requirement],
                folder / "constraints.txt",
                bundle.target,
                [folder, work / "installed"],
                work,
                offline=True,
            )
        except Unresolved as err:
            if err.missing:
                needed = f" (needed by {err.needed_by})" if err.needed_by else ""
                raise BundleError(
                    f"the bundle in {folder} is incomplete: no wheel of {err.missing}{needed} for "
                    f"{bundle.target.describe()}; build the bundle again (glm-grpo wheelhouse)"
                ) from None
            raise BundleError(f"the bundle in {folder} does not resolve: {err}") from None
    # pip resolved with this machine's markers; the target's may need more (install/markers.py)
    env = target_environment(bundle.target.python, bundle.target.platform)
    missing = lacking(folder, bundle.kept, env, PROJECT, bundle.extras)
    if missing:
        raise BundleError(
            f"the bundle in {folder} lacks what {bundle.target.describe()} needs: {', '.join(missing)} (pip "
            "evaluates dependency markers for the machine it runs on); build the bundle on a machine with the "
            "target's Python and platform, or give those wheels with --find-links"
        )
    bundle.wheels = sorted(folder.glob("*.whl"))
    return bundle
