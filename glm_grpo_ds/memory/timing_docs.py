"""launch/gpu_timing.sh's JSONs -> every figure a user reads: ``python -m glm_grpo_ds.memory.step_time --write-docs
OUT [--root DIR]`` rewrites

* docs/memory-and-speed.md's generated regions (``<!-- gpu-timing:BEGIN name -->`` ... ``<!-- gpu-timing:END name
  -->``): ``train``, ``train-one-step-off``, ``dit`` and ``decode``, each from its part's JSON with the card, the date
  and the torch version, and ``planned-step``: the shipped LoRA config's planned step on the anchors as rewritten;
* README.md's ``time-per-step`` region: the measured full-size step (from a full-size run only) and that plan;
* glm_grpo_ds/memory/gpu_figures.py's anchors (``# gpu-timing:BEGIN anchors``): the decode step per sampler, the DiT
  per guided image-step and its glyph encoder + VAE per image, the DiT options' speed-ups, the update; only what the
  JSONs measured at the anchors' own setting (GLM-Image at full size, 1024x1024, G=16 rows, LoRA r=64, DiT batch 8)
  on a GPU, each value tagged ``[card date]``.

A part whose JSON is missing leaves its regions as they were, and the command says so; ``--root`` writes into a copy
of those three files (the tests). The planned seconds that docs prose quotes outside the regions are checked by
tests/unit/test_doc_figures.py, which names any the new anchors move.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import importlib.util
import json
import re
import sys
import textwrap
from pathlib import Path

from ..decoder.settings import guided_steps
from . import gpu_figures
from .gpu_figures import ANCHOR_VARIANTS
from .measured import FULL_AR_LAYERS, FULL_DIT_LAYERS, PHASES, dit_options, step_seconds

DOCS, README, ANCHORS = "docs/memory-and-speed.md", "README.md", "glm_grpo_ds/memory/gpu_figures.py"
PARTS = ("train", "train_one_step_off", "dit_timing", "decode_timing")
REGIONS = {"train": "train", "train_one_step_off": "train-one-step-off", "dit_timing": "dit", "decode_timing": "decode"}
REPO = Path(__file__).resolve().parents[2]
CARDS = ("GH200", "H200", "H100", "H20", "B200", "A100")  # a GPU's short name, looked for in its device name


# --- the regions' text ------------------------------------------------------------------------------------------


def _fill(text: str) -> str:
    """A paragraph wrapped as the docs are (116 characters; code spans and paths unbroken)."""
    return textwrap.fill(text, 116, break_on_hyphens=False, break_long_words=False)


def _when(m: dict, path: Path) -> str:
    date = m.get("date") or datetime.date.fromtimestamp(path.stat().st_mtime).isoformat()
    return f"Measured {date} on {m['device']} (torch {m['torch']})"


def _sampler(rollout: dict) -> str:
    name = "LoRA merged" if rollout["merge_lora"] else "the exact fused sampler" if rollout["fuse_lora"] else "LoRA"
    how = ["captured" if rollout["cuda_graph"] else "eager"] + (["layers compiled"] if rollout["compile"] else [])
    return f"{name} ({', '.join(how)})"


def _steps_table(m: dict) -> list[str]:
    rows = [
        "| step | rollout s | decode s | reward s | update s | step s | s / image | images / GPU-s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def row(label, seconds, total):
        cells = " | ".join("-" if s is None else f"{s:.2f}" for s in seconds)
        return f"| {label} | {cells} | {total:.2f} | {total / m['images']:.3f} | {m['images'] / total:.3f} |"

    for r in m["steps"]:
        label = f"{r['step']}" + (" (beside)" if r.get("rollout_overlapped") else "")
        rows.append(row(label, [float(r.get(f"time/{p}", 0.0)) for p in PHASES], step_seconds(r)))
    if m.get("planned"):
        rows.append(row("plan", [m["planned"].get(f"{p}_s") for p in PHASES], m["planned"]["total_s"]))
    return rows


def train_region(m: dict, path: Path) -> str:
    d, lease = m["decoder"], m.get("lease") or {}
    guided = guided_steps(d["num_inference_steps"], d["guidance_scale"], d["guidance_steps"])
    text = (
        f"{_when(m, path)}, `launch/gpu_timing.sh` ({path.name}): `{m['model']}`, ZeRO-{m['zero_stage']}, "
        f"{m['images']} images a step, {m['size'][0]}x{m['size'][1]}, {d['num_inference_steps']} DiT steps "
        f"({guided} guided), {_sampler(m['rollout'])}, the DiT {'compiled' if d['compile'] else 'eager'}"
        + (f"; {lease['wall_s']:.0f} s of the lease, {lease['planned_s']:.0f} planned" if lease else "")
        + ". Step s: the phases' sum (one step off: the wait for the rollout drawn beside, not that rollout); plan: "
        "`glm-grpo estimate-memory`'s, no reward counted:"
    )
    lines = [_fill(text), "", *_steps_table(m)]
    if m.get("compared"):
        lines += ["", "```text", *m["compared"], "```"]
    return "\n".join(lines)


def dit_region(m: dict, path: Path) -> str:
    s1, s2 = m["steps"]
    lines = [
        _fill(
            f"{_when(m, path)}, `glm-grpo profile dit-timing` ({path.name}): DiT {m['dit_layers']} layers x "
            f"{m['dit_hidden']}, {m['dtype']}, {m['size']}x{m['size']}, batch {m['batch']}, steps {s1} and {s2}, "
            f"guidance {m['guidance']:g}:"
        ),
        "",
        "| variant | s / image-step | x sdpa | setup s | max abs diff | PSNR dB | peak GiB |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in m["variants"].items():
        psnr = "equal" if r.get("psnr_db") is None else f"{r['psnr_db']:.1f}"
        peak = "-" if r.get("peak_bytes") is None else f"{r['peak_bytes'] / 2**30:.2f}"
        lines.append(
            f"| `{name}` | {r['s_per_image_step']:.4g} | {r['speedup_vs_sdpa']:.2f} | {r['setup_s']:.1f} | "
            f"{r['max_abs_diff']:.1e} | {psnr} | {peak} |"
        )
    notes = [f"- {kind} `{k}`: {v}" for kind in ("skipped", "failed") for k, v in m[kind].items()]
    notes += [f"- not run (stopped): {', '.join(f'`{k}`' for k in m['pending'])}"] if m.get("pending") else []
    if "guidance_half" in m["variants"]:
        frac = m["variants"]["guidance_half"].get("guided_fraction", 0.5)
        note = (
            f"- `guidance_half`: guidance on the first half of the steps only ({frac:.0%} of the timed steps guided): "
            "seconds per image-step of such a decode, not per guided step; its images differ from sdpa's by design"
        )
        notes.append(textwrap.fill(note, 116, subsequent_indent="  ", break_on_hyphens=False))
    return "\n".join(lines + ([""] + notes if notes else []))


def decode_region(m: dict, path: Path) -> str:
    first = next(iter(m["rows"].values()))
    lines = [
        _fill(
            f"{_when(m, path)}, `glm-grpo profile decode-timing` ({path.name}): {first['layers']} layers, "
            f"{first['size']}x{first['size']}, LoRA r={first['lora_r']}, {first['decode_tokens']} tokens per image, "
            f"{first['steps_timed']} steps timed; rollout s / image = ms / step x tokens per image / rows:"
        ),
        "",
        "| rows | variant | ms / step | floor ms | rollout s / image | same tokens as |",
        "|---:|---|---:|---:|---:|---|",
    ]
    failed = []
    for rows, r in m["rows"].items():
        floor = "-" if not r.get("floor_ms_per_step") else f"{r['floor_ms_per_step']:.2f}"
        for name, v in r["variants"].items():
            per_image = v["ms_per_step"] / 1e3 * r["decode_tokens"] / int(rows)
            same = "-"
            if "reference" in v:  # its tokens against its reference loop's, and their log-probs' largest gap
                same = f"`{v['reference']}`: {v['same_tokens']:.1%}, max \\|dlogp\\| {v['max_logp_diff']:.1e}"
            lines.append(f"| {rows} | `{name}` | {v['ms_per_step']:.2f} | {floor} | {per_image:.3f} | {same} |")
        failed += [f"- **FAIL** at {rows} rows: {f}" for f in r.get("failures", [])]
    return "\n".join(lines + ([""] + failed if failed else []))


def short_card(device: str) -> str:
    return next((c for c in CARDS if c in device), device)


def readme_measured(m: dict, off: dict | None) -> str:
    """The README's measured step: the full-size run's steady mean, per phase, images per GPU-second."""
    s, d = m["steady"], m["decoder"]
    guided = guided_steps(d["num_inference_steps"], d["guidance_scale"], d["guidance_steps"])
    text = (
        f"Measured on one {short_card(m['device'])} ({m['date']}, torch {m['torch']}) at "
        f"{d['num_inference_steps']} DiT steps ({guided} guided) with {_sampler(m['rollout'])} and the DiT "
        f"{'compiled' if d['compile'] else 'eager'}: **{s['step_s']:.1f} s** (rollout {s['rollout_s']:.1f} + decode "
        f"{s['decode_s']:.1f} + reward {s['reward_s']:.1f} + update {s['update_s']:.1f}; "
        f"{s['images_per_gpu_s']:.2f} images per GPU-second)"
    )
    if off and off.get("full_size"):
        text += f"; one step off **{off['steady']['step_s']:.1f} s** ({off['steady']['images_per_gpu_s']:.2f})"
    return text + "."


# --- the planner's anchors --------------------------------------------------------------------------------------


def anchor_updates(parts: dict[str, dict | None]) -> tuple[dict, list[str], str | None]:
    """What the JSONs measured of the anchors at their own setting: (updates by constant name, why any was left,
    the card's device name). A CPU's figures update nothing."""
    updates, notes, device = {}, [], None
    decode, dit, train = parts["decode_timing"], parts["dit_timing"], parts["train"]
    r16 = (decode or {}).get("rows", {}).get("16")
    # the anchors' own setting, on a GPU: the AR's 16 rows at 1024x1024 with LoRA r=64, the DiT's batch 8 at 1024x1024
    full_ar, full_dit = (FULL_AR_LAYERS, 1024, 64, True), (FULL_DIT_LAYERS, 1024, 8, True)
    if r16 and (r16["layers"], r16["size"], r16["lora_r"], r16["device"] != "cpu") == full_ar:
        ms = {
            ANCHOR_VARIANTS[n]: round(v["ms_per_step"], 2) for n, v in r16["variants"].items() if n in ANCHOR_VARIANTS
        }
        updates["DECODE_STEP_MS"], device = ms, r16["device"]
        if r16.get("hbm_bytes_per_s"):
            updates["CARD_BYTES_PER_S"] = float(r16["hbm_bytes_per_s"])
    elif decode:
        notes.append("decode step: not the full-size AR on a GPU at 16 rows, 1024x1024, LoRA r=64")
    if dit and (dit["dit_layers"], dit["size"], dit["batch"], dit["device"] != "cpu") == full_dit:
        sdpa, (s1, _) = dit["variants"]["sdpa"], dit["steps"]
        per = sdpa["s_per_image_step"]
        updates["GUIDED_IMAGE_STEP_S"] = round(per, 4)
        updates["DECODE_FIXED_S"] = round(max(sdpa["seconds"][str(s1)] / dit["batch"] - s1 * per, 0.0), 4)
        options = {  # each DiT option set timed (sdpa itself and guidance_half change no option)
            dit_options(o.get("compile", False), o.get("fp8", False), o.get("attention", "sdpa")): r
            for r in dit["variants"].values()
            if (o := r["overrides"])
        }
        updates["DIT_SPEEDUP"] = {key: round(r["speedup_vs_sdpa"], 3) for key, r in options.items()}
        device = device or dit["device"]
    elif dit:
        notes.append("DiT: not GLM-Image's 30-layer DiT on a GPU at 1024x1024, batch 8")
    if train and train["full_size"] and train["lora"] and train["images"] == 16 and train["size"] == [1024, 1024]:
        if train["device"] != "cpu":
            updates["UPDATE_S"] = {3 if train["zero_stage"] == 3 else 2: round(train["steady"]["update_s"], 2)}
            device = device or train["device"]
    elif train:
        notes.append("update: not GLM-Image at full size with LoRA, 16 images of 1024x1024, on a GPU")
    if device is not None:
        updates["CARD"] = f"one {short_card(device)}"
    return updates, notes, device


def _literal(v) -> str:
    """``v`` as ruff formats a Python literal (double quotes, ``3.35e12``)."""
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_literal(k)}: {_literal(x)}" for k, x in v.items()) + "}"
    if isinstance(v, tuple):
        return "(" + ", ".join(map(_literal, v)) + ")"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, float) and abs(v) >= 1e6:
        return f"{v:.4g}".replace("e+", "e")
    return repr(v)


def _tagged(code: str, comment: str | None, tag: str) -> str:
    """``code`` with its comment, its older ``[card date]`` tag (or its ``untagged:`` source) replaced by ``tag``,
    kept within 120 characters."""
    text = re.sub(r"\s*\[[^\]]*\]$", "", (comment or "").strip().removeprefix("#").strip())
    text = re.sub(r"\s*untagged: .*$", "", text)  # where the untagged value came from: no longer this value's
    line = f"{code}  # {text} {tag}" if text else f"{code}  # {tag}"
    return line if len(line) <= 120 else f"{code}  # {tag}"


def rewrite_anchors(text: str, updates: dict, tag: str) -> str:
    """The anchors' source ``text`` (glm_grpo_ds/memory/gpu_figures.py) with the values of ``updates`` written into
    its anchors block: a one-line ``NAME = literal`` replaced (a dict merged with its old keys), a multi-line dict's
    entries replaced by key and new keys added before its ``}``."""
    head, rest = text.split("# gpu-timing:BEGIN anchors", 1)
    block, tail = rest.split("# gpu-timing:END anchors", 1)
    out, pending = [], None
    for line in block.split("\n"):
        if pending is not None:  # inside a multi-line dict
            entry = re.match(r"^    (.+?): (.+?),(  #.*)?$", line)
            if line == "}":
                out += [_tagged(f"    {_literal(k)}: {_literal(v)},", None, tag) for k, v in pending.items()]
                pending = None
            elif entry and ast.literal_eval(entry[1]) in pending:
                line = _tagged(f"    {entry[1]}: {_literal(pending.pop(ast.literal_eval(entry[1])))},", entry[3], tag)
        elif (one := re.match(r"^(\w+) = (.*?)(  #.*)?$", line)) and one[1] in updates:
            new = updates[one[1]]
            if one[2] == "{":
                pending = dict(new)
            else:
                new = {**ast.literal_eval(one[2]), **new} if isinstance(new, dict) else new
                line = _tagged(f"{one[1]} = {_literal(new)}", one[3], tag)
        out.append(line)
    return head + "# gpu-timing:BEGIN anchors" + "\n".join(out) + "# gpu-timing:END anchors" + tail


# --- the files --------------------------------------------------------------------------------------------------


def replace_region(text: str, name: str, inner: str, where: str) -> str:
    """``text`` with what lies between its ``gpu-timing`` markers named ``name`` replaced by ``inner``."""
    begin, end = f"<!-- gpu-timing:BEGIN {name} -->", f"<!-- gpu-timing:END {name} -->"
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise ValueError(f"{where} has no region {name} ({begin} ... {end}): restore its markers")
    return pattern.sub(lambda _: begin + inner + end, text, count=1)


def region(text: str, name: str) -> str:
    """What lies between the markers named ``name`` (the tests read it)."""
    match = re.search(f"<!-- gpu-timing:BEGIN {name} -->(.*?)<!-- gpu-timing:END {name} -->", text, re.S)
    return match[1] if match else ""


def _module(name: str, path: Path):
    """The module ``name`` executed from ``path`` and left in ``sys.modules`` (a dataclass looks its module up there;
    the caller takes it out)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _planner(anchors: Path):
    """step_time planning on the anchors as rewritten at ``anchors``: a fresh step_time, loaded beside the imported
    one while that file stands in for glm_grpo_ds/memory/gpu_figures.py (the imported modules stay as they were)."""
    name, written = gpu_figures.__name__, "glm_grpo_ds.memory._step_time_written"
    try:
        _module(name, anchors)
        return _module(written, Path(__file__).with_name("step_time.py"))
    finally:
        sys.modules[name] = gpu_figures
        sys.modules.pop(written, None)


def _read(out: Path) -> dict[str, dict | None]:
    parts = {}
    for part in PARTS:
        path = out / f"{part}.json"
        try:
            parts[part] = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
        except ValueError as err:
            raise ValueError(f"{path}: not JSON ({err}); rerun its part of bash launch/gpu_timing.sh") from None
    return parts


def write_docs(out: Path, root: Path) -> list[str]:
    """Rewrite the anchors, the docs' and the README's regions under ``root`` from ``out``'s JSONs; the lines that
    say what each came from or why it was left."""
    parts = _read(out)
    if not any(parts.values()):
        raise ValueError(f"--write-docs {out}: no part's JSON there ({', '.join(p + '.json' for p in PARTS)}): give "
                         "the OUT of a run of bash launch/gpu_timing.sh")  # fmt: skip
    lines = []
    updates, notes, device = anchor_updates(parts)
    anchors = root / ANCHORS
    if updates:
        date = next((m["date"] for m in parts.values() if m and m.get("date")), datetime.date.today().isoformat())
        text = rewrite_anchors(anchors.read_text(encoding="utf-8"), updates, f"[{short_card(device)} {date}]")
        anchors.write_text(text, encoding="utf-8")
        names = ", ".join(k for k in updates if k != "CARD")
        lines.append(f"{ANCHORS} anchors: {names} from {device}, {date}")
    else:
        lines.append(f"{ANCHORS} anchors: left as they were (nothing measured at their setting on a GPU)")
    lines += [f"{ANCHORS} anchors: {note}: left as it was" for note in notes]
    planner = _planner(anchors)
    lines += _write_docs_page(root / DOCS, out, parts, planner)
    lines += _write_readme(root / README, parts, planner)
    return lines


def _lora_step(planner):
    """The shipped LoRA config's planned step at ZeRO-2 (what README.md and docs quote) on ``planner``'s anchors."""
    from ..config import load_config
    from .basis import grid_tokens

    cfg = load_config(str(REPO / "launch/configs/glm_image_lora.yaml"))
    return planner.step_time(cfg, 2, grid_tokens(cfg.rollout.height, cfg.rollout.width))


def _write_docs_page(path: Path, out: Path, parts: dict, planner) -> list[str]:
    text, lines = path.read_text(encoding="utf-8"), []
    makers = {"train": train_region, "train_one_step_off": train_region, "dit_timing": dit_region}
    makers["decode_timing"] = decode_region
    for part, make in makers.items():
        name = REGIONS[part]
        if parts[part] is None:
            lines.append(f"{DOCS} {name}: left as it was ({out / part}.json missing)")
            continue
        text = replace_region(text, name, "\n" + make(parts[part], out / f"{part}.json") + "\n", DOCS)
        lines.append(f"{DOCS} {name}: from {out / part}.json")
    described = _fill(planner.describe(_lora_step(planner)))
    text = replace_region(text, "planned-step", f"\n```\n{described}\n```\n", DOCS)
    path.write_text(text, encoding="utf-8")
    return lines + [f"{DOCS} planned-step: the shipped LoRA config's planned step on the anchors"]


def _write_readme(path: Path, parts: dict, planner) -> list[str]:
    text = path.read_text(encoding="utf-8")
    old = region(text, "time-per-step").strip()
    train = parts["train"]
    if train and train.get("full_size") and train["device"] != "cpu":
        measured, said = readme_measured(train, parts["train_one_step_off"]), "from train.json"
    else:
        measured, said = old.split(" Planned for the shipped")[0].strip(), "its measured step left (no full-size run)"
    planned = (
        "Planned for the shipped LoRA config at its 30 guided DiT steps: "
        f"~{_lora_step(planner).total_s:.0f} s per step at ZeRO-2 (`glm-grpo estimate-memory` prints it)."
    )
    wrapped = textwrap.fill(
        f"{measured} {planned}", 116, initial_indent="  ", subsequent_indent="  ", break_on_hyphens=False
    )
    path.write_text(replace_region(text, "time-per-step", f"\n{wrapped} ", README), encoding="utf-8")
    return [f"{README} time-per-step: {said}; the planned step on the anchors"]


def main(argv: list[str]) -> int:
    """``--write-docs OUT [--root DIR]`` (after ``--write-docs`` has been taken off). Bad input: one line, exit 2."""
    p = argparse.ArgumentParser(prog="python -m glm_grpo_ds.memory.step_time --write-docs")
    p.add_argument("out", help="the OUT of a run of bash launch/gpu_timing.sh")
    p.add_argument("--root", default=str(REPO), help="the checkout whose files are rewritten (default: this one)")
    a = p.parse_args(argv)
    try:
        if not Path(a.out).is_dir():
            raise ValueError(f"--write-docs {a.out}: no such directory; give the OUT of bash launch/gpu_timing.sh")
        lines = write_docs(Path(a.out), Path(a.root))
    except (OSError, ValueError) as err:
        print(f"step_time: {err}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0
