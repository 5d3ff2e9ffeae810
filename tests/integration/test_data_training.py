"""Training from a parquet prompt set (`python -m glm_grpo_ds.train`, one process): the target images
stored in the file reach the rewards, the column mapping and an eval DatasetDict split apply, and
the run is step for step the one from the equivalent .jsonl with image paths; a bad dataset is one
line, exit 2."""

import math

import pytest
from launching import FAST as ONE_STEP  # noqa: E402
from launching import run_train  # noqa: E402  (tests/integration/launching.py)
from run_files import jsonl  # noqa: E402  (tests/run_files.py)

FAST = [
    "max_steps=2",
    *ONE_STEP,
    "eval.num_prompts=2",
    "eval.group_size=2",
    "eval.gallery=false",
    "eval.at_start=false",
]


@pytest.fixture(scope="module")
def prompts(tiny_model_dir, tmp_path_factory):
    """The tiny learnable set as .jsonl (target paths) and as parquet (caption + image bytes), plus an
    eval DatasetDict saved to disk whose "validation" split is the first rows."""
    import datasets

    from glm_grpo_ds.config import DecoderConfig
    from glm_grpo_ds.testing.tiny_data import write_tiny_dataset

    out = tmp_path_factory.mktemp("data")
    ref = write_tiny_dataset(tiny_model_dir, out, 64, 64, DecoderConfig(num_inference_steps=2), num_prompts=4)
    rows = jsonl(ref)
    images = [{"bytes": (out / r["target_image"]).read_bytes(), "path": None} for r in rows]
    feats = datasets.Features({"caption": datasets.Value("string"), "picture": datasets.Image()})
    table = datasets.Dataset.from_dict({"caption": [r["prompt"] for r in rows], "picture": images}, features=feats)
    table.to_parquet(out / "prompts.parquet")
    datasets.DatasetDict({"train": table.select([3]), "validation": table.select([0, 1])}).save_to_disk(out / "eval")
    return ref, out / "prompts.parquet", out / "eval"


@pytest.mark.slow
def test_parquet_with_stored_images_trains_like_the_jsonl(tiny_model_dir, prompts, tmp_path):
    ref, parquet, eval_dir = prompts
    out = tmp_path / "a"
    from_jsonl = run_train(
        f"model.path={tiny_model_dir}", f"data.train_file={ref}", f"eval.file={ref}", f"output_dir={out}", *FAST
    )
    assert from_jsonl.returncode == 0, from_jsonl.stderr[-3000:]
    mapped = ["data.prompt_key=caption", "data.target_image_key=picture", "eval.split=validation"]
    from_parquet = run_train(
        f"model.path={tiny_model_dir}",
        f"data.train_file={parquet}",
        f"eval.file={eval_dir}",
        f"output_dir={tmp_path / 'b'}",
        *mapped,
        *FAST,
    )
    assert from_parquet.returncode == 0, from_parquet.stderr[-3000:]
    a, b = jsonl(tmp_path / "a" / "metrics.jsonl"), jsonl(tmp_path / "b" / "metrics.jsonl")
    assert len(a) == len(b) == 2
    for ra, rb in zip(a, b):
        assert rb["reward/pixel_mse_undefined"] == 0 and math.isfinite(rb["reward/pixel_mse"])
        for key in ("reward_mean", "reward/pixel_mse", "loss", "entropy"):
            assert rb[key] == pytest.approx(ra[key], rel=1e-6, abs=1e-9), key
        assert ra["kl"] is None and rb["kl"] is None  # beta 0 (tiny_cpu.yaml): no reference, no KL measured
    ea, eb = jsonl(tmp_path / "a" / "eval.jsonl"), jsonl(tmp_path / "b" / "eval.jsonl")
    assert [e["eval/num_prompts"] for e in eb] == [2]
    assert [e["eval/reward/pixel_mse"] for e in eb] == pytest.approx([e["eval/reward/pixel_mse"] for e in ea])


@pytest.mark.slow
def test_a_bad_column_is_one_line_exit_2(tiny_model_dir, prompts, tmp_path):
    _, parquet, _ = prompts
    proc = run_train(f"model.path={tiny_model_dir}", f"data.train_file={parquet}", f"output_dir={tmp_path}", *FAST)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        f'glm-grpo train: data.prompt_key "prompt" is not a column of {parquet} (columns: caption, picture); '
        "set data.prompt_key to the right one"
    )
