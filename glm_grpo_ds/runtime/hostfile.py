"""A DeepSpeed hostfile read the way the launcher reads it, with one-line errors instead of its traceback.

    python -m glm_grpo_ds.runtime.hostfile launch/hostfile   # "2 nodes, 16 slots", or one line on stderr, exit 2

DeepSpeed 0.19.8 (``deepspeed/launcher/runner.py``, ``fetch_hostfile`` / ``_parse_hostfile``) strips each line,
skips blank lines and lines starting with ``#``, and takes every other line by ``re.search(r"^(\\S+)\\s+slots=(\\d+)")``
(so text after the count is ignored: ``node-0 slots=8  # rack 3`` is node-0 with 8). What it does wrong for a
multi-node launch: a missing hostfile is a warning and the run goes on *on this node only*; a bad line, a host
listed twice or a file with no host is a logged dump of the whole file and a 15-line traceback. Here each is one
line naming the file (and the line) and the fix. One deliberate difference: ``slots=0`` (which DeepSpeed accepts,
giving the node no rank) is refused, as a node in the hostfile without a GPU is a typo, never a plan.

``launch/train_multinode.sh`` runs this before it starts the launcher, and reads the node count from the first word of
the summary; ``glm-grpo train --check --hostfile`` imports :func:`read_hostfile`.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

# DeepSpeed's pattern, as runner.py's _parse_hostfile applies it (re.search on the stripped line)
_LINE = re.compile(r"^(\S+)\s+slots=(\d+)")
GOOD_LINE = "'node-0 slots=8' (a host name every node can reach, its number of GPUs; see launch/hostfile.example)"


class HostfileError(ValueError):
    """A hostfile the deepspeed launcher would not launch with (or would launch on this node only): one line,
    naming the file, the line when there is one, and the fix."""


def read_hostfile(path: str | Path) -> list[tuple[str, int]]:
    """``[(host, slots), ...]`` in the file's order, as DeepSpeed's launcher reads them; :class:`HostfileError`
    for a missing or unreadable file, one without any host, a line DeepSpeed refuses, ``slots=0`` or a host
    listed twice."""
    path = Path(path)
    if not path.exists():
        raise HostfileError(
            f"hostfile {path}: no such file (the deepspeed launcher would run on this node only); "
            f"write one line per node, e.g. {GOOD_LINE}"
        )
    if not path.is_file():
        raise HostfileError(f"hostfile {path}: not a file; give the file with one line per node, e.g. {GOOD_LINE}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise HostfileError(
            f"hostfile {path}: not UTF-8 text (byte {e.start}); write one line per node, e.g. {GOOD_LINE}"
        ) from None
    except OSError as e:
        raise HostfileError(f"hostfile {path}: cannot read it ({e.strerror}); check its permissions") from None

    hosts: dict[str, tuple[int, int]] = {}  # host -> (slots, line number)
    for number, raw in enumerate(text.split("\n"), start=1):  # read in universal-newline mode, as DeepSpeed does
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _LINE.search(line)
        if match is None:
            raise HostfileError(
                f"hostfile {path} line {number}: expected 'HOST slots=N', e.g. {GOOD_LINE}; got: {line}"
            )
        host, slots = match.group(1), int(match.group(2))
        if slots == 0:
            raise HostfileError(
                f"hostfile {path} line {number}: {host} has slots=0 (no GPU, no rank); "
                f"give its number of GPUs (e.g. slots=8) or remove the line"
            )
        if host in hosts:
            raise HostfileError(
                f"hostfile {path} line {number}: {host} is listed again (first on line {hosts[host][1]}); "
                f"one line per node, with all its GPUs in slots=N"
            )
        hosts[host] = (slots, number)
    if not hosts:
        raise HostfileError(
            f"hostfile {path}: no host in it (empty, or only comments and blank lines); "
            f"add one line per node, e.g. {GOOD_LINE}"
        )
    return [(host, slots) for host, (slots, _) in hosts.items()]


def summary(hosts: list[tuple[str, int]]) -> str:
    """``2 nodes, 16 slots``: what the command prints (launch/train_multinode.sh reads the first word)."""
    nodes = len(hosts)
    slots = sum(s for _, s in hosts)
    return f"{nodes} node{'s' if nodes != 1 else ''}, {slots} slot{'s' if slots != 1 else ''}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        usage = "usage: python -m glm_grpo_ds.runtime.hostfile HOSTFILE  (prints 'N nodes, S slots'; exit 2 if bad)"
        if argv in (["-h"], ["--help"]):
            print(__doc__.strip() + "\n\n" + usage)
            return 0
        print(f"glm-grpo hostfile: {usage}", file=sys.stderr)
        return 2
    try:
        hosts = read_hostfile(argv[0])
    except HostfileError as e:
        print(f"glm-grpo hostfile: {e}", file=sys.stderr)
        return 2
    print(summary(hosts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
