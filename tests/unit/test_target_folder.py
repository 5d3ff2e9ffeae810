"""The seeds' data layout (glm_grpo_ds/data/target_folder.py): ``prompts.txt`` with a ``target_images/`` folder
beside it, one image per line named by the line's number; each refusal is one line naming the file and the line."""

import json

import pytest
from PIL import Image

from glm_grpo_ds.config import RewardSpec
from glm_grpo_ds.data import DataError, load_prompts


def _layout(tmp_path, text: str, names: list[str]):
    """``p.txt`` holding ``text`` and ``target_images/`` holding a distinct 4x4 PNG per name (its colour = its
    position in ``names``, so a test can tell which file a row got)."""
    (tmp_path / "p.txt").write_text(text)
    folder = tmp_path / "target_images"
    folder.mkdir()
    for i, name in enumerate(names):
        Image.new("RGB", (4, 4), (i, 0, 0)).save(folder / name, format="PNG")
    return tmp_path / "p.txt", folder


def test_numbered_from_one_with_any_padding_and_suffix_and_blank_lines_kept_in_the_count(tmp_path, caplog):
    # line 3 is blank: it keeps its number (as in an editor), so the third prompt is line 4's image
    path, folder = _layout(tmp_path, "a cat\na dog\n\n  a cow \n", ["1.png", "002.JPG", "0004.jpeg", ".DS_Store"])
    rows = load_prompts(path)
    assert [(r.index, r.prompt, r.target_image) for r in rows] == [
        (0, "a cat", str(folder.resolve() / "1.png")),
        (1, "a dog", str(folder.resolve() / "002.JPG")),
        (2, "a cow", str(folder.resolve() / "0004.jpeg")),
    ]
    assert rows[2].reward_sample()["target_image"] == str(folder.resolve() / "0004.jpeg")
    assert caplog.text.count("target images from") == 1 and "(line numbers from 1)" in caplog.text  # said once


def test_numbered_from_zero_when_an_image_is_named_zero(tmp_path, caplog):
    path, folder = _layout(tmp_path, "a cat\na dog\n", ["00.png", "01.png"])
    assert [r.target_image for r in load_prompts(path)] == [str(folder.resolve() / n) for n in ("00.png", "01.png")]
    assert "(line numbers from 0)" in caplog.text


def test_without_the_folder_a_txt_has_no_targets_and_a_jsonl_ignores_the_folder(tmp_path):
    (tmp_path / "p.txt").write_text("a cat\n")
    assert load_prompts(tmp_path / "p.txt")[0].target_image is None
    (tmp_path / "j").mkdir()
    _layout(tmp_path / "j", "", ["1.png"])  # a .jsonl names its targets itself (target_image keys)
    (tmp_path / "j" / "p.jsonl").write_text(json.dumps({"prompt": "a cat"}) + "\n")
    assert load_prompts(tmp_path / "j" / "p.jsonl")[0].target_image is None


def test_the_likeness_rewards_accept_the_layout(tmp_path):
    from glm_grpo_ds.rewards import RewardError, check_reward_inputs

    path, _ = _layout(tmp_path, "a cat\na dog\n", ["1.png", "2.png"])
    specs = [RewardSpec(name="ssim"), RewardSpec(name="lpips")]
    check_reward_inputs(specs, load_prompts(path), "data.train_file", path)
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "p.txt").write_text("a cat\n")  # the same prompts without the folder: refused as before
    with pytest.raises(RewardError, match="ssim needs target_image but no row"):
        check_reward_inputs(specs, load_prompts(tmp_path / "bare" / "p.txt"), "data.train_file", "bare/p.txt")


@pytest.mark.parametrize(
    "text,names,message",
    [
        # an image for a line past the end: the off-by-one of a folder numbered from 0 with one image too many
        (
            "a\nb\nc\n",
            ["0.png", "1.png", "2.png", "3.png"],
            r"3.png: names line 4 of .*p.txt \(numbered from 0\), "
            r"which has 3 lines; remove the image or add its prompt$",
        ),
        (
            "a\n\nc\n",
            ["1.png", "2.png", "3.png"],
            r"2.png: names line 2 of .*p.txt \(numbered from 1, as no image is "
            r"named 0\), which is blank; remove the image or write that line's prompt$",
        ),
        # a line without an image, named with the first of them and a count of the others
        (
            "a\nb\nc\nd\n",
            ["1.png"],
            r"p.txt:2: no target image for this line in .*target_images/ \(looked for 2 with "
            r"any zero padding .*\) \(and 2 more: lines 3, 4\); every line needs one in this layout",
        ),
        (
            "a\nb\n",
            ["1.png", "2.png", "02.jpg"],
            r"target_images/02.jpg and 2.png both have number 2: one image per "
            r"line; keep one$",
        ),
        ("a\n", ["1.png", "notes.txt"], r"target_images/notes.txt: not an image named by its prompt's line number"),
        ("a\n", ["1.png", "cat.png"], r"target_images/cat.png: not an image named by its prompt's line number"),
        ("a\n", [], r"target_images/ beside .*p.txt holds no images; add one per prompt line"),
    ],
    ids=["past-the-end", "blank-line", "missing", "two-for-one-line", "other-suffix", "not-a-number", "empty"],
)
def test_each_problem_is_one_line_naming_the_file_and_the_line(tmp_path, text, names, message):
    path, _ = _layout(tmp_path, text, names)
    with pytest.raises(DataError, match=message) as err:
        load_prompts(path)
    assert "\n" not in str(err.value)


def test_a_sub_folder_and_an_unreadable_image_are_refused(tmp_path):
    path, folder = _layout(tmp_path, "a\nb\n", ["1.png", "2.png"])
    (folder / "3").mkdir()
    with pytest.raises(DataError, match=r"target_images/3: a folder inside target_images/, .*; move it$"):
        load_prompts(path)
    (folder / "3").rmdir()
    (folder / "2.png").write_bytes(b"not a png")
    with pytest.raises(DataError, match=r"p.txt:2: target image .*2.png cannot be read as an image .*; replace the"):
        load_prompts(path)
