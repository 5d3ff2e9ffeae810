"""What a finished run's closing lines and ``glm-grpo check-run`` say needs a look, read from the run's records on
disk (the launches before a resume included): the image-statistics alarms that fired (:func:`records.fired_alarms`)
and the rewards that raised on some samples (``reward/<label>_failed``: a server down, a token rotated, a plugin's
bug). A failed reward leaves its samples undefined: those steps trained on the other rewards, or were skipped, a
change of objective the console said once, mid-run."""

from __future__ import annotations

from pathlib import Path

from ..runtime import log
from .records import fired_alarms, read_metrics


def reward_failures(records: list[dict]) -> dict[str, list[tuple[int, int]]]:
    """Per reward label that failed somewhere: ``(step, samples it left undefined)`` of each step it failed at."""
    failed: dict[str, list[tuple[int, int]]] = {}
    for r in records:
        for key, value in r.items():
            if key.startswith("reward/") and key.endswith("_failed") and value:
                failed.setdefault(key[len("reward/") : -len("_failed")], []).append((r["step"], int(value)))
    return failed


def failure_phrase(label: str, hits: list[tuple[int, int]], steps: int) -> str:
    """One reward's failures in a run of ``steps`` recorded steps, as one phrase."""
    return (
        f"{label}: {sum(n for _, n in hits)} samples undefined by failures in {len(hits)} of {steps} steps "
        f"(steps {hits[0][0]}-{hits[-1][0]}; reward/{label}_failed in metrics.jsonl, the reason in logs/)"
    )


def warn_at_the_end(out: Path) -> list[dict]:
    """Rank 0's closing warnings: a line per alarm that fired in the whole run and per reward that failed in it.
    The alarms that fired (they decide the exit status with monitor.fail_on_alarm)."""
    metrics = out / "metrics.jsonl"
    records = read_metrics(metrics) if metrics.is_file() else []
    failed = reward_failures(records)
    if failed:
        log.warning(f"      rewards that failed on some samples ({len(failed)}; check the reward's server or plugin):")
        for label, hits in sorted(failed.items()):
            log.warning(f"        {failure_phrase(label, hits, len(records))}")
    alarms = fired_alarms(out)
    if alarms is None or not alarms["fired"]:
        return []
    from ..monitoring.alarms import describe

    log.warning(
        f"      alarms that fired ({len(alarms['fired'])}; {Path(alarms['file']).name}): look at the samples "
        "(samples/) before trusting the reward or the adapter"
    )
    for alarm in alarms["fired"]:
        log.warning(f"        {describe(alarm)}")
    return alarms["fired"]
