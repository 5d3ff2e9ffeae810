"""``glm-grpo evaluate`` on the tiny model, in-process: the paired-seed property (an adapter whose LoRA B is zero
computes the base function, so every difference is exactly 0 and its interval holds 0), a random adapter that
does differ, categories, the files it writes, and bad input. The trained adapter's positive, significant gain
is tested on the tiny world (tests/integration/test_world.py)."""

import base64
import io
import json
import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import torch
from in_process import ROOT, glm_grpo  # noqa: E402  (tests/in_process.py)

from glm_grpo_ds.testing.tiny import lora_policy

FAST = [
    "rollout.height=64",
    "rollout.width=64",
    "eval.num_inference_steps=1",
    "eval.guidance_scale=1.0",
    "decoder.batch_size=8",
]


def save_adapter(tiny_model_dir, out: Path, b_std: float) -> Path:
    lora_policy(tiny_model_dir, b_std=b_std).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def prompts(data64, tmp_path_factory):
    """data64's prompts with a category column (targets made absolute: the file moves)."""
    rows = [json.loads(line) for line in Path(data64).read_text().splitlines()][:6]
    out = tmp_path_factory.mktemp("evaluate") / "prompts.jsonl"
    for i, row in enumerate(rows):
        row["target_image"] = str(Path(data64).parent / row["target_image"])
        row["category"] = "even" if i % 2 == 0 else "odd"
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


@pytest.fixture(scope="module")
def evaluated(tiny_model_dir, prompts, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("evaluated")
    zero = save_adapter(tiny_model_dir, tmp / "zero_adapter", 0.0)
    noisy = save_adapter(tiny_model_dir, tmp / "noisy_adapter", 0.5)
    out = tmp / "out"
    from glm_grpo_ds.commands.evaluate import main

    args = ["--model", str(tiny_model_dir), "--prompts", str(prompts), "--rewards", "pixel_mse", "ssim"]
    args += ["--adapter", str(zero), "--adapter", str(noisy), "--samples-per-prompt", "3", "--out", str(out), *FAST]
    assert main(args) == 0
    return json.loads((out / "evaluate.json").read_text()), out, args


def test_a_zero_adapter_differs_from_the_base_by_exactly_zero(evaluated):
    result, _, _ = evaluated
    zero = result["summary"]["adapter_0"]
    assert set(zero["rewards"]) == {"pixel_mse", "ssim", "total"}
    for label, s in zero["rewards"].items():
        assert s["diff"] == 0.0 and s["ci"] == [0.0, 0.0] and not s["ci_excludes_0"], label
        assert s["win_rate"] == 0.5 and s["prompts"] == 6
        assert result["prompt_means"]["adapter_0"][label] == result["prompt_means"]["base"][label]
    noisy = result["summary"]["adapter_1"]["rewards"]
    assert any(s["diff"] != 0.0 for s in noisy.values())  # the same noise, another policy: other images


def test_categories_settings_and_files(evaluated):
    result, out, _ = evaluated
    cats = result["summary"]["adapter_1"]["categories"]
    assert set(cats) == {"even", "odd"} and all(cats[c]["ssim"]["prompts"] == 3 for c in cats)
    assert (result["num_prompts"], result["samples_per_prompt"], result["image"]) == (6, 3, [64, 64])
    assert result["decode"] == {"num_inference_steps": 1, "guidance_scale": 1.0}
    assert result["attention"] == "sdpa"  # model.attn_implementation auto, resolved on this (CPU) node
    # the protocol travels with the numbers: seeds, the prompts' content, and how the run was asked for
    assert result["seeds"] == "eval-rollout/eval-decode" and len(result["prompts_sha256"]) == 64
    assert result["invocation"]["rewards_flag"] == ["pixel_mse", "ssim"]
    assert result["invocation"]["overrides"] == FAST
    assert result["summary"]["adapter_0"]["trained_on"] is None  # no run config.json beside the adapter
    assert "? (no run config.json" in result["table"] and "weighted sum" in result["table"]
    for name in ("gallery.png", "evaluate.png"):
        assert (out / name).stat().st_size > 1000
    from PIL import Image

    from glm_grpo_ds.observability.gallery import PROMPT_LINES, grid_size

    # 6 prompts x (base, adapter_0, adapter_1) with their names as column headers; 64-pixel images, never upscaled
    size, lines = Image.open(out / "gallery.png").size, range(1, PROMPT_LINES + 1)
    assert result["thumbnail"] == 128 and any(size == grid_size(6, 3, 64, 64, n, headers=True) for n in lines)


class Page(HTMLParser):
    """What report.html holds: every image's decoded pixels (by alt text), the tables' text, what would load."""

    def __init__(self):
        super().__init__()
        self.images, self.text, self.external, self.scripts = {}, [], [], 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.scripts += tag == "script"
        for key in ("src", "href"):
            if a.get(key) and not a[key].startswith("data:"):
                self.external.append(a[key])
        if tag == "img":
            from PIL import Image

            header, data = a["src"].split(",", 1)
            assert header == "data:image/png;base64"
            self.images[a["alt"]] = torch.from_numpy(np.array(Image.open(io.BytesIO(base64.b64decode(data)))))

    def handle_data(self, data):
        self.text.append(data)


def test_the_report_shows_the_protocol_both_tables_and_same_seed_images(evaluated):
    """report.html, self-contained: the protocol, the reward and image-statistics tables per adapter, and per
    category each model's first image of every prompt with the same seeds: the zero adapter's are the base's
    pixel for pixel, the noisy adapter's are not all equal to them."""
    from glm_grpo_ds.monitoring.image_stats import STATISTICS, computable

    result, out, _ = evaluated
    page = Page()
    page.feed((out / "report.html").read_text(encoding="utf-8"))
    text = " ".join(page.text)
    assert page.external == [] and page.scripts == 0
    assert result["prompts_sha256"][:16] in text and "eval-rollout/eval-decode" in text
    for name in ("adapter_0", "adapter_1"):
        assert f"{name}: rewards" in text and f"{name}: image statistics" in text
    assert all(stat in text for stat in computable(STATISTICS)) and "pixel_mse" in text and "ssim" in text
    assert "lpips_diversity" not in text  # no lpips reward, no network to measure it
    assert text.count("No run records found beside the adapter") == 2  # adapters saved outside a run
    assert "even" in text and "odd" in text
    tiles = {alt: image for alt, image in page.images.items() if ", prompt " in alt}
    assert len(tiles) == 6 * 3  # 6 prompts x (base, adapter_0, adapter_1)
    assert all(t.shape == (64, 64, 3) and t.float().std() > 0 for t in tiles.values())  # decoded, not blank
    for i in range(6):
        assert torch.equal(tiles[f"base, prompt {i}"], tiles[f"adapter_0, prompt {i}"])
    assert any(not torch.equal(tiles[f"base, prompt {i}"], tiles[f"adapter_1, prompt {i}"]) for i in range(6))
    assert "differences with their intervals" in page.images
    # the statistics' paired differences: exactly 0 for the zero adapter, as for the rewards
    stats = result["image_statistics"]["adapter_0"]
    assert set(stats) == set(computable(STATISTICS)) and all(s["diff"] == 0.0 for s in stats.values())
    assert stats["brightness"]["prompts"] == 6 and stats["diversity"]["prompts"] == 6


BROWSER = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)


@pytest.mark.skipif(BROWSER is None, reason="no Chromium here (apt-get install chromium); the HTML test above runs")
def test_the_report_renders_in_a_headless_browser(evaluated, tmp_path):
    """The report in a real browser: Chromium loads it with no console message (--enable-logging prints every
    CONSOLE line) and its screenshot shows the page with the images drawn (many colours, not a blank page)."""
    from PIL import Image

    _, out, _ = evaluated
    shot = tmp_path / "shot.png"
    cmd = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0"]
    cmd += ["--window-size=1200,2400", f"--screenshot={shot}", (out / "report.html").as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and shot.is_file(), proc.stderr[-2000:]
    assert "CONSOLE" not in proc.stderr, proc.stderr[-2000:]
    pixels = np.array(Image.open(shot).convert("RGB"))
    assert pixels.std() > 10 and len(np.unique(pixels.reshape(-1, 3), axis=0)) > 200


def test_a_thumbnail_below_16_pixels_is_one_line(prompts, capfd):
    from glm_grpo_ds.commands.evaluate import main

    assert main(["--model", "m", "--prompts", str(prompts), "--rewards", "pixel_mse", "--thumbnail", "8"]) == 2
    assert capfd.readouterr().err.strip().endswith("--thumbnail must be >= 16 pixels, got 8")


def test_a_rerun_resumes_from_the_finished_batches_and_other_settings_are_refused(evaluated, tmp_path, capfd):
    import shutil

    import torch

    from glm_grpo_ds.commands.evaluate import main

    result, out, args = evaluated
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    args = [*args[: args.index("--out")], "--out", str(copy), *args[args.index("--out") + 2 :]]
    stored = copy / "progress" / "rank_0" / "adapter_1" / "batch_000004.pt"  # prompts 4 and 5
    done = torch.load(stored, weights_only=True)
    done["rewards"]["ssim"][:] = 7.0  # a value no sampling gives: the rerun must read it, not resample
    torch.save(done, stored)
    assert main(args) == 0
    again = json.loads((copy / "evaluate.json").read_text())
    assert again["prompt_means"]["adapter_1"]["ssim"][4:] == [7.0, 7.0]
    assert again["prompt_means"]["base"] == result["prompt_means"]["base"]
    capfd.readouterr()
    assert main([*args, "--seed", "1"]) == 2
    assert "holds an evaluation with other settings (seed); give another --out, or --fresh" in capfd.readouterr().err
    assert main([*args, "--seed", "1", "--num-prompts", "2", "--fresh"]) == 0
    assert not stored.exists()  # the store was emptied: only the new run's first batch is there
    assert sorted(p.name for p in (copy / "progress" / "rank_0" / "adapter_1").iterdir()) == ["batch_000000.pt"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--samples-per-prompt", "0"], "--samples-per-prompt must be >= 1, got 0"),
        (["--prompts", "/nonexistent/p.jsonl"], "/nonexistent/p.jsonl"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tiny_model_dir, prompts, tmp_path, capfd, extra, message):
    args = ["evaluate", "--model", str(tiny_model_dir), "--prompts", str(prompts), "--rewards", "pixel_mse"]
    code, _, err = glm_grpo([*args, "--out", str(tmp_path), *extra, *FAST], capfd)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_base_only_prints_a_table_logs_plain_progress_and_records_absolute_paths(
    tiny_model_dir, prompts, tmp_path, capfd
):
    """No adapter: a table of the base's means with their intervals (not a Python dict); stderr is not a
    terminal here, so the progress is plain lines counting prompts (not tqdm's carriage returns counting prompts
    times models); relative paths are recorded absolute in evaluate.json."""
    shutil.copy(prompts, tmp_path / "p.jsonl")
    relative = os.path.relpath(tmp_path / "p.jsonl", ROOT)  # glm_grpo runs in the checkout
    args = ["evaluate", "--model", str(tiny_model_dir), "--prompts", relative, "--rewards", "pixel_mse", "ssim"]
    args += ["--samples-per-prompt", "2", "--num-prompts", "4", "--out", str(tmp_path / "ev")]
    code, out, err = glm_grpo([*args, *FAST], capfd)
    assert code == 0, err
    assert "\r" not in err and "evaluate (1 model x 2 samples): 4/4 prompts" in err, err
    lines = out.splitlines()
    assert lines[0] == "base model only (no --adapter)" and lines[1].split() == [
        "reward",
        "mean",
        "95%",
        "CI",
        "prompts",
    ]
    rows = {line.split()[0]: line.split() for line in lines[2:5]}
    assert set(rows) == {"pixel_mse", "ssim", "total"} and all(r[-1] == "4" for r in rows.values())
    result = json.loads((tmp_path / "ev" / "evaluate.json").read_text())
    assert result["prompts"] == str(tmp_path / "p.jsonl") and result["model"] == str(Path(tiny_model_dir).resolve())
    assert result["table"] in out
    low, high = (float(x.strip("[],")) for x in rows["ssim"][2:4])
    assert low <= float(rows["ssim"][1]) <= high


@pytest.fixture(scope="module")
def export_prompts(data64, tmp_path_factory):
    """Two rows carrying every field the four layouts name files by."""
    rows = [json.loads(line) for line in Path(data64).read_text().splitlines()][:2]
    out = tmp_path_factory.mktemp("export_prompts") / "prompts.jsonl"
    extra = [
        {"tag": "single_object", "include": [{"class": "bench", "count": 1}], "item_id": "partiprompts12"},
        {"tag": "colors", "include": [], "item_id": "7"},
    ]
    for i, row in enumerate(rows):
        row.pop("target_image")
        row.update(extra[i], prompt_id=[3, 17][i], id=[0, 41][i], category=["Anime_Stylization", "text"][i])
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def _export(tiny_model_dir, prompts, tmp_path, layouts, k=4):
    from glm_grpo_ds.commands.evaluate import main

    args = ["--model", str(tiny_model_dir), "--prompts", str(prompts), "--rewards", "pixel_mse"]
    args += ["--samples-per-prompt", str(k), "--out", str(tmp_path / "out"), *FAST]
    for layout in layouts:
        args += ["--export", layout, str(tmp_path / layout)]
    return main(args)


def _size(path):
    from PIL import Image

    with Image.open(path) as img:
        return img.size


def test_exports_write_each_benchmarks_layout(tiny_model_dir, export_prompts, tmp_path):
    assert _export(tiny_model_dir, export_prompts, tmp_path, ["geneval", "dpg", "longtext", "oneig"]) == 0
    d = tmp_path / "geneval"
    meta = json.loads((d / "base" / "00000" / "metadata.jsonl").read_text())  # one object, read with json.load
    assert meta["tag"] == "single_object" and meta["include"] == [{"class": "bench", "count": 1}] and meta["prompt"]
    assert sorted(p.name for p in (d / "base" / "00001" / "samples").iterdir()) == [f"{i:05d}.png" for i in range(4)]
    assert _size(d / "base" / "00001" / "samples" / "00003.png") == (64, 64)
    assert json.loads((d / "export.json").read_text())["models"]["base"] == str(tiny_model_dir)

    d = tmp_path / "dpg"
    assert sorted(p.name for p in (d / "base").iterdir()) == ["7.png", "partiprompts12.png"]
    assert (
        _size(d / "base" / "7.png") == (128, 128)
        and json.loads((d / "export.json").read_text())["dpg_resolution"] == 64
    )

    d = tmp_path / "longtext"
    names = sorted(p.name for p in (d / "base").iterdir())
    assert names == [f"{p:04d}_{k}.png" for p in (3, 17) for k in range(1, 5)]

    d = tmp_path / "oneig"
    assert _size(d / "anime" / "base" / "000.webp") == (128, 128)
    assert (d / "text" / "base" / "041.webp").is_file()


def test_an_export_refuses_rows_without_its_field_before_sampling(tiny_model_dir, prompts, tmp_path, capfd):
    assert _export(tiny_model_dir, prompts, tmp_path, ["longtext"]) == 2
    assert "has no 'prompt_id' field" in capfd.readouterr().err
    assert _export(tiny_model_dir, prompts, tmp_path, ["dpg"], k=3) == 2
    assert "give --samples-per-prompt 4" in capfd.readouterr().err
    assert _export(tiny_model_dir, prompts, tmp_path, ["coco"]) == 2
    assert "unknown export layout 'coco'" in capfd.readouterr().err


def test_grid_2x2_puts_the_samples_in_reading_order():
    from glm_grpo_ds.evaluation.exports import grid_2x2

    colours = torch.tensor([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0], [1.0, 1.0, 0]])
    grid = grid_2x2(colours[:, :, None, None].expand(4, 3, 8, 8))
    assert grid.size == (16, 16)
    corners = [grid.getpixel(xy) for xy in ((0, 0), (15, 0), (0, 15), (15, 15))]
    assert corners == [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0)]


@pytest.mark.slow
@pytest.mark.distributed
def test_two_ranks_give_the_one_process_figures(evaluated, tmp_path):
    """`deepspeed --num_gpus 2 --module glm_grpo_ds.commands.evaluate`: the prompts split 3 + 3 over two CPU
    ranks, rank 0 gathers and reports; each prompt's seeds are its own, so every figure is the one-process run's."""
    from launching import launch  # noqa: E402  (tests/integration/launching.py)

    result, _, args = evaluated
    args = [*args[: args.index("--out")], "--out", str(tmp_path), *args[args.index("--out") + 2 :]]
    proc = launch(2, ["--module", "glm_grpo_ds.commands.evaluate", *args], timeout=600, launcher=False)
    # the console of `glm-grpo evaluate` on every rank: the libraries' load bars and warnings stay off it
    noise = ("Loading weights", "FutureWarning", "shm_comm_op", "gemm_4bit")
    assert not [line for line in proc.stderr.splitlines() if any(n in line for n in noise)], proc.stderr[-3000:]
    two = json.loads((tmp_path / "evaluate.json").read_text())
    assert two["world_size"] == 2 and two["num_prompts"] == 6
    for name, per_label in result["prompt_means"].items():
        for label, means in per_label.items():
            assert two["prompt_means"][name][label] == pytest.approx(means, abs=1e-6), (name, label)
    assert (tmp_path / "progress" / "rank_1" / "adapter_1" / "batch_000000.pt").is_file()  # rank 1's own store


def _evaluate(tiny_model_dir, prompts, out: Path, *extra) -> int:
    from glm_grpo_ds.commands.evaluate import main

    args = ["--model", str(tiny_model_dir), "--prompts", str(prompts), "--rewards", "pixel_mse"]
    return main([*args, "--samples-per-prompt", "2", "--num-prompts", "2", "--out", str(out), *FAST, *extra])


def test_a_prompt_file_or_adapter_changed_in_place_is_refused(tiny_model_dir, prompts, tmp_path, capfd):
    """The progress store records the prompt rows' and each adapter's content, not only their paths: a rerun
    after either changed in place is refused (one line naming what changed) instead of mixing old batches in."""
    import shutil

    mine = tmp_path / "prompts.jsonl"
    shutil.copy(prompts, mine)
    adapter = save_adapter(tiny_model_dir, tmp_path / "adapter", 0.0)
    out = tmp_path / "out"
    assert _evaluate(tiny_model_dir, mine, out, "--adapter", str(adapter)) == 0
    assert _evaluate(tiny_model_dir, mine, out, "--adapter", str(adapter)) == 0  # unchanged: resumes
    original = mine.read_text()
    rows = [json.loads(line) for line in original.splitlines()]
    rows[1]["prompt"] += " at dusk"
    mine.write_text("".join(json.dumps(r) + "\n" for r in rows))
    capfd.readouterr()
    assert _evaluate(tiny_model_dir, mine, out, "--adapter", str(adapter)) == 2
    err = capfd.readouterr().err
    assert (
        "other settings (prompts_sha256); give another --out, or --fresh" in err and len(err.strip().splitlines()) == 1
    )
    mine.write_text(original)
    save_adapter(tiny_model_dir, adapter, 0.5)  # retrained into the same directory
    assert _evaluate(tiny_model_dir, mine, out, "--adapter", str(adapter)) == 2
    assert "other settings (adapters_sha256)" in capfd.readouterr().err
    assert _evaluate(tiny_model_dir, mine, out, "--adapter", str(adapter), "--fresh") == 0


def test_a_resumed_export_writes_the_stored_batches_files_again(tiny_model_dir, export_prompts, tmp_path):
    """A stored batch's record lists the files its export wrote; one whose files are gone is sampled again (the
    same seeds give the same images), so resuming into a partly deleted export completes it."""
    from PIL import Image

    assert _export(tiny_model_dir, export_prompts, tmp_path, ["longtext", "geneval"]) == 0
    gone = [tmp_path / "longtext" / "base" / "0017_3.png", tmp_path / "geneval" / "base" / "00001" / "metadata.jsonl"]
    record = torch.load(tmp_path / "out" / "progress" / "rank_0" / "base" / "batch_000000.pt", weights_only=True)
    assert {str(p) for p in gone} <= set(record["exported"])
    with Image.open(gone[0]) as img:
        before = img.tobytes()
    meta = gone[1].read_text()
    for path in gone:
        path.unlink()
    assert _export(tiny_model_dir, export_prompts, tmp_path, ["longtext", "geneval"]) == 0
    with Image.open(gone[0]) as img:
        assert img.tobytes() == before
    assert gone[1].read_text() == meta


def _hub_dataset(cache: Path, repo: str, commit: str, files: dict[str, str], main: bool) -> None:
    """huggingface_hub's cache layout: snapshots/<commit>/<path>, refs/main = the commit."""
    root = cache / f"datasets--{repo.replace('/', '--')}"
    for rel, text in files.items():
        (root / "snapshots" / commit / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "snapshots" / commit / rel).write_text(text)
    if main:
        (root / "refs").mkdir(parents=True, exist_ok=True)
        (root / "refs" / "main").write_text(commit)


def test_a_hub_dataset_id_is_read_with_eval_split_and_revision(tiny_model_dir, tmp_path):
    pytest.importorskip("rapidocr_onnxruntime")
    """``--prompts org/name`` reads held-out prompts as training's eval does: ``eval.split`` (default test) and
    ``eval.revision``, not data.split / data.revision. Offline, from a Hugging Face cache laid out here."""
    import os
    import subprocess
    import sys

    def lines(*words):  # rows with a text to render, for the ocr reward
        return "".join(json.dumps({"prompt": f"a sign that reads '{w}'", "text": w}) + "\n" for w in words)

    old, new = "a" * 40, "b" * 40
    train = lines("TRAIN", "TRAIN", "TRAIN")
    _hub_dataset(tmp_path / "hub", "acme/heldout", old, {"train.jsonl": train, "test.jsonl": lines("OLD")}, False)
    _hub_dataset(tmp_path / "hub", "acme/heldout", new, {"train.jsonl": train, "test.jsonl": lines("NEW", "NEW")}, True)
    env = dict(
        os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path / "hub"), HF_DATASETS_CACHE=str(tmp_path / "arrow")
    )
    out = tmp_path / "out"
    args = ["--model", str(tiny_model_dir), "--prompts", "acme/heldout", "--rewards", "ocr"]
    args += ["--samples-per-prompt", "1", "--out", str(out), *FAST, f"eval.revision={old}"]
    proc = subprocess.run(
        [sys.executable, "-m", "glm_grpo_ds.commands.evaluate", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "evaluate.json").read_text())
    assert result["prompts"] == "acme/heldout (split test)" and result["prompts_revision"] == old
    assert result["num_prompts"] == 1  # the old commit's test split (main's has 2 prompts, train 3)


def test_evaluate_draws_the_final_in_run_evaluations_samples(tiny_model_dir, data64, prompts, tmp_path):
    """One seed scheme (glm_grpo_ds/evaluation/seeds.py): a one-step run evaluates its final policy on 4 held-out
    prompts; `glm-grpo evaluate` of its final adapter with the run's config and its defaults (--seed = eval.seed,
    --samples-per-prompt = eval.group_size) draws the same samples, so its adapter figures are the run's; so does
    `glm-grpo evaluate --adapter RUN/final_adapter` alone (the run's settings and held-out prompts)."""
    from launching import CONFIG, common, run_train  # noqa: E402  (tests/integration/launching.py)
    from launching import FAST as TRAIN_FAST

    from glm_grpo_ds.commands.evaluate import main

    run = tmp_path / "run"
    overrides = common(tiny_model_dir, data64, run, "max_steps=1", *TRAIN_FAST, *FAST)
    overrides += [
        f"eval.file={prompts}",
        "eval.num_prompts=4",
        "eval.group_size=3",
        "eval.seed=7",
        "eval.at_start=false",
    ]
    proc = run_train(*overrides)
    assert proc.returncode == 0, proc.stderr[-3000:]
    final = json.loads((run / "eval.jsonl").read_text().splitlines()[-1])
    assert final["step"] == 1 and final["eval/reward_std"] > 0  # rewards that tell samples apart

    out = tmp_path / "evaluate"
    assert main(["--config", str(CONFIG), *overrides, "--adapter", str(run / "final_adapter"), "--out", str(out)]) == 0
    result = json.loads((out / "evaluate.json").read_text())
    assert result["seed"] == 7 and result["samples_per_prompt"] == 3 and result["num_prompts"] == 4
    means = result["prompt_means"]["adapter_0"]["pixel_mse"]
    assert sum(means) / len(means) == pytest.approx(final["eval/reward/pixel_mse"], abs=1e-6)
    alone = tmp_path / "alone"
    assert main(["--adapter", str(run / "final_adapter"), "--out", str(alone)]) == 0
    again = json.loads((alone / "evaluate.json").read_text())
    assert (again["seed"], again["samples_per_prompt"], again["num_prompts"]) == (7, 3, 4)
    assert again["prompt_means"]["adapter_0"]["pixel_mse"] == means


def test_the_in_run_evaluation_samples_the_adapters_average_which_final_adapter_ema_holds(
    tiny_model_dir, data64, prompts, tmp_path
):
    """lora.ema_decay (glm_grpo_ds/model/ema.py) over 3 steps: final_adapter_ema/ is the average of the adapters the
    checkpoints of steps 1-3 hold (diffusers' warm-up: the first copies, then decays 2/11, 3/12), and the run's final
    evaluation sampled it: `glm-grpo evaluate` of final_adapter_ema/ draws its samples."""
    from launching import FAST as TRAIN_FAST
    from launching import common, run_train  # noqa: E402  (tests/integration/launching.py)
    from safetensors.torch import load_file

    from glm_grpo_ds.commands.evaluate import main

    run = tmp_path / "run"
    overrides = common(tiny_model_dir, data64, run, "max_steps=3", "save_steps=1", *TRAIN_FAST, *FAST)
    overrides += ["lora.ema_decay=0.9", "optimizer.lr=1e-2", f"eval.file={prompts}", "eval.num_prompts=4"]
    overrides += ["eval.group_size=3", "eval.at_start=false"]
    proc = run_train(*overrides)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [
        load_file(run / "checkpoints" / f"step_{i:06d}" / "adapter" / "adapter_model.safetensors") for i in (1, 2, 3)
    ]
    want = dict(steps[0])
    for n, weights in enumerate(steps[1:], start=1):
        d = min(0.9, (1 + n) / (10 + n))
        want = {k: v - (1 - d) * (v - weights[k]) for k, v in want.items()}
    got = load_file(run / "final_adapter_ema" / "adapter_model.safetensors")
    assert got.keys() == want.keys() and all(torch.allclose(got[k], want[k], rtol=0, atol=1e-7) for k in want)
    assert not all(torch.equal(got[k], steps[2][k]) for k in got)  # not the last step's adapter (final_adapter/)
    assert (run / "checkpoints" / "step_000003" / "ema-00000.safetensors").is_file()  # the resume's
    kept = load_file(run / "checkpoints" / "step_000003" / "adapter_ema" / "adapter_model.safetensors")
    assert all(torch.equal(kept[k], got[k]) for k in got)  # in peft format too
    assert "moving average (decay 0.9) of a LoRA adapter" in (run / "final_adapter_ema" / "README.md").read_text()
    final = json.loads((run / "eval.jsonl").read_text().splitlines()[-1])
    out = tmp_path / "evaluate"
    assert main(["--adapter", str(run / "final_adapter_ema"), "--out", str(out)]) == 0
    means = json.loads((out / "evaluate.json").read_text())["prompt_means"]["adapter_0"]["pixel_mse"]
    assert sum(means) / len(means) == pytest.approx(final["eval/reward/pixel_mse"], abs=1e-6)


def test_the_reports_captions_give_each_images_own_reward_and_the_prompts_mean_apart(evaluated):
    """Each image of report.html is the prompt's first sample: its caption is that sample's reward (the weighted
    total of the stored per-sample rewards, sample 0), and the prompt's mean over its K samples is labelled so."""
    import re

    result, out, _ = evaluated
    page = (out / "report.html").read_text(encoding="utf-8")
    captions = re.findall(
        r'alt="(\w+), prompt (\d+)"><div class="caption">total (\S+) \(this image\); prompt mean (\S+) over 3 samples',
        page,
    )
    assert len(captions) == 6 * 3
    for name, i, own, mean in captions:
        i = int(i)
        batch = torch.load(out / "progress" / "rank_0" / name / f"batch_{i - i % 4:06d}.pt", weights_only=True)
        sample0 = batch["rewards"]["pixel_mse"][i % 4, 0] + batch["rewards"]["ssim"][i % 4, 0]  # weights 1 and 1
        assert float(own) == pytest.approx(float(sample0), abs=6e-4)
        assert float(mean) == pytest.approx(result["prompt_means"][name]["total"][i], abs=6e-4)
    assert any(own != mean for _, _, own, mean in captions)  # the image's reward is not the prompt's mean


def test_without_config_evaluate_takes_the_adapters_run_settings_and_says_so(short_run, prompts, tmp_path, capfd):
    """No --config, --model or --rewards: the run that wrote the adapter (tests' short_run: 64x64, pixel_mse, the
    tiny model) gives the model, size, sampling, eval decode, seed, K and rewards, in one stderr line naming its
    config.json; an override given here wins (eval.num_inference_steps=1; the run's was the pipeline's 50). A line
    before the models load says what is coming; the count follows."""
    from glm_grpo_ds.commands.evaluate import main

    record = json.loads((short_run / "config.json").read_text())
    run = record["train"]
    assert Path(record["launch_dir"]).is_dir()  # where a relative model.path starts, from any directory
    out = tmp_path / "ev"
    args = ["--adapter", str(short_run / "final_adapter"), "--prompts", str(prompts), "--num-prompts", "2"]
    assert main([*args, "--samples-per-prompt", "1", "--out", str(out), "eval.num_inference_steps=1"]) == 0
    result = json.loads((out / "evaluate.json").read_text())
    assert result["image"] == [64, 64] and result["model"] == str(Path(run["model"]["path"]).resolve())
    assert [r["name"] for r in result["rewards"]] == ["pixel_mse"] and result["seed"] == run["eval"]["seed"]
    assert result["decode"] == {"num_inference_steps": 1, "guidance_scale": 1.5}  # the run's eval guidance: null
    err = capfd.readouterr().err.splitlines()
    said = [line for line in err if line.startswith("glm-grpo evaluate: settings of adapter_0's run, from ")]
    assert len(said) == 1 and str(short_run / "config.json") in said[0], err
    assert "rollout.height=64" in said[0] and "rewards=[pixel_mse]" in said[0]
    assert "eval.num_inference_steps" not in said[0]  # given here
    start = err.index("evaluate: 2 models x 2 prompts x 1 samples = 4 images at 64x64, decoded with 1 DiT step "
                      "(guidance 1.5), rewards pixel_mse")  # fmt: skip
    assert start < next(i for i, line in enumerate(err) if line.startswith("evaluate (2 models x 1 samples): "))


def test_a_reward_undefined_on_some_samples_is_said_under_the_table(tiny_model_dir, prompts, tmp_path, capfd):
    """A plugin reward that returns NaN for the first prompt's samples: the table's line says how many of the
    base's samples it left out (2 of 8), and its mean is the other prompts'."""
    rows = [json.loads(line) for line in Path(prompts).read_text().splitlines()][:4]
    plugin = tmp_path / "first_undefined.py"
    plugin.write_text(
        "import torch\n"
        f"FIRST = {rows[0]['prompt']!r}\n"
        "def score(images, prompts, samples):\n"
        "    return torch.tensor([float('nan') if p == FIRST else 0.5 for p in prompts])\n"
    )
    args = ["evaluate", "--model", str(tiny_model_dir), "--prompts", str(prompts), "--rewards", f"{plugin}:score"]
    args += ["--samples-per-prompt", "2", "--num-prompts", "4", "--out", str(tmp_path / "ev")]
    code, out, err = glm_grpo([*args, *FAST], capfd)
    assert code == 0, err
    label = f"{plugin}:score"  # a plugin is labelled by its spec
    assert f"undefined: {label} on 2 of 8 samples (the reward raised or returned NaN" in out, out
    assert "returned None/NaN/inf for 2 of" in err  # the warning the line points to
    row = out.splitlines()[2].split()
    assert row[:2] == [label, "0.5000"] and row[-1] == "3"  # the mean and prompt count of the 3 others


STARVED = """import torch
SECOND = {second!r}
def score(images, prompts, samples):
    if SECOND in prompts:  # the second batch of prompts; torch 2.15's caching allocator's words
        raise torch.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.23 "
            "GiB is free. Of the allocated memory 70.10 GiB is allocated by PyTorch, and 9.50 GiB is reserved by "
            "PyTorch but unallocated."
        )
    return torch.zeros(len(prompts))
"""


def test_out_of_memory_is_one_line_naming_the_batch_and_what_to_change_exit_8(tiny_model_dir, prompts, tmp_path, capfd):
    """A reward running out of GPU memory on the second batch of prompts: not a failure of those samples (the
    evaluation would report a reward mean without them) but the command's end, exit 8, in one line: where (the
    phase, the reward, the model and the prompt rows), torch's figures, the --batch-prompts that scores fewer images
    at once, the fragmentation hint (9.5 of 79 GiB reserved but unallocated) and the batch kept for a rerun."""
    rows = [json.loads(line) for line in Path(prompts).read_text().splitlines()]
    plugin = tmp_path / "starved.py"
    plugin.write_text(STARVED.format(second=rows[2]["prompt"]))
    out = tmp_path / "ev"
    args = ["evaluate", "--model", str(tiny_model_dir), "--prompts", str(prompts), "--rewards", f"{plugin}:score"]
    args += ["--samples-per-prompt", "2", "--num-prompts", "4", "--batch-prompts", "2", "--out", str(out)]
    code, _, err = glm_grpo([*args, *FAST], capfd)
    assert code == 8, err
    (line,) = [x for x in err.splitlines() if "out of GPU memory" in x]
    assert line == (
        f"glm-grpo evaluate: out of GPU memory in the reward phase (reward {plugin}:score in model base, prompt rows "
        "2-3): tried to allocate 2.00 GiB with 1.23 GiB of 79.15 GiB free; --batch-prompts 1 samples and scores half "
        "as many images at once (now 2 prompts x 2 samples); it is another setting of the evaluation: with another "
        "--out (what is kept stays there), or --fresh (discards it); 9.50 GiB were reserved but unallocated "
        "(fragmentation): launching with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True may be enough; this rank's "
        f"1 finished batch of prompts is kept in {out / 'progress' / 'rank_0'}: the same settings go on"
    )
    assert "Traceback" not in err and "raised OutOfMemoryError" not in err
    assert (out / "progress" / "rank_0" / "base" / "batch_000000.pt").is_file()


def test_out_of_memory_while_loading_is_one_line_exit_8(tiny_model_dir, prompts, tmp_path, capfd):
    """A reward model that does not fit the GPU as it loads (a plugin class whose constructor runs out of memory),
    before any sampling: the command's line all the same, with where and torch's figures, exit 8."""
    plugin = tmp_path / "judge.py"
    plugin.write_text(
        "import torch\nclass Judge:\n    def __init__(self):\n"
        "        raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 30.00 GiB. GPU 0 has a total "
        "capacity of 79.15 GiB of which 12.00 GiB is free.')\n"
        "    def __call__(self, images, prompts, samples):\n        return torch.zeros(len(prompts))\n"
    )
    out = tmp_path / "ev"
    args = ["evaluate", "--model", str(tiny_model_dir), "--prompts", str(prompts), "--rewards", f"{plugin}:Judge"]
    code, _, err = glm_grpo([*args, "--num-prompts", "2", "--out", str(out), *FAST], capfd)
    assert code == 8, err
    assert err.strip().splitlines()[-1] == (
        "glm-grpo evaluate: out of GPU memory: tried to allocate 30.00 GiB with 12.00 GiB of 79.15 GiB free; no "
        f"setting of this command makes it smaller: a GPU with more free memory; the progress is in {out}"
    )


def test_a_full_fine_tunings_final_model_is_compared_with_its_base_beside_an_adapter(tiny_model_dir, prompts, tmp_path):
    """A full fine-tuning's AR given to --adapter (its run folder: the final_model/ inside) is sampled as a pipeline
    holding it as its own AR would be, and the base and a LoRA adapter beside it as each is evaluated alone: its
    weights are copied into the one model in memory for its batches and the base's back for theirs."""
    from glm_grpo_ds.model.glm_image import AR_DIR
    from glm_grpo_ds.model.policy import load_ar

    ar = load_ar(tiny_model_dir, torch.float32)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in ar.parameters():
            p.add_(0.05 * torch.randn_like(p))
    ar.save_pretrained(tmp_path / "run_full" / "final_model")
    pipeline = tmp_path / "pipeline"  # the same AR in a pipeline of its own: evaluated as the base
    shutil.copytree(tiny_model_dir, pipeline, ignore=lambda d, names: [AR_DIR] if Path(d) == tiny_model_dir else [])
    ar.save_pretrained(pipeline / AR_DIR)
    noisy = str(save_adapter(tiny_model_dir, tmp_path / "noisy", 0.5))
    full = str(tmp_path / "run_full")
    assert _evaluate(tiny_model_dir, prompts, tmp_path / "both", "--adapter", full, "--adapter", noisy) == 0
    assert _evaluate(pipeline, prompts, tmp_path / "alone") == 0
    assert _evaluate(tiny_model_dir, prompts, tmp_path / "lora", "--adapter", noisy) == 0
    both, alone, lora = (json.loads((tmp_path / d / "evaluate.json").read_text()) for d in ("both", "alone", "lora"))
    means = both["prompt_means"]
    assert means["adapter_0"] == alone["prompt_means"]["base"]
    assert means["base"] == lora["prompt_means"]["base"] and means["adapter_1"] == lora["prompt_means"]["adapter_0"]
    assert means["adapter_0"] != means["base"]  # another AR: other images
    assert both["adapters"]["adapter_0"] == str((tmp_path / "run_full" / "final_model").resolve())
