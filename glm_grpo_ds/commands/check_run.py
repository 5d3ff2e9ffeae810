"""PASS / FAIL verdicts on a finished (short) run: what `launch/gpu_check.sh` prints at the end.

    glm-grpo check-run OUTPUT_DIR [--verify OUTPUT_DIR/verify.txt] [--parity-tolerance TOL]

Reads ``metrics.jsonl`` and ``memory_plan.json`` (both written by the trainer) and, when given, the
output of ``glm-grpo verify-logprobs``, and checks:

* no non-finite step: every step has ``skipped == 0`` and a finite loss;
* ratio 1 on the first iteration: ``first_iteration_ratio_min == first_iteration_ratio_max == 1``
  exactly (the old log-probs of the first iteration are the policy's own, detached);
* sampler vs trainer parity: verify-logprobs' ``max_abs_diff`` within the tolerance and no
  non-finite log-prob;
* measured peak vs the planner: on a GPU ``peak_gpu_memory_mb`` must not exceed the plan's peak;
* the same per phase (rollout, decode, reward, update): the highest ``memory/<phase>_peak_mb`` of the
  run against the plan's persistent memory + that phase's transient (:func:`phase_comparison`);
* a WARN line per reward that raised on some samples (``reward/<label>_failed``), with how many and where;
* the image-statistics alarms (monitoring/alarms.py): a WARN line per rule that fired, with its step, value
  and bound (a person looks at the samples: a short check run on random weights is no judge of what the images
  become), an INFO line when none fired; then the reward and image statistics' curves drawn again into
  ``OUTPUT_DIR/reward_curve.png`` (its path printed last);
* the run's history (INFO): what each resume changed, from which step: another world size or ZeRO stage
  (docs/checkpoints.md "Resume on another cluster shape"), a setting.

On a CPU the peaks are the resident set, which includes the interpreter and libraries the plan (a GPU's) leaves
out: the phases (the plan given ``memory/before_load_mb``, what the process held before the models loaded) and the
whole run's peak are reported, not judged, all in one INFO line, so that every CPU run does not print a warning.

Verdicts: PASS, FAIL, WARN (a person should look: not a failure), INFO (reported only). Exit status 0 when no
check FAILs (WARN and INFO included), 1 otherwise, 2 when OUTPUT_DIR is not a run's output_dir.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from ..memory.plan import MEASURED_PHASES, phase_totals
from ..model.source import RANDOM_NOTE
from ..monitoring.alarms import describe
from ..observability.closing import failure_phrase, reward_failures
from ..observability.records import fired_alarms, read_metrics, read_run_record
from .cli import parser_for

DEFAULT_PARITY_TOLERANCE = 5e-2  # when the verify output names no dtype: bf16's (README "GPU check" says why)
WARN = "warn"  # a verdict that is reported, not failed: an alarm that fired
VERDICT = {None: "INFO", WARN: "WARN", True: "PASS", False: "FAIL"}  # a check's result -> its printed word


def _before_load_mb(rows: list[dict]) -> float:
    """The process's size before the models loaded (a CPU run's baseline the plan leaves out), 0 when not measured."""
    return max((r.get("memory/before_load_mb", 0.0) for r in rows), default=0.0)


def phase_comparison(rows: list[dict], planned: dict) -> dict[str, dict]:
    """Per phase: the step whose ``memory/<phase>_peak_mb`` is highest against its plan (``measured_mb``,
    ``planned_mb``, ``ratio``, ``step``). The plan of a phase is memory_plan.json's persistent components + the
    phase's transient (memory/phases.py :func:`~glm_grpo_ds.memory.phases.phase_totals`), + ``memory/before_load_mb``
    on a CPU; step 1's rollout, decode and reward are planned without the optimizer state its first optimizer step
    creates (a one-step GPU check measures only those). Phases the rows do not hold are left out."""
    steady = phase_totals(planned)
    first = phase_totals(planned, first_step=True)
    before = _before_load_mb(rows)
    out = {}
    for name in MEASURED_PHASES:
        key = f"memory/{name}_peak_mb"
        candidates = []
        for r in rows:
            if key in r:
                planned_mb = (first if r.get("step") == 1 else steady)[name] / 2**20 + before
                ratio = r[key] / planned_mb
                candidates.append(
                    {"measured_mb": r[key], "planned_mb": planned_mb, "ratio": ratio, "step": r.get("step")}
                )
        if candidates:
            out[name] = max(candidates, key=lambda c: c["ratio"])
    return out


def parity_tolerance_for(verify_text: str, given: float | None) -> tuple[float, str]:
    """``(tolerance, where it came from)``: ``given``, else verify-logprobs' own default for the dtype its result
    line names (``(bf16, attn=...)``: 1e-4 in fp32, 5e-2 in bf16), else :data:`DEFAULT_PARITY_TOLERANCE`."""
    from .verify_logprobs import VerifyConfig

    if given is not None:
        return given, "--parity-tolerance"
    found = re.search(r"\((\w+), attn=", verify_text)
    if found and found.group(1) in VerifyConfig.DEFAULT_TOLERANCE:
        return VerifyConfig.DEFAULT_TOLERANCE[found.group(1)], found.group(1)
    return DEFAULT_PARITY_TOLERANCE, "no dtype in the verify output"


def check_inputs(out: Path) -> None:
    """One line (ValueError) when ``out`` is not a training run's output_dir, instead of a raw ``[Errno 2]``."""
    if not out.is_dir():
        raise ValueError(f"{out} is not a directory; give a training run's output_dir")
    for name in ("metrics.jsonl", "memory_plan.json"):
        if not (out / name).is_file():
            raise ValueError(f"{out} holds no {name}: not a training run's output_dir, or its run wrote no step yet")


def check_run(
    out: Path, verify_text: str | None, parity_tolerance: float | None = None
) -> list[tuple[str, bool | str | None, str]]:
    """``[(check, passed (None = report only, :data:`WARN` = reported as a warning), detail)]``."""
    check_inputs(out)
    rows = [r for r in read_metrics(out / "metrics.jsonl") if "loss" in r]
    if not rows:
        raise ValueError(f"{out / 'metrics.jsonl'} has no training steps")
    saved = read_run_record(out)
    train = (saved or {}).get("train") or {}
    results = []
    bad = [r["step"] for r in rows if r.get("skipped") or r.get("loss") is None]
    results.append(("no non-finite step", not bad, f"{len(rows)} steps, non-finite/skipped: {bad or 'none'}"))
    if "max_steps" in train:  # a run that died early (out of memory: the failed step writes no record) is no PASS
        last, planned = max(r["step"] for r in rows), int(train["max_steps"])
        results.append(("run complete", last >= planned, f"last step {last} of max_steps={planned}"))
    results.append(ratio_result(rows, train))
    if verify_text is not None:
        found = re.search(r"max_abs_diff=(\S+) mean_abs_diff=(\S+) nonfinite_logprobs=(\d+)", verify_text)
        if found is None:
            results.append(("sampler vs trainer parity", False, "no verify-logprobs result line found"))
        else:
            max_diff, nonfinite = float(found.group(1)), int(found.group(3))
            tolerance, source = parity_tolerance_for(verify_text, parity_tolerance)
            results.append(
                (
                    "sampler vs trainer parity",
                    max_diff <= tolerance and nonfinite == 0,
                    f"max_abs_diff {max_diff:.3e} (tolerance {tolerance:.0e}: {source}), non-finite {nonfinite}",
                )
            )
    plan = json.loads((out / "memory_plan.json").read_text(encoding="utf-8"))
    results += memory_results(since_last_shape(rows, saved or {}), plan)
    results += alarm_results(out)
    results += reward_failure_results(rows)
    results += history_results(saved)
    results += random_results(saved)
    return results


def ratio_result(rows: list[dict], train: dict) -> tuple[str, bool | None, str]:
    """The first-iteration ratio over all steps: exactly 1 (the old log-probs are the sampling policy's). With one
    update per rollout (``grpo.num_iterations`` and ``batch.mini_batches`` 1) the update takes them from its own pass,
    so the ratio is 1 by construction: not a test of anything, said as INFO (more updates test it)."""
    lo = [r.get("first_iteration_ratio_min") for r in rows]
    hi = [r.get("first_iteration_ratio_max") for r in rows]
    lowest = min((v for v in lo if v is not None), default=None)
    highest = max((v for v in hi if v is not None), default=None)
    span = f"first-iteration ratio in [{lowest}, {highest}] over all steps"
    mini_batches = (train.get("batch") or {}).get("mini_batches", 1)  # runs before batch.mini_batches: 1
    if (train.get("grpo") or {}).get("num_iterations") == 1 and mini_batches == 1:
        return "ratio 1 on the first iteration", None, f"{span}; 1 by construction at grpo.num_iterations=1"
    return "ratio 1 on the first iteration", all(v == 1.0 for v in lo + hi), span  # None (non-finite) fails too


def since_last_shape(rows: list[dict], saved: dict) -> list[dict]:
    """The rows measured on the cluster shape memory_plan.json plans (every launch writes it again): those after the
    last resume that changed the world size or the ZeRO stage (config.json's segments)."""
    moved = [
        int(seg["from_step"])
        for seg in saved.get("segments") or []
        if {"world_size", "zero_stage"} & set(seg.get("changed") or {})
    ]
    return [r for r in rows if r.get("step", 0) > max(moved)] if moved else rows


def random_results(saved: dict | None) -> list[tuple[str, None, str]]:
    """An INFO line when the run trained a ``random:`` model (config.json's ``model_source``; ``saved``:
    :func:`read_run_record`): its figures of time and memory hold, its rewards and learning do not."""
    source = (saved or {}).get("model_source") or {}
    if not source.get("random_weights"):
        return []
    return [("model", None, f"{source['random_weights']}: {RANDOM_NOTE}")]


def history_results(saved: dict | None) -> list[tuple[str, None, str]]:
    """An INFO line with what resumes changed, cluster shape included (``config.json``'s segments: another world size
    or ZeRO stage, a setting), from which step; nothing for a run without ``config.json`` (``saved``:
    :func:`read_run_record`)."""
    if saved is None:
        return []
    later = [seg for seg in saved.get("segments") or [] if seg["changed"]]
    if not later:
        return [("history", None, "one launch shape and one set of settings throughout")]
    said = [
        f"from step {seg['from_step'] + 1}: "
        + ", ".join(f"{k} {old} -> {new}" for k, (old, new) in seg["changed"].items())
        for seg in later
    ]
    return [("history", None, "; ".join(said))]


def memory_results(rows: list[dict], plan: dict) -> list[tuple[str, bool | str | None, str]]:
    """On a GPU a PASS / FAIL per phase and for the whole run's peak; on a CPU one INFO line holding them all
    (the resident set is not what the plan plans: reported, not judged; see the module docstring)."""
    planned = plan["total_bytes"] / 2**20
    phases = phase_comparison(rows, plan)
    if any("peak_gpu_memory_mb" in r for r in rows):
        results: list[tuple[str, bool | str | None, str]] = [
            (
                f"{name} peak <= planner",
                c["ratio"] <= 1.0,
                f"measured {c['measured_mb'] / 1024:.2f} GiB vs planned {c['planned_mb'] / 1024:.2f} GiB "
                f"({c['ratio']:.0%}, step {c['step']})",
            )
            for name, c in phases.items()
        ]
        peak = max(r["peak_gpu_memory_mb"] for r in rows)
        detail = f"measured {peak / 1024:.2f} GiB vs planned {planned / 1024:.2f} GiB ({peak / planned:.0%})"
        return [*results, ("measured peak <= planner", peak <= planned, detail)]
    each = [
        f"{name} {c['measured_mb'] / 1024:.2f} / {c['planned_mb'] / 1024:.2f} GiB ({c['ratio']:.0%})"
        for name, c in phases.items()
    ]
    peak = max(r.get("peak_rss_mb", 0.0) for r in rows)
    planned += _before_load_mb(rows)  # as each phase's, on a CPU
    each.append(f"whole run {peak / 1024:.2f} / {planned / 1024:.2f} GiB ({peak / planned:.0%})")
    detail = (
        f"peak vs planner, measured / planned: {', '.join(each)}; a CPU's resident set holds the interpreter and "
        "libraries that the plan (a GPU's) leaves out, so on a GPU these are PASS / FAIL"
    )
    return [("not judged on a CPU", None, detail)]


def reward_failure_results(rows: list[dict]) -> list[tuple[str, str | None, str]]:
    """A WARN per reward that raised on some samples (observability/closing.py), else one INFO line."""
    failed = reward_failures(rows)
    if not failed:
        return [("reward failures", None, "no reward raised")]
    return [("reward failures", WARN, failure_phrase(label, hits, len(rows))) for label, hits in sorted(failed.items())]


def alarm_results(out: Path) -> list[tuple[str, str | None, str]]:
    """The image-statistics alarms of the run (monitoring/alarms.py): a WARN per rule that fired (not a FAIL:
    a short check run on random weights is no judge of what the images become, a person looking at the samples
    is), else one INFO line."""
    alarms = fired_alarms(out)
    if alarms is None:
        return [("image-statistics alarms", None, "no image statistics in the run's records")]
    rules = "; ".join(alarms["rules"]) or "none"
    if not alarms["fired"]:
        return [("image-statistics alarms", None, f"none fired (rules: {rules})")]
    return [("image-statistics alarm", WARN, f"{describe(a)}; look at {out / 'samples'}/") for a in alarms["fired"]]


def main(argv: list[str] | None = None) -> int:
    parser = parser_for("check-run")
    parser.add_argument("output_dir", help="the run's output_dir (holds metrics.jsonl and memory_plan.json)")
    parser.add_argument("--verify", help="a file holding `glm-grpo verify-logprobs` output")
    parser.add_argument(
        "--parity-tolerance",
        type=float,
        default=None,
        help="max accepted max_abs_diff (default: verify-logprobs' own for the dtype its output names: 1e-4 in "
        f"fp32, 5e-2 in bf16; {DEFAULT_PARITY_TOLERANCE} when it names none)",
    )
    args = parser.parse_args(argv)
    try:
        verify_text = Path(args.verify).read_text(encoding="utf-8") if args.verify else None
        results = check_run(Path(args.output_dir), verify_text, args.parity_tolerance)
    except (OSError, ValueError, KeyError) as err:  # RuleError (a run of another version's alarm rules) included
        print(f"glm-grpo check-run: {err}", file=sys.stderr)
        return 2
    for name, passed, detail in results:
        print(f"{VERDICT[passed]}  {name}: {detail}")
    from ..observability.plot import PLOT_NAME, plot_training

    out = Path(args.output_dir)  # check_run found its metrics.jsonl: the reward and statistics' curves, drawn again
    try:
        print(f"INFO  curves: {plot_training(out / 'metrics.jsonl', out / PLOT_NAME, out / 'eval.jsonl')}")
    except OSError as err:  # a run folder it may only read: the checks' verdict stands
        print(f"INFO  curves: not drawn again ({err.strerror}: {err.filename}); `glm-grpo plot {out} --out PNG`")
    return 0 if all(p is not False for _, p, _ in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
