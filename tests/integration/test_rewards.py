"""Built-in rewards on real libraries, offline: OCR, SSIM, LPIPS, pixel MSE, CLIP-family loaders,
the score command, and a custom reward through a short training."""

import json
import math
from pathlib import Path

import pytest
import torch
from in_process import glm_grpo  # noqa: E402  (tests/in_process.py)
from launching import run_cmd, train_cmd  # noqa: E402  (tests/integration/launching.py)
from PIL import Image, ImageDraw, ImageFont
from run_files import metrics  # noqa: E402  (tests/run_files.py)

from glm_grpo_ds.rewards import build_reward
from glm_grpo_ds.testing.tiny_clip import write_aesthetic_head, write_tiny_clip

ROOT = Path(__file__).resolve().parents[2]


def _to_tensor(img: Image.Image) -> torch.Tensor:
    x = torch.frombuffer(bytearray(img.convert("RGB").tobytes()), dtype=torch.uint8).view(img.height, img.width, 3)
    return x.permute(2, 0, 1).float().div(255)


@pytest.fixture(scope="module")
def hello(tmp_path_factory):
    img = Image.new("RGB", (320, 96), "white")
    ImageDraw.Draw(img).text((12, 24), "HELLO 2026", fill="black", font=ImageFont.load_default(size=40))
    path = tmp_path_factory.mktemp("ocr") / "hello.png"
    img.save(path)
    return path


@pytest.fixture(scope="module")
def ocr():
    pytest.importorskip("rapidocr_onnxruntime")
    return build_reward("ocr", {})


def test_ocr_scores_rendered_text(ocr, hello):
    x = _to_tensor(Image.open(hello)).unsqueeze(0).repeat(4, 1, 1, 1)
    prompts = ['a sign that says "HELLO 2026"', "a sign that says 'GOODBYE'", "a sign without quotes", "anything"]
    scores = ocr(x, prompts, [{}, {}, {}, {"text": "HELLO 2026"}])
    assert scores[0] >= 0.9 and scores[3] >= 0.9
    assert scores[1] <= 0.5
    assert math.isnan(scores[2])


def test_ocr_reads_a_line_whose_boxes_straddle_a_band_edge_in_order_and_hands_rapidocr_bgr():
    """Two words of one line whose tops are 1 px apart across a multiple of 10 (55 and 54) were read "WORLD HELLO"
    (fixed 10-px bands of the top edge); a box whose centre lies in a line's extent joins it, left to right. And
    RapidOCR takes an array as BGR (it converts files and PIL images only): the image went in as RGB."""
    from glm_grpo_ds.rewards.ocr import OCRReward, reading_order

    def box(text, left, top, height=20):
        return [[left, top], [left + 80, top], [left + 80, top + height], [left, top + height]], text, 0.9

    boxes = [box("BYE", 5, 100), box("WORLD", 200, 54), box("HELLO", 10, 55)]
    assert [b[1] for b in reading_order(boxes)] == ["HELLO", "WORLD", "BYE"]
    seen = []
    reward = OCRReward.__new__(OCRReward)  # its engine stood in by one that records what it is handed
    reward.min_confidence, reward.engine = 0.5, lambda arr: (seen.append(arr), (boxes, None))[1]
    image = torch.zeros(3, 4, 4)
    image[2] = 1.0  # blue
    assert reward.read(image) == "HELLO WORLD BYE"
    assert seen[0].shape == (4, 4, 3) and (seen[0][..., 0] == 255).all() and (seen[0][..., 2] == 0).all()


def test_ssim_lpips_pixel_on_targets(tmp_path):
    torch.manual_seed(0)
    x = torch.rand(1, 3, 64, 64)
    Image.fromarray((x[0].permute(1, 2, 0) * 255).round().byte().numpy()).save(tmp_path / "t.png")
    target = _to_tensor(Image.open(tmp_path / "t.png")).unsqueeze(0)  # the uint8-rounded image itself
    sample = {"target_image": str(tmp_path / "t.png")}
    noisy = [(target + s * torch.randn_like(target)).clamp(0, 1) for s in (0.0, 0.05, 0.2)]
    batch = torch.cat(noisy)
    ssim = build_reward("ssim", {})(batch, ["p"] * 3, [sample] * 3)
    assert ssim[0].item() == pytest.approx(1.0, abs=1e-5) and ssim[0] > ssim[1] > ssim[2]
    lpips_r = build_reward("lpips", {"pretrained_backbone": False})  # random backbone: offline
    dist = -lpips_r(batch, ["p"] * 3, [sample] * 3)
    assert dist[0].item() == pytest.approx(0.0, abs=1e-6) and dist[0] < dist[1] < dist[2]
    mse = build_reward("pixel_mse", {})(batch, ["p"] * 3, [sample] * 3)
    assert mse[0].item() == pytest.approx(0.0, abs=1e-10) and mse[0] > mse[1] > mse[2]
    # no target -> undefined
    assert torch.isnan(build_reward("ssim", {})(batch[:1], ["p"], [{}])).all()


def test_each_target_file_is_read_and_copied_once_per_batch_and_every_row_meets_its_own(tmp_path, monkeypatch):
    """A group's G rows share a target: stack_targets reads it (and copies it to the device) once per batch, not per
    row; rows of two targets in any order get their own, a row without one zeros, an unreadable file undefined."""
    from glm_grpo_ds.rewards import base
    from glm_grpo_ds.rewards.targets import load_target

    for name, colour in (("a.png", (255, 0, 0)), ("b.png", (0, 0, 255))):
        Image.new("RGB", (32, 32), colour).save(tmp_path / name)
    (tmp_path / "bad.png").write_bytes(b"not a png")
    read = []
    monkeypatch.setattr(
        base, "load_target", lambda path, h, w: (read.append(Path(path).name), load_target(path, h, w))[1]
    )
    paths = ["a.png", "b.png", None, "a.png", "bad.png", "b.png", "bad.png"]
    samples = [{"target_image": str(tmp_path / p)} if p else {} for p in paths]
    targets, has = base.stack_targets(samples, 32, 32, "cpu")
    assert read == ["a.png", "b.png", "bad.png"]
    assert has.tolist() == [True, True, False, True, False, True, False]
    red, blue = load_target(str(tmp_path / "a.png"), 32, 32), load_target(str(tmp_path / "b.png"), 32, 32)
    expected = [red, blue, torch.zeros(3, 32, 32), red, torch.zeros(3, 32, 32), blue, torch.zeros(3, 32, 32)]
    assert torch.equal(targets, torch.stack(expected))


def test_target_rule_resize_to_cover_then_center_crop(tmp_path):
    from glm_grpo_ds.rewards.targets import load_target

    img = Image.new("RGB", (200, 100), (0, 0, 255))
    ImageDraw.Draw(img).rectangle([0, 0, 49, 99], fill=(255, 0, 0))  # left quarter red
    img.save(tmp_path / "wide.png")
    t = load_target(str(tmp_path / "wide.png"), 64, 64)  # scale to 128x64, crop the middle 64 columns
    assert t.shape == (3, 64, 64)
    assert t[2].mean() > 0.95 and t[0].mean() < 0.05  # the red quarter was cropped away


def test_clip_family_loaders_on_tiny_random_checkpoints(tmp_path):
    clip_dir = write_tiny_clip(tmp_path / "clip")
    head_pth = write_aesthetic_head(tmp_path / "head.pth", dim=16)
    head_st = write_aesthetic_head(tmp_path / "head.safetensors", dim=16)
    images = torch.rand(3, 3, 64, 96)
    images[1] = images[0]
    prompts = ["a cat", "a cat", "a dog"]
    clip = build_reward("clip", {"model": str(clip_dir)})(images, prompts, [{}] * 3)
    assert clip.shape == (3,) and (clip.abs() <= 1 + 1e-5).all() and clip[0] == clip[1]
    pref_r = build_reward("preference", {"model": str(clip_dir)})
    pref = pref_r(images, prompts, [{}] * 3)
    torch.testing.assert_close(pref, clip * pref_r.scorer.logit_scale())
    a1 = build_reward("aesthetic", {"clip_model": str(clip_dir), "head": str(head_pth)})(images, prompts, [{}] * 3)
    a2 = build_reward("aesthetic", {"clip_model": str(clip_dir), "head": str(head_st), "offload": True})(
        images, prompts, [{}] * 3
    )
    assert torch.isfinite(a1).all() and a1[0] == a1[1]
    torch.testing.assert_close(a1, a2)
    with pytest.raises(ValueError, match=r"reward clip: model .*missing does not exist; get it with `hf download"):
        build_reward("clip", {"model": str(tmp_path / "missing")})
    with pytest.raises(ValueError, match=r"reward aesthetic: head .*nope.pth does not exist; get it with `wget"):
        build_reward("aesthetic", {"clip_model": str(clip_dir), "head": str(tmp_path / "nope.pth")})
    wide = write_aesthetic_head(tmp_path / "wide.pth", dim=768)  # LAION's, beside a CLIP of another width
    with pytest.raises(ValueError, match=r"reward aesthetic: head .*wide.pth takes 768-wide embeddings but clip_model"):
        build_reward("aesthetic", {"clip_model": str(clip_dir), "head": str(wide)})  # a matmul error at step 1


@pytest.mark.slow
def test_score_command(hello, capfd):
    pytest.importorskip("rapidocr_onnxruntime")
    code, out, err = glm_grpo(
        ["score", "--reward", "ocr", "--prompt", "a sign 'HELLO 2026'", "--image", hello, hello], capfd
    )
    assert code == 0, err
    values = [float(v) for v in out.split()]
    assert len(values) == 2 and all(v >= 0.9 for v in values)
    code, out, _ = glm_grpo(["score", "--reward", "ssim", "--prompt", "x", "--image", hello, "--target", hello], capfd)
    assert code == 0 and float(out) == pytest.approx(1.0, abs=1e-5)
    code, _, err = glm_grpo(["score", "--reward", "ocrr", "--prompt", "x", "--image", hello], capfd)
    assert code == 2 and "did you mean ocr" in err


SCALAR = """
import torch
def scaled_mean(images, prompts, samples, k=1.0):
    return k * images.mean(dim=(1, 2, 3))
def scalar(images, prompts, samples, k=1.0):
    return k * images.mean()  # one number for the whole batch: not a reward
"""


def test_score_scores_a_batch_as_training_does(hello, tmp_path, capfd):
    """`glm-grpo score` called the reward one image at a time: a reward returning one number per batch passed it, then
    training stopped on it at step 1. Images of a size are one batch now (a single image is also checked doubled);
    --reward-arg reaches a reward function's own parameters."""
    (tmp_path / "r.py").write_text(SCALAR)
    base = ["score", "--prompt", "x", "--image", str(hello), str(hello), "--reward-arg", "k=2"]
    code, out, err = glm_grpo([*base, "--reward", f"{tmp_path / 'r.py'}:scaled_mean"], capfd)
    assert code == 0, err
    mean = torch.tensor(list(Image.open(hello).convert("RGB").getdata()), dtype=torch.float64).mean().item() / 255
    assert [float(v) for v in out.split()] == pytest.approx([2 * mean] * 2, rel=1e-5)
    for images in ([str(hello), str(hello)], [str(hello)]):
        args = ["score", "--prompt", "x", "--image", *images, "--reward", f"{tmp_path / 'r.py'}:scalar"]
        code, _, err = glm_grpo(args, capfd)
        assert code == 2 and "returned 1 values for 2 images: a reward returns one per image" in err, err
        assert "Traceback" not in err


def test_a_reward_that_breaks_its_contract_stops_training_in_one_line(tiny_model_dir, tmp_path):
    """A plugin returning one number for a batch: a traceback on every rank at step 1 before; now one line naming
    the reward and what it must return, exit 2 (an input error), and its args reached it (no TypeError)."""
    (tmp_path / "r.py").write_text(SCALAR)
    (tmp_path / "p.txt").write_text("a red apple\n")
    out = tmp_path / "run"
    cmd = [*train_cmd(), f"model.path={tiny_model_dir}", f"data.train_file={tmp_path / 'p.txt'}", f"output_dir={out}"]
    cmd += ["max_steps=1", "rollout.height=64", "rollout.width=64", "grpo.group_size=2", "batch.micro_batch_size=2"]
    cmd += ["logging.progress_bar=false", f"rewards=[{{name: '{tmp_path / 'r.py'}:scalar', args: {{k: 2}}}}]"]
    proc = run_cmd(cmd)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "returned 1 values for 2 images: a reward returns one per image" in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr


def test_custom_python_reward_through_training(tiny_model_dir, tmp_path):
    plugin = tmp_path / "my_rewards.py"
    plugin.write_text(
        "import torch\n"
        "def redness(images, prompts, samples):\n"
        "    return images[:, 0].mean(dim=(1, 2)) - images[:, 1:].mean(dim=(1, 2, 3))\n"
        "def sometimes(images, prompts, samples):\n"
        "    out = images.mean(dim=(1, 2, 3)).clone()\n"
        "    out[::2] = float('nan')  # undefined for half the samples\n"
        "    return out\n"
    )
    (tmp_path / "p.txt").write_text("a red apple\na red car\n")
    out = tmp_path / "run"
    cmd = [
        *train_cmd(),
        f"model.path={tiny_model_dir}",
        f"data.train_file={tmp_path / 'p.txt'}",
        f"output_dir={out}",
        "max_steps=2",
        "rollout.height=64",
        "rollout.width=64",
        "grpo.group_size=4",
        "grpo.reward_combination=normalize_then_sum",
        "logging.progress_bar=false",
        f"rewards=[{{name: '{plugin}:redness', weight: 1.0, label: redness}}, "
        f"{{name: '{plugin}:sometimes', weight: 0.5}}]",
    ]
    proc = run_cmd(cmd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = metrics(out)
    assert len(rows) == 2
    assert rows[0][f"reward/{plugin}:sometimes_undefined"] == 2  # half of 1 prompt x G=4
    # rewards[0].label names its metrics (not the plugin's path)
    assert rows[0]["reward/redness"] is not None and math.isfinite(rows[0]["loss"])
    assert not any(key.startswith(f"reward/{plugin}:redness") for key in rows[0])


@pytest.mark.slow
def test_every_builtin_in_a_short_training(tiny_model_dir, tmp_path):
    pytest.importorskip("rapidocr_onnxruntime")
    clip_dir = write_tiny_clip(tmp_path / "clip")
    head = write_aesthetic_head(tmp_path / "head.safetensors", dim=16)
    Image.new("RGB", (64, 64), (200, 30, 30)).save(tmp_path / "target.png")
    rows = [
        {"prompt": "a sign that says 'HI'", "target_image": "target.png"},
        {"prompt": "a red square", "target_image": "target.png", "text": "OK"},
    ]
    (tmp_path / "p.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    rewards = (
        "[{name: pixel_mse}, {name: ssim}, {name: lpips, args: {pretrained_backbone: false}}, {name: ocr},"
        f" {{name: clip, args: {{model: '{clip_dir}'}}}},"
        f" {{name: preference, weight: 0.1, args: {{model: '{clip_dir}'}}}},"
        f" {{name: aesthetic, args: {{clip_model: '{clip_dir}', head: '{head}', offload: true}}}}]"
    )
    out = tmp_path / "run"
    cmd = [
        *train_cmd(),
        f"model.path={tiny_model_dir}",
        f"data.train_file={tmp_path / 'p.jsonl'}",
        f"output_dir={out}",
        "max_steps=1",
        "rollout.height=64",
        "rollout.width=64",
        "grpo.group_size=4",
        "batch.prompts_per_rank=2",
        "logging.progress_bar=false",
        f"rewards={rewards}",
    ]
    proc = run_cmd(cmd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = metrics(out)
    for name in ("pixel_mse", "ssim", "lpips", "ocr", "clip", "preference", "aesthetic"):
        assert row[f"reward/{name}"] is not None and math.isfinite(row[f"reward/{name}"]), name
        assert row[f"reward/{name}_undefined"] == 0, name
    assert math.isfinite(row["loss"]) and math.isfinite(row["reward_mean"])


def test_a_target_is_read_upright_by_its_exif_orientation_and_transparency_over_white(tmp_path):
    """A photo stored sideways with an Orientation tag (as phones write them) was cover-cropped sideways, and a
    transparent PNG's hidden pixels (black here) were its background: the likeness rewards compared with them."""
    from PIL import Image

    from glm_grpo_ds.rewards.targets import load_target

    upright = Image.new("RGB", (64, 32), "white")
    upright.paste(Image.new("RGB", (32, 32), "red"), (0, 0))  # red on the left half
    exif = Image.Exif()
    exif[0x0112] = 6  # stored rotated: shown after a 90-degree turn clockwise
    upright.transpose(Image.Transpose.ROTATE_90).save(tmp_path / "photo.jpg", exif=exif, quality=95)
    got = load_target(str(tmp_path / "photo.jpg"), 32, 64)
    assert got[0, :, :28].mean() > 0.9 and got[1, :, :28].mean() < 0.1  # red left
    assert got[1, :, 36:].mean() > 0.9  # white right

    clear = Image.new("RGBA", (8, 8), (0, 0, 0, 0))
    clear.paste((0, 0, 255, 255), (0, 0, 4, 8))  # an opaque blue left half on nothing
    clear.save(tmp_path / "logo.png")
    got = load_target(str(tmp_path / "logo.png"), 8, 8)
    assert got[:, :, :4].tolist() == torch.tensor([0.0, 0.0, 1.0])[:, None, None].expand(3, 8, 4).tolist()
    assert (got[:, :, 4:] == 1.0).all()  # white, not the black under alpha 0


def test_16_bit_and_float_greyscale_targets_keep_their_grey(tmp_path):
    """PIL's own conversion clips a 16-bit PNG's 0..65535 to 255 (mid-grey read as white) and a float image's 0..1
    to 0 (black): the likeness rewards trained against a blank target."""
    import numpy as np
    from PIL import Image

    from glm_grpo_ds.rewards.targets import load_target

    Image.fromarray(np.full((8, 8), 30000, dtype=np.uint16)).save(tmp_path / "grey16.png")
    assert load_target(str(tmp_path / "grey16.png"), 8, 8).mean().item() == pytest.approx(round(30000 / 257) / 255)
    Image.fromarray(np.full((8, 8), 0.5, dtype=np.float32), mode="F").save(tmp_path / "grey.tif")
    assert load_target(str(tmp_path / "grey.tif"), 8, 8).mean().item() == pytest.approx(128 / 255)
    Image.fromarray(np.full((8, 8), 7.0, dtype=np.float32), mode="F").save(tmp_path / "hdr.tif")
    with pytest.raises(ValueError, match=r"hdr.tif: a float image with values in \[7, 7\], not \[0, 1\]"):
        load_target(str(tmp_path / "hdr.tif"), 8, 8)


def test_a_target_truncated_after_the_start_leaves_only_its_own_rows_undefined(tmp_path):
    """The start reads each target's header; a file cut short later raised for the whole batch, every sample of the
    rank then undefined at every step that drew it."""
    Image.new("RGB", (16, 16), (255, 0, 0)).save(tmp_path / "red.png")
    noise = Image.fromarray((torch.rand(64, 64, 3) * 255).to(torch.uint8).numpy())
    noise.save(tmp_path / "full.png")
    data = (tmp_path / "full.png").read_bytes()
    (tmp_path / "cut.png").write_bytes(data[: len(data) // 2])
    samples = [{"target_image": str(tmp_path / "red.png")}, {"target_image": str(tmp_path / "cut.png")}]
    images = torch.zeros(2, 3, 16, 16)
    images[:, 0] = 1.0  # red: the first row's target exactly
    got = build_reward("pixel_mse", {})(images, ["p", "p"], samples)
    assert got[0].item() == pytest.approx(0.0, abs=1e-6) and torch.isnan(got[1])


def test_the_vqa_judge_scores_a_training_run(tiny_model_dir, tmp_path):
    """The vqa reward (rewards/vqa.py) on a tiny random Qwen2-VL, through `train --check` and a real training step:
    every sample gets a probability, none undefined, and the run's summary of it is its mean."""
    from glm_grpo_ds.testing.tiny_vlm import build_tiny_vlm

    judge = build_tiny_vlm(tmp_path / "judge")
    (tmp_path / "p.txt").write_text("a red apple\na blue car\n")
    out = tmp_path / "run"
    cmd = [*train_cmd(), f"model.path={tiny_model_dir}", f"data.train_file={tmp_path / 'p.txt'}", f"output_dir={out}"]
    cmd += ["max_steps=1", "rollout.height=64", "rollout.width=64", "grpo.group_size=4", "logging.progress_bar=false"]
    cmd += [f"rewards=[{{name: vqa, args: {{model: '{judge}', batch_size: 3}}}}]"]
    check = run_cmd([*cmd, "--check", "--num-gpus", "1"])
    assert check.returncode == 0, check.stderr[-3000:]
    proc = run_cmd(cmd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = metrics(out)
    assert 0 < row["reward/vqa"] < 1 and row.get("reward/vqa_undefined", 0) == 0, row
