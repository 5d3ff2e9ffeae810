"""The install lines a user copies work as written (issue #61: the README's `pip install -e ".[ocr,flash]" -c
constraints.txt` stopped with "Failed to build 'flash-attn'": flash-attn's build imports torch, which pip's build
isolation hides).

What a CPU can check: no `pip install` line of README.md, docs/*.md (fenced shell blocks), the Makefile or
launch/*.sh asks pip to build flash-attn (the `flash` extra or the package) without `--no-build-isolation`; what the
README's install line installs is inside constraints.txt's pins (setup.py's ranges against the tested top, extras
included) and constraints.txt leaves flash-attn alone; the wheelhouse example bundles the extras the shipped
real-model configs' rewards need; docs/install.md's `glm-grpo env` example is the command's own output. A real
`pip install --dry-run` is not run: the local package index here lacks torch, so it needs the network."""

from __future__ import annotations

import importlib.metadata
import re
import shlex
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from glm_grpo_ds.commands import env
from glm_grpo_ds.config import load_config
from glm_grpo_ds.install import ranges

ROOT = Path(__file__).resolve().parents[2]
SHELL = ("bash", "sh", "shell", "console", "")
REAL_CONFIGS = ("launch/configs/glm_image_lora.yaml", "launch/configs/glm_image_full.yaml")
EXTRA_OF_REWARD = {"ocr": "ocr"}  # rewards whose packages are an extra of glm-grpo-ds (setup.py)


def _commands(text: str) -> list[str]:
    """Lines with their continuations joined, each split at `&&` / `;`, trailing comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", text)
    out = []
    for line in joined.splitlines():
        line = re.split(r"(?:^|\s)#", line, maxsplit=1)[0]
        out += [part.strip() for part in re.split(r"&&|;", line) if part.strip()]
    return out


def pip_install_lines() -> list[tuple[str, str]]:
    """(where, command) for every `pip install` a user or a script runs."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        blocks = re.findall(r"^```(\w*)\n(.*?)^```", path.read_text(encoding="utf-8"), re.S | re.M)
        found += [(path.name, c) for lang, b in blocks if lang in SHELL for c in _commands(b)]
    for path in [ROOT / "Makefile", *sorted((ROOT / "launch").glob("*.sh"))]:
        found += [(path.name, c) for c in _commands(path.read_text(encoding="utf-8"))]
    return [(where, c) for where, c in found if re.search(r"\bpip install\b", c)]


def builds_flash_attn(command: str) -> bool:
    """Whether ``command`` asks pip for flash-attn: the package itself or an extra list naming `flash`."""
    words = shlex.split(command)
    extras = [w for w in words if re.search(r"\[([^\]]*)\]", w)]
    named = any("flash" in re.search(r"\[([^\]]*)\]", w).group(1).split(",") for w in extras)
    return named or any(canonicalize_name(re.split(r"[<>=!~\[ ]", w)[0]) == "flash-attn" for w in words)


def test_no_install_line_builds_flash_attn_inside_build_isolation():
    lines = pip_install_lines()
    assert any(where == "README.md" for where, _ in lines), "the README's install line was not found"
    flash = [(where, c) for where, c in lines if builds_flash_attn(c)]
    assert flash, "no documented flash-attn install line found"  # README and install.md show one
    bad = [f"{where}: {c}" for where, c in flash if "--no-build-isolation" not in c.split()]
    assert not bad, "flash-attn builds against the installed torch: add --no-build-isolation\n" + "\n".join(bad)


def test_the_flash_attn_check_catches_the_old_line():
    assert builds_flash_attn('pip install -e ".[ocr,flash]" -c constraints.txt')
    assert builds_flash_attn('pip install "flash-attn>=2.7" --no-build-isolation')
    assert not builds_flash_attn('pip install -e ".[ocr]" -c constraints.txt')
    assert not builds_flash_attn('pip install -e ".[dev]" -c constraints.txt')


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            pins[canonicalize_name(req.name)] = next(iter(req.specifier)).version
    return pins


def test_the_readme_install_line_is_inside_the_constraints():
    """`pip install -e ".[EXTRAS]" -c constraints.txt`: every requirement it brings (setup.py's, the extras') is
    pinned by constraints.txt inside its range, so pip has one version to take; flash-attn is not pinned (a build
    has to match the node's torch and CUDA)."""
    line = next(c for where, c in pip_install_lines() if where == "README.md" and "-c constraints.txt" in c)
    extras = re.search(r'\.\[([^\]]*)\]"', line).group(1).split(",")
    metadata = importlib.metadata.metadata("glm-grpo-ds")
    assert set(extras) <= set(metadata.get_all("Provides-Extra")), extras
    pins = _pins()
    outside = []
    for text in importlib.metadata.requires("glm-grpo-ds"):
        req = Requirement(text)
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in ["", *extras]):
            continue
        pin = pins.get(canonicalize_name(req.name))
        if pin is None or not req.specifier.contains(pin, prereleases=True):
            outside.append(f"{req} (constraints.txt: {pin})")
    assert not outside, f"{line}: " + "; ".join(outside)
    assert "flash-attn" not in pins


def test_the_wheelhouse_example_bundles_the_extras_the_shipped_configs_need():
    need = set()
    for config in REAL_CONFIGS:
        need |= {EXTRA_OF_REWARD[r.name] for r in load_config(str(ROOT / config)).rewards if r.name in EXTRA_OF_REWARD}
    assert need == {"ocr"}
    blocks = re.findall(r"^```(\w*)\n(.*?)^```", (ROOT / "docs/install.md").read_text(), re.S | re.M)
    lines = [c for _, b in blocks for c in _commands(b) if c.startswith("glm-grpo wheelhouse ")]
    assert lines, "docs/install.md shows no glm-grpo wheelhouse line"
    for line in lines:
        words = shlex.split(line)
        assert "--extras" in words, line
        assert need <= set(words[words.index("--extras") + 1].split(",")), line


def test_the_env_example_is_the_commands_output(monkeypatch):
    """docs/install.md's `glm-grpo env` excerpt is what env.ranges() prints with a container's torch 2.11.0+cu130 and
    a peft older than its floor (the floor is setup.py's, constraints-floor.txt's pin)."""
    installed = {"torch": "2.11.0+cu130", "peft": "0.0.1"}
    real = ranges.package_version
    monkeypatch.setattr(ranges, "package_version", lambda name: installed.get(name, real(name)))
    printed = [line.strip() for line in env.ranges()[0].splitlines()]
    doc = (ROOT / "docs/install.md").read_text(encoding="utf-8")
    block = re.search(r"```text\n(\s*Dependencies: .*?)\s*```", doc, re.S).group(1)
    excerpt = [line.strip() for line in block.splitlines()]
    assert len(excerpt) == 3 and all(line in printed for line in excerpt), (
        "docs/install.md's glm-grpo env example is not the command's output; it prints:\n"
        + "\n".join(line for line in printed if line.split()[:1] in (["Dependencies:"], ["torch"], ["peft"]))
    )
    floor = next(
        line for line in (ROOT / "constraints-floor.txt").read_text().splitlines() if line.startswith("peft==")
    )
    assert f"peft>={floor.split('==')[1]}," in excerpt[-1]  # the floor CI tests (make test-floor)
