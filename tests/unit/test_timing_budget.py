"""launch/gpu_timing.sh's budget (glm_grpo_ds/memory/timing_budget.py) by hand: each part's planned seconds from the
planner's anchors (pinned here to the 2026-11 H200 figures, so a GPU run's rewrite of them does not move these sums)
and the stated one-off costs; whether a part fits what is left, and the one line a skipped part prints, also from the
script itself. Then ``--write-docs`` (glm_grpo_ds/memory/timing_docs.py) on hand-made GPU JSONs, into a copy: the
anchors rewritten in place with their card and date (ruff-clean), the planned step and the README on the new anchors,
a missing part's regions left as they were."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from glm_grpo_ds.memory import step_time as st
from glm_grpo_ds.memory import timing_budget as tb
from glm_grpo_ds.memory.timing_docs import main as write_docs
from glm_grpo_ds.memory.timing_docs import region

ROOT = Path(__file__).resolve().parents[2]
COMMON = (
    "model.path=random:glm-image grpo.group_size=16 rollout.height=1024 rollout.width=1024 rollout.fuse_lora=true "
    "rollout.cuda_graph=true decoder.num_inference_steps=8 decoder.guidance_scale=1.5 decoder.batch_size=8 "
    "decoder.compile=true"
).split()  # launch/gpu_timing.sh's training settings


@pytest.fixture(autouse=True)
def h200_anchors(monkeypatch):
    """The anchors as first measured (H200, 2026-11), whatever a GPU run has written since."""
    monkeypatch.setattr(st, "DECODE_STEP_MS", {("eager", False): 75.7, ("eager", True): 41.2, ("graph", False): 19.3,
                                               ("graph", True): 13.0, ("compiled", True): 9.4,
                                               ("graph_fused", False): None})  # fmt: skip
    monkeypatch.setattr(st, "GUIDED_IMAGE_STEP_S", 0.289)
    monkeypatch.setattr(st, "DECODE_FIXED_S", 0.0)
    monkeypatch.setattr(st, "DIT_SPEEDUP", {})
    monkeypatch.setattr(st, "UPDATE_S", {2: 4.85, 3: 20.2})
    monkeypatch.setattr(st, "CARD_BYTES_PER_S", 4.8e12)


def test_the_training_parts_plan_launch_compiles_steps_and_report():
    seconds, how = tb.train_seconds([*COMMON, "max_steps=3"], "launch/configs/gpu_check.yaml", "ds_configs/zero2.json")
    # a step: 1 280 tokens x 19.3 ms (the captured fused sampler, counted at the unmerged graph's figure until
    # measured) + (16 images x 16 DiT forwards - 15 the group shares) x 0.1445 s (the compiled DiT at eager's figure
    # until measured) + the ZeRO-2 update 4.85 s + 16 rewards x 0.05 s + a capture 0.5 s = 65.6785 s
    step = 1280 * 0.0193 + (16 * 16 - 15) * 0.1445 + 4.85 + 16 * 0.05 + 0.5
    assert step == pytest.approx(65.6785)
    assert seconds == pytest.approx(45 + 45 + 3 * step + 5) == pytest.approx(292.0355)  # launch, DiT compile, report
    assert how == "launch 45 + compiles 45 + 3 steps x 65.7 s + report 5"
    off = [*COMMON, "max_steps=2", "rollout.one_step_off=true", "grpo.sampler_correction=token_truncate"]
    seconds, how = tb.train_seconds(off, "launch/configs/gpu_check.yaml", "ds_configs/zero2.json")
    beside = (16 * 16 - 15) * 0.1445 + 4.85 + 16 * 0.05 + 0.5  # the rollout (24.7 s) behind the decode (34.8 s)
    assert seconds == pytest.approx(45 + 45 + step + beside + 5) == pytest.approx(201.653)
    assert how == "launch 45 + compiles 45 + 1 serial step 65.7 s + 1 x 41.0 s + report 5"


def test_the_dit_part_plans_each_variants_build_compile_and_decodes():
    seconds, how = tb.dit_seconds(["sdpa", "compiled", "fp8", "guidance_half"], 8, 1024, (1, 3), 1)
    forward, vae = 0.289 / 2, 0.15

    def decode(steps, guided):  # 8 images x (forwards x 0.1445 s + the VAE)
        return 8 * ((steps + guided) * forward + vae)

    full = 2 * decode(1, 1) + decode(3, 3)  # the warm-up at 1 step, then 1 and 3 steps once
    assert full == pytest.approx(15.16)
    half = 2 * decode(1, 1) + decode(3, 2)  # guidance on the first ceil(S/2) steps
    expected = 15 + (5 + full) + (5 + 45 + full) + (5 + 5 + full) + (5 + half)
    assert seconds == pytest.approx(expected) == pytest.approx(144.484)
    assert how == "start 15 + sdpa 20 + compiled 65 + fp8 25 + guidance_half 19"


def test_the_decode_part_plans_each_rows_and_variant_at_its_measured_step():
    seconds, how = tb.decode_seconds([16, 64], ["eager", "graph_fused", "graph"], 1024, 64)
    kv_48_rows = 48 * 1408 * 40960 / 4.8e12  # s a step: 64 rows read 48 more rows' KV caches than 16
    at16 = 20 + 68 * (0.0757 + 0.0193 + 0.0130) + 2 * 0.5  # start + build; 4 + 64 steps each; two captures
    assert at16 == pytest.approx(28.344)
    assert seconds == pytest.approx(at16 + at16 + 3 * 68 * kv_48_rows) == pytest.approx(56.8057, abs=1e-4)
    assert how == "16 rows 28 + 64 rows 28"
    st.DECODE_STEP_MS[("graph_fused", False)] = 10.0  # once measured, the fused sampler plans on its own figure
    assert tb.decode_seconds([16], ["graph_fused"], 1024, 64)[0] == pytest.approx(20 + 68 * 0.010 + 0.5)


def test_a_part_fits_what_is_left_or_is_skipped_in_one_line(tmp_path, capsys):
    assert tb.fits(100, 440, 540) and not tb.fits(100.1, 440, 540)
    assert tb.skip_line("dit_timing", 144.5, 500, 540) == (
        "gpu_timing.sh: skipping dit_timing: planned 144 s, 40 s of the 540 s left"
    )
    plan = {"budget_s": 540, "card": "one H200", "parts": [{"part": "train", "planned_s": 298.5, "how": "x"}]}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    assert tb.main(["fits", str(path), "train", "200"]) == 0 and capsys.readouterr().out == ""
    assert tb.main(["fits", str(path), "train", "300"]) == 1
    assert capsys.readouterr().out == "gpu_timing.sh: skipping train: planned 298 s, 240 s of the 540 s left\n"
    assert tb.main(["fits", str(path), "decode_timing", "0"]) == 2
    assert "'decode_timing' is not in" in capsys.readouterr().err
    lines = tb.table({**plan, "parts": [*plan["parts"], {"part": "dit_timing", "planned_s": 300.0, "how": "y"}]})
    assert lines[2].split()[:2] == ["train", "298"] and lines[-1].split()[:2] == ["total", "598"]
    assert "over the budget" in lines[-1]


def test_the_script_skips_a_part_the_budget_left_cannot_hold(tmp_path):
    """BUDGET_S=1: the plan printed, then each part skipped with its line; nothing measured, no part's JSON (the plan
    and the versions it would have measured with, env.txt, only)."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}", OUT=str(tmp_path))
    env.update(BUDGET_S="1", PARTS="dit_timing,decode_timing")
    proc = subprocess.run(["bash", "launch/gpu_timing.sh"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split()[0] for line in lines[2:5]] == ["dit_timing", "decode_timing", "total"]
    assert lines[5].startswith("gpu_timing.sh: skipping dit_timing: planned ") and lines[5].endswith(" of the 1 s left")
    assert lines[6].startswith("gpu_timing.sh: skipping decode_timing: planned ")
    assert "measured: none; skipped: dit_timing decode_timing; failed: none" in lines[7]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["env.txt", "plan.json"]  # no part's JSON


# a stand-in for `glm-grpo` (what is tested is the script's handling of part 4's exits): `profile decode-timing` writes
# its report for --group-size and exits 1 at 2 rows, with its report (a failed bitwise check) or without (a crash)
FAKE_GLM_GRPO = """#!/usr/bin/env bash
[ "$1 $2" = "profile decode-timing" ] || exit 0
shift 2
while [ $# -gt 0 ]; do case $1 in --group-size) n=$2; shift 2;; --out) out=$2; shift 2;; *) shift;; esac; done
echo "$n" >> "$(dirname "$out")/calls"
[ "$n" = 2 ] && [ "$MODE" = crash ] && exit 1
printf '{"device": "cpu", "torch": "2.15", "layers": 2, "size": 64, "decode_tokens": 20, "steps_timed": 4,
 "lora_r": 4, "group_size": %s, "floor_ms_per_step": null, "failures": [],
 "variants": {"eager": {"ms_per_step": 5.0}}}' "$n" > "$out"
[ "$n" = 2 ] && exit 1
exit 0
"""


@pytest.mark.parametrize("mode, rows_run", [("check", ["2", "4"]), ("crash", ["2"])])
def test_part_4_goes_on_after_a_failed_check_and_stops_after_a_crash(tmp_path, mode, rows_run):
    """decode-timing at 2 rows exits 1. With its report written (a variant not bitwise its reference) the next rows
    still run and both rows are in decode_timing.json; without one (a crash) the next rows would meet it too and do
    not run. Either way the part is failed and the script exits 1."""
    bin_dir, out = tmp_path / "bin", tmp_path / "out"
    bin_dir.mkdir()
    (bin_dir / "glm-grpo").write_text(FAKE_GLM_GRPO)
    (bin_dir / "glm-grpo").chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}", OUT=str(out))
    env.update(BUDGET_S="3600", PARTS="decode_timing", ROWS="2,4", MODE=mode)
    proc = subprocess.run(["bash", "launch/gpu_timing.sh"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (out / "calls").read_text().split() == rows_run
    assert "gpu_timing.sh: decode-timing at 2 rows exited 1 (above)" in proc.stderr
    assert "measured: none; skipped: none; failed: decode_timing" in proc.stdout
    if mode == "check":
        assert list(json.loads((out / "decode_timing.json").read_text())["rows"]) == ["2", "4"]
    else:
        assert not (out / "decode_timing.json").exists()


# --- --write-docs on a GPU's JSONs ---------------------------------------------------------------------------------

DEVICE, DATE = "NVIDIA H100 80GB HBM3", "2026-12-01"


def _gpu_jsons(out: Path) -> None:
    """A full-size run's decode and DiT parts, by hand (no training part: its regions stay as they were)."""
    common = {"device": DEVICE, "torch": "2.11.0+cu130", "date": DATE}
    rows = {
        str(n): {**common, "layers": 40, "group_size": n, "size": 1024, "decode_tokens": 1280, "steps_timed": 64,
                 "lora_r": 64, "hbm_bytes_per_s": 3.35e12, "floor_ms_per_step": 5.6, "failures": [],
                 "variants": {"eager": {"ms_per_step": 80.0},
                              "fused": {"ms_per_step": 52.0, "reference": "eager", "same_tokens": 0.975,
                                        "max_logp_diff": 0.0123},
                              "graph_fused": {"ms_per_step": 10.5 + n / 64, "reference": "fused",
                                              "same_tokens": 1.0 - (n == 64) / 8, "max_logp_diff": 0.0},
                              "graph": {"ms_per_step": 14.7}}}
        for n in (16, 64)
    }  # fmt: skip
    rows["64"]["failures"] = ["graph_fused: not bitwise the fused loop's tokens and log-probs"]
    (out / "decode_timing.json").write_text(json.dumps({**common, "rows": rows}))

    def variant(overrides, s, **more):
        return {"overrides": overrides, "s_per_image_step": s, "speedup_vs_sdpa": 0.25 / s, "setup_s": 3.0,
                "max_abs_diff": 0.0, "psnr_db": None, "peak_bytes": 20 * 2**30, "seconds": {"1": 5.0, "3": 9.0},
                **more}  # fmt: skip

    dit = {**common, "dtype": "bfloat16", "size": 1024, "batch": 8, "steps": [1, 3], "guidance": 1.5,
           "dit_layers": 30, "dit_hidden": 4096, "skipped": {}, "failed": {},
           "variants": {"sdpa": variant({}, 0.25), "compiled": variant({"compile": True}, 0.2),
                        "fp8": variant({"fp8": True}, 0.23),
                        "guidance_half": variant({}, 0.19, guided_fraction=0.5)}}  # fmt: skip
    (out / "dit_timing.json").write_text(json.dumps(dit))


# the anchors block as first written (H200, 2026-11): the copy's, whatever a GPU run has written into the real one
PINNED = """# gpu-timing:BEGIN anchors: (pinned by tests/unit/test_timing_budget.py)
CARD = "one H200"
CARD_BYTES_PER_S = 4.8e12  # the card's HBM bandwidth (peak)
DECODE_STEP_MS = {
    ("eager", False): 75.7,  # the eager loop, LoRA unmerged
    ("eager", True): 41.2,  # the eager loop, LoRA merged
    ("graph", False): 19.3,  # rollout.cuda_graph, LoRA unmerged
    ("graph", True): 13.0,  # rollout.cuda_graph + rollout.merge_lora
    ("compiled", True): 9.4,  # + rollout.compile with compile_scope layers
    ("graph_fused", False): None,  # rollout.fuse_lora + cuda_graph, the exact fast sampler (None: until measured)
}
GUIDED_IMAGE_STEP_S = 0.289  # untagged: a training step's decode, 37.0 s / 16 images / 8 steps
DECODE_FIXED_S = 0.0  # per image: the glyph encoder and the VAE
DIT_SPEEDUP = {}  # decoder options against eager sdpa (glm-grpo profile dit-timing), keyed as dit_options() names them
UPDATE_S = {2: 4.85, 3: 20.2}  # LoRA update at 16 sequences of 1 280 tokens, world size 1 (ZeRO-1 runs ZeRO-2's)
# gpu-timing:END anchors"""


def _copy(root: Path) -> None:
    for name in ("docs/memory-and-speed.md", "README.md", "glm_grpo_ds/memory/gpu_figures.py"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, root / name)
    anchors = root / "glm_grpo_ds/memory/gpu_figures.py"
    text = anchors.read_text()
    begin, end = text.index("# gpu-timing:BEGIN anchors"), text.index("# gpu-timing:END anchors")
    anchors.write_text(text[:begin] + PINNED + text[end + len("# gpu-timing:END anchors") :])


def test_write_docs_rewrites_the_anchors_the_planned_step_and_the_regions(tmp_path, capsys):
    out, root = tmp_path / "out", tmp_path / "root"
    out.mkdir()
    _gpu_jsons(out)
    _copy(root)
    assert write_docs([str(out), "--root", str(root)]) == 0
    said = capsys.readouterr().out
    anchors = root / "glm_grpo_ds/memory/gpu_figures.py"
    text = anchors.read_text()
    tag = "[H100 2026-12-01]"
    # the 16-row figures: T(S1) / 8 rows - 1 step x 0.25 s = 0.375 s of glyph encoder and VAE per image
    lines = text.splitlines()
    assert 'CARD = "one H100"  # ' + tag in lines
    assert "CARD_BYTES_PER_S = 3.35e12  # the card's HBM bandwidth (peak) " + tag in lines
    assert '    ("eager", False): 80.0,  # the eager loop, LoRA unmerged ' + tag in lines
    assert '    ("graph", True): 14.7,  # rollout.cuda_graph + rollout.merge_lora ' + tag in lines
    assert "GUIDED_IMAGE_STEP_S = 0.25  # " + tag in lines  # its untagged source said no more of it
    assert "DECODE_FIXED_S = 0.375  # per image: the glyph encoder and the VAE " + tag in lines
    assert "UPDATE_S = {2: 4.85, 3: 20.2}  # LoRA update at 16 sequences" in text  # not measured here: as it was
    assert '    ("graph_fused", False): 10.75,' in text and '    ("eager", True): 41.2,  # the eager loop' in text
    assert 'DIT_SPEEDUP = {"compile": 1.25, "fp8": 1.087}' in text  # sdpa and guidance_half change no option
    ruff = Path(sys.executable).parent / "ruff"
    if ruff.exists():  # the rewritten source stays as the project formats it
        checked = subprocess.run([ruff, "check", "-q", anchors], cwd=ROOT, capture_output=True, text=True)
        formatted = subprocess.run([ruff, "format", "--check", "-q", anchors], cwd=ROOT, capture_output=True, text=True)
        assert checked.returncode == formatted.returncode == 0, checked.stdout + formatted.stdout
    # the shipped LoRA config on the new anchors: 1 280 x 10.75 ms + (16 x 60 - 15) x 0.125 s + 16 x 0.375 s + 4.85 s
    planned = 1280 * 0.01075 + (16 * 60 - 15) * 0.125 + 16 * 0.375 + 4.85
    assert planned == pytest.approx(142.735)
    docs = (root / "docs/memory-and-speed.md").read_text()
    assert region(docs, "planned-step").split()[:10] == "``` planned time per step on one H100: ~143 s".split()
    readme = region((root / "README.md").read_text(), "time-per-step")
    assert "Planned for the shipped LoRA config at its 30 guided DiT steps: ~143 s per step at ZeRO-2" in " ".join(
        readme.split()
    )
    assert readme.split()[:4] == ["Measured", "on", "one", "H200"]  # no full-size training part: its step stays
    decode = region(docs, "decode")
    assert "| 64 | `graph_fused` | 11.50 |" in decode
    # each captured sampler beside its eager loop: their tokens' agreement and largest log-prob gap; a failed check
    assert "| 16 | `graph_fused` | 10.75 | 5.60 | 0.860 | `fused`: 100.0%, max \\|dlogp\\| 0.0e+00 |" in decode
    assert "| 16 | `fused` | 52.00 | 5.60 | 4.160 | `eager`: 97.5%, max \\|dlogp\\| 1.2e-02 |" in decode
    assert decode.rstrip().endswith(
        "- **FAIL** at 64 rows: graph_fused: not bitwise the fused loop's tokens and log-probs"
    )
    assert "| `fp8` | 0.23 | 1.09 |" in region(docs, "dit")
    original = (ROOT / "docs/memory-and-speed.md").read_text()
    for name in ("train", "train-one-step-off"):
        assert region(docs, name) == region(original, name)
        assert f"docs/memory-and-speed.md {name}: left as it was" in said
    assert "glm_grpo_ds/memory/gpu_figures.py anchors: DECODE_STEP_MS, CARD_BYTES_PER_S, GUIDED_IMAGE_STEP_S" in said


def test_write_docs_refuses_an_out_without_jsons_and_a_file_without_its_markers(tmp_path, capsys):
    assert write_docs([str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err.startswith("step_time: --write-docs ")
    (tmp_path / "out").mkdir()
    assert write_docs([str(tmp_path / "out"), "--root", str(tmp_path)]) == 2
    assert "no part's JSON there" in capsys.readouterr().err
    _gpu_jsons(tmp_path / "out")
    _copy(tmp_path / "root")
    docs = tmp_path / "root/docs/memory-and-speed.md"
    docs.write_text(docs.read_text().replace("<!-- gpu-timing:END dit -->", ""))
    assert write_docs([str(tmp_path / "out"), "--root", str(tmp_path / "root")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("step_time: docs/memory-and-speed.md has no region dit") and len(err.splitlines()) == 1


def _train_json(out: Path, part: str, overlapped: bool) -> None:
    """A full-size training part by hand: 16 images of 1024x1024 at ZeRO-2; its steady steps 30.0 s serial (rollout
    12.0 + decode 14.0 + reward 0.5 + update 3.5), 20.0 s one step off (decode 14.0 + reward 0.5 + wait 2.0 + update
    3.5, its rollout beside)."""
    first = {"step": 1, "time/rollout": 20.0, "time/decode": 50.0, "time/reward": 0.5, "time/update": 4.0}
    steady = {"time/rollout": 12.0, "time/decode": 14.0, "time/reward": 0.5, "time/update": 3.5}
    if overlapped:
        steady = {**steady, "rollout_overlapped": True, "time/rollout_wait": 2.0}
        first = {**first, "rollout_overlapped": False}
    steps = [first, {"step": 2, **steady}]
    m = {
        "part": part, "device": DEVICE, "torch": "2.11.0+cu130", "date": DATE, "model": "random:glm-image",
        "full_size": True, "zero_stage": 2, "images": 16, "size": [1024, 1024], "lora": True,
        "rollout": {"fuse_lora": True, "merge_lora": False, "cuda_graph": True, "compile": False,
                    "one_step_off": overlapped},
        "decoder": {"num_inference_steps": 8, "guidance_scale": 1.5, "guidance_steps": None, "compile": True,
                    "fp8": False, "attention": "sdpa"},
        "steps": steps, "planned": None, "compared": None,
        "steady": {"steps": 1, "step_s": 20.0 if overlapped else 30.0, "rollout_s": 12.0, "decode_s": 14.0,
                   "reward_s": 0.5, "update_s": 3.5, "images_per_gpu_s": 16 / (20.0 if overlapped else 30.0)},
        "lease": {"planned_s": 298.5, "wall_s": 150.0, "budget_s": 540, "planned_on": "one H200"},
    }  # fmt: skip
    (out / f"{part}.json").write_text(json.dumps(m))


def test_write_docs_takes_the_update_and_the_readmes_step_from_a_full_size_training_part(tmp_path, capsys):
    out, root = tmp_path / "out", tmp_path / "root"
    out.mkdir()
    _train_json(out, "train", False)
    _train_json(out, "train_one_step_off", True)
    _copy(root)
    assert write_docs([str(out), "--root", str(root)]) == 0
    said = capsys.readouterr().out
    lines = (root / "glm_grpo_ds/memory/gpu_figures.py").read_text().splitlines()
    # the comment would pass 120 characters with the tag: the tag alone
    assert "UPDATE_S = {2: 3.5, 3: 20.2}  # [H100 2026-12-01]" in lines
    assert 'CARD = "one H100"  # [H100 2026-12-01]' in lines
    assert "GUIDED_IMAGE_STEP_S = 0.289  # untagged: a training step's decode, 37.0 s / 16 images / 8 steps" in lines
    readme = " ".join(region((root / "README.md").read_text(), "time-per-step").split())
    assert readme.startswith(
        "Measured on one H100 (2026-12-01, torch 2.11.0+cu130) at 8 DiT steps (8 guided) with the exact fused sampler "
        "(captured) and the DiT compiled: **30.0 s** (rollout 12.0 + decode 14.0 + reward 0.5 + update 3.5; 0.53 "
        "images per GPU-second); one step off **20.0 s** (0.80). Planned for the shipped LoRA config"
    )
    # 1 280 x 19.3 ms + (16 x 60 - 15) x 0.1445 s + 3.5 s = 164.8 s: the update measured, the rest as it was
    assert "~165 s per step at ZeRO-2 (`glm-grpo estimate-memory` prints it)." in readme
    docs = (root / "docs/memory-and-speed.md").read_text()
    assert "| 2 (beside) | 12.00 | 14.00 | 0.50 | 3.50 | 20.00 | 1.250 | 0.800 |" in region(docs, "train-one-step-off")
    assert "| 2 | 12.00 | 14.00 | 0.50 | 3.50 | 30.00 | 1.875 | 0.533 |" in region(docs, "train")
    assert "150 s of the lease, 298 planned" in " ".join(region(docs, "train").split())
    assert "README.md time-per-step: from train.json" in said and "docs/memory-and-speed.md dit: left as it was" in said
