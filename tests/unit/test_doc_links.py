"""Every link between the manuals (README.md, docs/*.md) reaches its file and, with a ``#fragment``, a heading of
that file: the fragment as GitHub makes it from the heading's text (lower case, punctuation dropped, spaces to
hyphens, ``-1``, ``-2`` for a repeated heading) or an explicit ``<a id=...>`` / ``<a name=...>``."""

import functools
import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MANUALS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")  # [text](target)
FENCE = re.compile(r"^(```|~~~)")


def slug(heading: str) -> str:
    """GitHub's fragment for a heading's text: letters, marks, digits, ``_``, spaces and hyphens kept (lower case),
    markup and other punctuation dropped, each space a hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()  # a link in a heading: its text
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LMN")
    return kept.replace(" ", "-")


def prose(path: Path):
    """(line number, line) of ``path`` outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if FENCE.match(line.strip()):
            fenced = not fenced
        elif not fenced:
            yield number, line


@functools.cache
def anchors(path: Path) -> frozenset[str]:
    """The fragments ``path`` answers to: each heading's slug (repeats numbered) and each explicit HTML anchor."""
    seen: dict[str, int] = {}
    found = set(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", path.read_text()))
    for _, line in prose(path):
        if line.startswith("#"):
            base = slug(line.lstrip("#"))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return frozenset(found)


def links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every relative link outside code blocks and inline code."""
    return [
        (number, target)
        for number, line in prose(path)
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line))
        if not re.match(r"[a-z]+:", target)  # http:, https:, mailto: are not ours to check
    ]


def test_slug_is_githubs():
    assert slug("One lease: `bash launch/gpu_timing.sh`") == "one-lease-bash-launchgpu_timingsh"
    assert slug("The exact fast sampler (`rollout.fuse_lora`)") == "the-exact-fast-sampler-rolloutfuse_lora"
    assert slug("Planned time per step at 1024²") == "planned-time-per-step-at-1024²"


def test_a_broken_fragment_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## Part one\n\n## Part one\n\nSee [x](#part-one-1) and [y](#part-two).\n")
    assert anchors(page) == {"title", "part-one", "part-one-1"}
    assert [target for _, target in links(page)] == ["#part-one-1", "#part-two"]


@pytest.mark.parametrize("path", MANUALS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_link_reaches_its_file_and_heading(path):
    broken = []
    for number, target in links(path):
        file, _, fragment = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(f"{path.name}:{number}: {target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{path.name}:{number}: {target}: no heading of {dest.name} makes #{fragment}")
    assert not broken, "\n".join(broken)
