"""Which rank held the others up, when a collective timed out or lost its peer: read by the rank that met it from the
ranks' own logs (``output_dir/logs/rank_<r>.log``, on the storage every node shares), for its one line (train.py).

While a collective waits, each waiting rank's watchdog writes ``has been in <phase> of step N`` to its log
(observability/watchdog.py), and a rank that moves on writes ``... ended after``. So, when the wait ends in an error:

* a rank whose log holds no open report while others' do stopped where its threads could not run: killed,
  SIGSTOPped, its node gone, or stuck in native code holding the GIL;
* a rank whose open report names another phase than the others' is held there (a reward that never returns);
* without reports (``logging.watchdog: false``), the log written longest ago names the likeliest one.

Before, the run ended in the collective's traceback, which names no rank (and the launcher's last line names the last
rank it started, whatever failed).

    holding_up(out, world=2)   # "rank 1 wrote no watchdog report (its log last written 61 s ago) while rank 0 waited
                               #  in advantages of step 16: it stopped (killed, stopped, its node gone, or stuck ...)"
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from ..runtime.run_log import log_path

_REPORT = re.compile(r"watchdog: rank \d+ \(host [^,]+, pid \d+\) has been in (.+?) for \d")
_ENDED = re.compile(r"watchdog: rank \d+: .+? ended after")
_TAIL = 256 * 1024  # bytes of each log read: its reports (with their stacks) are at its end


def _tail(path: Path) -> str:
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - _TAIL))
        return f.read().decode("utf-8", errors="replace")


def read_logs(output_dir, world: int, now: float | None = None) -> dict[int, dict | None]:
    """Per rank: ``{"age": seconds since its log was last written, "waiting": the phase its open watchdog report
    names, or None}``; None for a rank whose log is not there (a node's own disk, or a rank that never started)."""
    now = time.time() if now is None else now
    logs: dict[int, dict | None] = {}
    for rank in range(world):
        path = log_path(output_dir, rank)
        try:
            text, age = _tail(path), now - path.stat().st_mtime
        except OSError:
            logs[rank] = None
            continue
        waiting = None
        for line in text.splitlines():
            report = _REPORT.search(line)
            if report:
                waiting = report.group(1)
            elif _ENDED.search(line):
                waiting = None
        logs[rank] = {"age": age, "waiting": waiting}
    return logs


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def holding_up(output_dir, world: int, now: float | None = None) -> str:
    """The phrase naming the rank(s) the others waited for, from :func:`read_logs`."""
    logs = read_logs(output_dir, world, now)
    missing = [r for r, log in logs.items() if log is None]
    found = {r: log for r, log in logs.items() if log is not None}
    lost = f"; {_ranks(missing)} wrote no log in {Path(output_dir) / 'logs'}" if missing else ""
    if not found:
        return f"the ranks' logs are not in {Path(output_dir) / 'logs'}: they cannot tell which rank stopped"
    waiting = {r: log["waiting"] for r, log in found.items() if log["waiting"]}
    silent = sorted(r for r in found if r not in waiting)
    if waiting and silent:
        age = max(found[r]["age"] for r in silent)
        phases = sorted(set(waiting.values()))
        return (
            f"{_ranks(silent)} wrote no watchdog report (last written {age:.0f} s ago) while "
            f"{_ranks(sorted(waiting))} waited in {' / '.join(phases)}: {'it' if len(silent) == 1 else 'they'} "
            f"stopped (killed, stopped, a node gone, or stuck in native code){lost}"
        )
    if waiting:
        counts: dict[str, list[int]] = {}
        for r, phase in waiting.items():
            counts.setdefault(phase, []).append(r)
        common = max(counts, key=lambda phase: len(counts[phase]))
        odd = {phase: ranks for phase, ranks in counts.items() if phase != common}
        if odd:
            held = "; ".join(f"{_ranks(sorted(ranks))} in {phase}" for phase, ranks in sorted(odd.items()))
            return f"{held}, while {_ranks(sorted(counts[common]))} waited in {common}{lost}"
        return f"every rank reported waiting in {common}: none stands out (a collective of another group?){lost}"
    oldest = max(found, key=lambda r: found[r]["age"])
    return (
        f"no rank wrote a watchdog report (logging.watchdog off?); the log written longest ago is rank {oldest}'s "
        f"({found[oldest]['age']:.0f} s){lost}"
    )


EXIT_COLLECTIVE = 9  # a collective timed out, or lost a rank whose process ended (2 = bad input, 8 = out of memory)


def collective_line(err: BaseException, cfg, world: int, step: int | None) -> str | None:
    """The line of a rank whose collective timed out (naming the rank(s) the others waited for, :func:`holding_up`)
    or lost a peer whose process ended (whose own line says why), with where the run stands (``cfg``: the run's
    config); None for another error."""
    from ..ds import dist
    from ..lifecycle.resume import go_on

    timeout = dist.timed_out(err)
    if timeout is None and not dist.peer_lost(err):
        return None
    cause = timeout or err
    said = re.sub(r"^\[[^\]]*\]\s*", "", (str(cause).strip().splitlines() or [type(cause).__name__])[0])
    at = f" of step {step}" if step else ""
    out = Path(cfg.output_dir)
    if timeout is not None:
        what = f"a collective{at} timed out after dist_timeout_minutes={cfg.dist_timeout_minutes:g} ({said}): "
        what += holding_up(out, world)
        fix = "find what stopped it (its stacks: logs/rank_<r>.log; docs/troubleshooting.md#a-run-that-hangs)"
    else:
        what = f"a collective{at} lost a rank whose process ended ({said}): its own line, or its logs/rank_<r>.log, "
        what += "says why"
        fix = "fix that"
    return f"glm-grpo train: rank {dist.rank()}: {what}; {go_on(out, fix)}"


def end_collective(err: BaseException, cfg, world: int, step: int | None) -> int | None:
    """A rank's end after a collective that timed out or lost its peer: :func:`collective_line` as the run's last line,
    the wait that lets a lost peer's own status be the launcher's, and :data:`EXIT_COLLECTIVE`; None for another
    error (the caller raises it)."""
    from ..ds import dist
    from ..runtime import log

    line = collective_line(err, cfg, world, step)
    if line is None:
        return None
    log.fatal(line, every_rank=True)
    if dist.peer_lost(err):  # the rank that ended said why, with its status: the launcher must see it first
        time.sleep(dist.PEER_GRACE_S)
    dist.shutdown(agreed=False)
    return EXIT_COLLECTIVE
