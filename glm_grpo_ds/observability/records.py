"""The run's JSON-lines record files (``metrics.jsonl``, ``eval.jsonl``): written by :class:`MetricsWriter` on rank 0,
read back by the resume, the tools and the cards (:func:`read_metrics`, :func:`first_record`), and the image-statistics
alarms replayed over them (:func:`fired_alarms`). The records themselves are built in observability/metrics.py."""

from __future__ import annotations

import json
from pathlib import Path

# what a record holds beside each reward's mean (``reward/<label>``, ``eval/reward/<label>``), metrics.py writes them
from ..config.training_sections import REWARD_STATS
from ..runtime.atomic_files import write_text_atomic


class MetricsWriter:
    """``output_dir/name`` (JSON lines with a ``step``); ``resume_step`` keeps the records up to that
    step and appends after them (records a killed run wrote after its last checkpoint are dropped,
    not duplicated; the kept ones are rewritten in one rename, so a kill meanwhile loses none)."""

    def __init__(
        self, output_dir: str | Path, enabled: bool, resume_step: int | None = None, name: str = "metrics.jsonl"
    ):
        self.enabled = enabled
        self.path = Path(output_dir) / name
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            kept = []
            if resume_step is not None and self.path.is_file():
                kept = [r for r in read_metrics(self.path) if r["step"] <= resume_step]
            write_text_atomic(self.path, "".join(_line(r) for r in kept))
            self._fh = open(self.path, "a", encoding="utf-8")

    def write(self, record: dict) -> None:
        if self.enabled:
            self._fh.write(_line(record))
            self._fh.flush()

    def close(self) -> None:
        if self.enabled:
            self._fh.close()


RUN_RECORD = "config.json"


def read_run_record(run: str | Path, others_ok: bool = False) -> dict | None:
    """The run record ``run/config.json`` the trainer writes (``{"train": config, "segments", "model_source", ...}``),
    None when there is none; an OutputDirError naming it when it is not one (cut off, edited, another program's).
    ``others_ok``: another program's JSON (a model's config.json, no train section) is None too, not an error."""
    from ..lifecycle.checkpoint import OutputDirError

    path = Path(run) / RUN_RECORD
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise OutputDirError(f"{path} cannot be read as a glm-grpo run record ({type(err).__name__}: {err})") from None
    if not isinstance(record, dict) or not isinstance(record.get("train"), dict):
        if others_ok:
            return None
        raise OutputDirError(
            f"{path} is not a glm-grpo run's (no train section): {run} is not a glm-grpo run directory; give the "
            "training run's output_dir"
        )
    return record


def run_config(adapter: str | Path) -> tuple[Path, dict] | None:
    """``(run directory, its training config)`` of the run that wrote ``adapter`` (``<run>/final_adapter`` or
    ``<run>/checkpoints/step_N/adapter``, or the run folder itself): the nearest of it and three folders above with
    the trainer's ``config.json``; None when none."""
    path = Path(adapter).resolve()
    for parent in (path, *path.parents[:3]):
        # a model's config.json on the way up is passed over; the run's, cut off or edited, is one line (ValueError)
        record = read_run_record(parent, others_ok=True)
        if record is not None:
            return parent, record["train"]
    return None


def _line(record: dict) -> str:
    return json.dumps(record, sort_keys=True) + "\n"


def first_record(path: Path) -> dict | None:
    """The first record of a metrics file, None when it has none (or is missing)."""
    if not path.is_file():
        return None
    records = read_metrics(path)
    return records[0] if records else None


def read_metrics(path: str | Path) -> list[dict]:
    """The records of a JSON-lines file :class:`MetricsWriter` wrote. A last line without its newline is a record
    cut off as it was written (the run killed, the disk full) and is left out, so a resume and the tools still read
    the file; any other line that is not JSON is a ValueError naming the file and line."""
    text = Path(path).read_text(encoding="utf-8")
    lines = text.split("\n")  # the text after the last newline: "" for a complete file
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            if number == len(lines):
                break  # cut off mid-write
            raise ValueError(f"{path}:{number}: not a JSON record ({err.msg}); fix or delete that line") from None
    return records


def reward_means(record: dict, prefix: str = "reward/") -> dict:
    """``{label: mean}`` of the rewards in ``record``: its ``<prefix><label>`` keys, not their :data:`REWARD_STATS`."""
    return {k[len(prefix) :]: v for k, v in record.items() if k.startswith(prefix) and not k.endswith(REWARD_STATS)}


def fired_alarms(run: Path, step: int | None = None) -> dict | None:
    """What the image-statistics alarms (monitoring/alarms.py) did in the run in directory ``run``, from its
    ``eval.jsonl`` when it evaluated with image statistics (config.json's ``eval.file``: its last launch's),
    else its ``metrics.jsonl`` (the records the monitor checked; up to ``step`` when given): ``{"file", "rules"
    (config.json's monitor.alarms), "fired": [...]}``, ``fired`` being :func:`alarms.replay` of those rules over
    those records (per rule that fired: the statistic, the first step with its value and bound, the steps it
    held at, whether it held at the end); None when neither file holds image statistics."""
    from ..monitoring.alarms import RuleError, parse_rules, replay

    config = run / RUN_RECORD
    train = (read_run_record(run) or {}).get("train", {})
    files = ((run / "eval.jsonl", "eval/images/"), (run / "metrics.jsonl", "images/"))
    if "file" in train.get("eval", {}):  # the file the run's monitor checked (startup.py): a resume may change it
        files = files[:1] if train["eval"]["file"] else files[1:]
    monitored = [
        (path, prefix, records)
        for path, prefix in files
        if path.is_file()
        for records in [[r for r in read_metrics(path) if step is None or r["step"] <= step]]
        if any(key.startswith(prefix) for r in records for key in r)
    ]
    if not monitored:
        return None
    path, prefix, records = monitored[0]
    texts = list(train.get("monitor", {}).get("alarms", []))
    try:
        rules = parse_rules(texts)
    except RuleError as err:  # a run of another version: its rules are not this version's
        raise RuleError(f"{config}: {err}") from err
    return {"file": str(path), "rules": texts, "fired": replay(rules, records, prefix)}
