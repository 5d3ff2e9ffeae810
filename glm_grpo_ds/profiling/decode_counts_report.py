"""The report of profiling/decode_counts.py: the measurements at two layer counts extrapolated per layer to
GLM-Image's 40, each loop's ratios over the eager LoRA loop's, the checks, and the table printed from them
(``bench.json``'s ``decode_step_counts`` section is this report)."""

from __future__ import annotations

from .decode_counters import COUNTS

FULL_LAYERS = 40  # GLM-Image's AR
TARGET_COMPILED_OVER_EAGER = 4.0  # issue #39: the compiled loop's tokens/s over the eager LoRA loop's, on a CPU


def extrapolate(low: float, high: float, layers_low: int, layers_high: int, to: int = FULL_LAYERS) -> float:
    """Linear in the layer count through the two measurements (None if either is)."""
    if low is None or high is None:
        return None
    return low + (high - low) * (to - layers_low) / (layers_high - layers_low)


def layer_keys(lo: int, hi: int) -> tuple[str, str, str]:
    """The report's columns: the two measured layer counts and :data:`FULL_LAYERS` (JSON object keys)."""
    return str(lo), str(hi), str(FULL_LAYERS)


def variant_table(at: dict, lo: int, hi: int, variants) -> dict:
    """Per variant (``at``: :func:`~glm_grpo_ds.profiling.decode_counts.measure_layers` at ``lo`` and ``hi``
    layers): each count and ms per step at both and extrapolated, the count per layer, tokens/s, and with an
    ``eager`` variant every ratio over it (``vs_eager``)."""
    keys = layer_keys(lo, hi)
    rows = at[lo]["rows"]
    table = {}
    for name in variants:
        a, b = at[lo]["variants"][name], at[hi]["variants"][name]
        v = {"ops": a["ops"]}
        for key in (*COUNTS, "ms_per_step"):
            v[key] = dict(zip(keys, (a[key], b[key], extrapolate(a[key], b[key], lo, hi))))
        v["per_layer"] = {key: (b[key] - a[key]) / (hi - lo) for key in COUNTS}
        v["tokens_per_s"] = {n: rows * 1e3 / ms if ms and ms > 0 else None for n, ms in v["ms_per_step"].items()}
        table[name] = v
    if "eager" in table:
        eager = table["eager"]
        for v in table.values():
            v["vs_eager"] = {
                key: {
                    n: (v[key][n] / eager[key][n] if eager[key][n] and v[key][n] is not None else None) for n in v[key]
                }
                for key in (*COUNTS, "tokens_per_s")
            }
    return table


def checks(at: dict, lo: int, hi: int, names: dict) -> dict:
    """Every count the same in every round; merged == the plain model (kernels, module calls); the compiled
    loop's tokens/s over the eager one's against :data:`TARGET_COMPILED_OVER_EAGER`."""
    keys = layer_keys(lo, hi)
    out = {"counts_repeat": at[lo]["counts_repeat"] and at[hi]["counts_repeat"]}
    if "merged" in names and "plain" in names:
        for key in ("kernels", "module_calls"):
            out[f"merged_{key}_equal_plain"] = all(names["merged"][key][n] == names["plain"][key][n] for n in keys[:2])
    if "compiled_step" in names and "eager" in names:
        out["compiled_over_eager_tokens_per_s"] = dict(names["compiled_step"]["vs_eager"]["tokens_per_s"])
        out["compiled_over_eager_target"] = TARGET_COMPILED_OVER_EAGER
    return out


def format_counts(r: dict) -> str:
    """The table: per decode step, each count and tokens/s at the two layer counts and at 40 (extrapolated, *),
    with each loop's ratio over the eager LoRA loop's (at 40 layers; tokens/s also as measured)."""
    lo, hi = r["layers"]
    keys = layer_keys(lo, hi)
    names = list(r["variants"])
    width = max(15, *(len(n) + 2 for n in names))
    lines = [
        f"per decode step on {r['device']} (torch {r['torch']}): tiny model, G={r['group_size']}, "
        f"{r['size']}x{r['size']}, {r['threads']} CPU threads, LoRA r={r['lora_r']} "
        f"({r['lora_layers'][keys[0]]} / {r['lora_layers'][keys[1]]} adapted linears); measured at {lo} and {hi} "
        f"layers, * = extrapolated linearly per layer to {FULL_LAYERS}",
        f"  {'':<24}" + "".join(f"{n:>{width}}" for n in names),
    ]

    def row(label, cells):
        lines.append(f"  {label:<24}" + "".join(f"{c:>{width}}" for c in cells))

    for key in (*COUNTS, "tokens_per_s"):
        title = key.replace("_per_s", "/s").replace("_", " ")
        for n in keys:
            star = "*" if n == keys[2] else ""
            row(
                f"{title} @{n}{star}" if n == keys[0] else f"  @{n}{star}",
                [_num(v[key][n], ",.0f") for v in r["variants"].values()],
            )
        for n in (keys[0], keys[2]) if key == "tokens_per_s" else (keys[2],):
            if all("vs_eager" in v for v in r["variants"].values()):
                star = "*" if n == keys[2] else ""
                row(f"  x eager @{n}{star}", [_num(v["vs_eager"][key][n], ".2f") for v in r["variants"].values()])
    lines += _check_lines(r["checks"], r["rounds"], keys)
    lines.append(
        "  kernels: aten ops that do work (no views, metadata-only ops or bare allocations; the compiled step's "
        "generated and extern kernels); host syncs: reads of a device value by the host"
    )
    return "\n".join(lines)


def _num(x, fmt):
    return "-" if x is None else format(x, fmt)


def _check_lines(c: dict, rounds: int, keys: tuple[str, str, str]) -> list[str]:
    """The table's lines under the numbers: one per check of :func:`checks`."""
    yes = {True: "yes", False: "NO"}
    lines = [f"  every count the same in all {rounds} rounds: {yes[c['counts_repeat']]}"]
    if "merged_kernels_equal_plain" in c:
        lines.append(
            f"  merged == the plain model (no peft): kernels {yes[c['merged_kernels_equal_plain']]}, "
            f"module calls {yes[c['merged_module_calls_equal_plain']]}"
        )
    if "compiled_over_eager_tokens_per_s" in c:
        target = c["compiled_over_eager_target"]
        ratios = ", ".join(
            f"{_num(x, '.2f')}x at {n}{'*' if n == keys[2] else ''} layers"
            + ("" if x is None else f" ({'met' if x >= target else 'NOT met'})")
            for n, x in c["compiled_over_eager_tokens_per_s"].items()
        )
        lines.append(f"  compiled / eager LoRA tokens/s (target >= {target:.0f}x on a CPU): {ratios}")
    return lines
