"""Prompt sources that lost rows, columns or a cause without a word: a folder of data files that datasets reads only
part of, a renamed optional .jsonl key no line has, a column under a name the rewards get from the row, a blank CSV
line, data.split on a source of one split, and two errors whose cause was cut off."""

import json
from pathlib import Path

import datasets
import pytest

from glm_grpo_ds.config import DataConfig, load_config
from glm_grpo_ds.config.notes import unused_settings
from glm_grpo_ds.data import DataError, PromptRow, load_prompts

BASE = ["model.path=/m", "rewards=[{name: pixel_mse}]"]


def _jsonl(path: Path, *prompts: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))


def _parquet(path: Path, *prompts: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    datasets.Dataset.from_dict({"prompt": list(prompts)}).to_parquet(path)


def _names(rows) -> list[str]:
    return sorted(r.prompt for r in rows)


def test_a_folder_of_several_formats_is_refused_naming_the_files_left_out(tmp_path, monkeypatch):
    """datasets reads the most common format of a folder: the .jsonl (and a .txt beside a .jsonl) was dropped."""
    monkeypatch.chdir(tmp_path)
    _jsonl(Path("ds/a.jsonl"), "a cat")
    _parquet(Path("ds/b0.parquet"), "b0")
    _parquet(Path("ds/b1.parquet"), "b1")
    with pytest.raises(DataError, match=r"^data.train_file ds mixes file formats and datasets reads only its parquet "):
        load_prompts("ds")
    with pytest.raises(DataError, match=r"leaving out a.jsonl; keep one format per folder \(convert or move the oth"):
        load_prompts("ds")
    _jsonl(Path("mixed/b.jsonl"), "b")
    Path("mixed/a.txt").write_text("a\n")
    with pytest.raises(DataError, match=r"^data.train_file mixed mixes file formats .* leaving out a.txt; keep one "):
        load_prompts("mixed")
    # one format, nested folders, a README and hidden files are one data set, read whole
    _jsonl(Path("one/a.jsonl"), "a")
    _jsonl(Path("one/more/b.jsonl"), "b")
    Path("one/README.md").write_text("# prompts\n")
    _jsonl(Path("one/.cache/x.jsonl"), "x")
    assert _names(load_prompts("one")) == ["a", "b"]


def test_a_folder_whose_names_name_splits_must_give_every_file_one(tmp_path, monkeypatch):
    """x_test.jsonl names the split "test": datasets then reads the files that name a split, a.jsonl none (it
    said 'split "train" not found; set data.split to one of: test', and with data.split=test a.jsonl was gone)."""
    monkeypatch.chdir(tmp_path)
    _jsonl(Path("ds/a.jsonl"), "a cat")
    _jsonl(Path("ds/x_test.jsonl"), "held out")
    message = r"^data.train_file ds: datasets splits this folder by file names \(x_test.jsonl \(test\)\) and leaves "
    for split in ("train", "test"):
        with pytest.raises(DataError, match=message + r"out a.jsonl, which name no split; name every file by its spl"):
            load_prompts("ds", split=split)
    with pytest.raises(DataError, match=r"test-0.jsonl; eval.split picks one\) or rename the others$"):
        load_prompts("ds", "eval.file", split="test")
    # the Hub layout: every file names its split, and a split chooses among them
    for split in ("train", "test"):
        _parquet(Path(f"hub/data/{split}-00000-of-00001.parquet"), f"{split} 0")
        _parquet(Path(f"hub/data/{split}-00001-of-00001.parquet"), f"{split} 1")
    assert _names(load_prompts("hub")) == ["train 0", "train 1"]
    assert _names(load_prompts("hub", split="test")) == ["test 0", "test 1"]
    Path("ds/a.jsonl").rename("ds/a_train.jsonl")
    assert _names(load_prompts("ds")) == ["a cat"]


def test_a_folder_whose_files_have_other_columns_says_which(tmp_path, monkeypatch):
    """It said only `(CastError: Couldn't cast)`, leaving out datasets' 'because column names don't match'."""
    monkeypatch.chdir(tmp_path)
    Path("ds").mkdir()
    Path("ds/a.jsonl").write_text('{"prompt": "a", "n": 1}\n')
    Path("ds/b.jsonl").write_text('{"prompt": "b", "style": "flat"}\n')
    with pytest.raises(DataError) as err:
        load_prompts("ds")
    assert str(err.value) == (
        "data.train_file ds cannot be read as a dataset (CastError: column names don't match: style not in every "
        "file); give its files the same columns"
    )


def test_a_json_prompt_that_is_not_text_is_named_by_its_row(tmp_path, monkeypatch):
    """A number among the prompts makes datasets read the column as JSON values: the message said the column held
    Json(decode=True) and to pick the prompt column, which was the right one."""
    monkeypatch.chdir(tmp_path)
    Path("p.json").write_text(json.dumps([{"prompt": "a cat"}, {"prompt": "a dog"}, {"prompt": 5}]))
    with pytest.raises(DataError) as err:
        load_prompts("p.json")
    assert str(err.value) == 'p.json: row 2: "prompt" is 5, not text; quote it or drop the row'
    Path("p.json").write_text(json.dumps([{"prompt": "a cat"}, {"prompt": ["a", "list"]}]))
    with pytest.raises(DataError, match=r'^p.json: row 1: "prompt" is \["a", "list"\], not text; quote it or drop'):
        load_prompts("p.json")


def test_a_text_column_of_strings_and_lists_reaches_the_rewards_decoded(tmp_path, monkeypatch):
    """Strings and lists of them (one per text region, as in a .jsonl) make datasets read the column as JSON values:
    each row's text reached ocr as JSON text ('"OPEN"', quotes and all)."""
    monkeypatch.chdir(tmp_path)
    Path("p.json").write_text(json.dumps([{"prompt": "a", "text": "OPEN"}, {"prompt": "b", "text": ["X", "Y"]}]))
    assert [r.text for r in load_prompts("p.json")] == ["OPEN", ["X", "Y"]]


def test_a_renamed_jsonl_key_that_no_line_has_is_refused(tmp_path, monkeypatch):
    """As a CSV column of that name is: a typo in data.text_key scored the OCR rewards against no text."""
    monkeypatch.chdir(tmp_path)
    Path("p.jsonl").write_text('{"prompt": "a sign", "label": "OPEN"}\n{"prompt": "b", "img": "t.png"}\n')
    with pytest.raises(DataError) as err:
        load_prompts("p.jsonl", data=DataConfig(text_key="lable"))
    assert str(err.value) == (
        'data.text_key "lable" is not a key of any line of p.jsonl (keys: img, label, prompt); set data.text_key to '
        "the right one"
    )
    with pytest.raises(DataError, match=r'^data.target_image_key "image" is not a key of any line of p.jsonl \(keys'):
        load_prompts("p.jsonl", data=DataConfig(target_image_key="image"))
    # on one line is enough (an optional key), and under its default name none needs it
    assert [r.text for r in load_prompts("p.jsonl", data=DataConfig(text_key="label"))] == ["OPEN", None]
    assert [r.text for r in load_prompts("p.jsonl")] == [None, None]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "csv"])
def test_a_column_the_rewards_get_from_the_row_is_refused(tmp_path, monkeypatch, fmt):
    """reward_sample sets index, text and target_image: a column of one of those names was overwritten before the
    rewards saw it (index always; text and target_image when data.text_key / target_image_key name another)."""
    monkeypatch.chdir(tmp_path)

    def write(row: dict) -> str:
        if fmt == "jsonl":
            Path("p.jsonl").write_text(json.dumps(row) + "\n")
        else:
            getattr(datasets.Dataset.from_list([row]), f"to_{fmt}")(f"p.{fmt}")
        return f"p.{fmt}"

    where = "key" if fmt == "jsonl" else "column"
    path = write({"prompt": "a", "index": 7})
    with pytest.raises(DataError) as err:
        load_prompts(path)
    assert (
        str(err.value)
        == f'p.{fmt}: {where} "index" is reserved (the rewards get the row number under that name); rename it'
    )
    path = write({"prompt": "a", "text": "OPEN", "words": "SHUT"})
    with pytest.raises(DataError) as err:
        load_prompts(path, data=DataConfig(text_key="words"))
    assert str(err.value) == (
        f'p.{fmt}: {where} "text" is reserved (the rewards get data.text_key "words" under that name); rename it, or '
        "set data.text_key=text if it is the one"
    )
    path = write({"prompt": "a", "target_image": "t.png", "img": None})
    with pytest.raises(DataError, match=rf'^p.{fmt}: {where} "target_image" is reserved \(the rewards get data.target'):
        load_prompts(path, data=DataConfig(target_image_key="img"))
    # under the key that reads it, or a column named prompt beside another prompt_key: not reserved
    path = write({"caption": "a", "text": "OPEN", "prompt": "p"})
    assert load_prompts(path, data=DataConfig(prompt_key="caption"))[0] == PromptRow(
        0, "a", None, "OPEN", {"prompt": "p"}
    )


def test_a_blank_csv_line_is_an_empty_prompt_with_one_column_as_with_two(tmp_path, monkeypatch):
    """pandas skips blank lines: in a one-column CSV a blank or whitespace-only row vanished (shifting the row
    numbers after it), while with two columns the same empty prompt was refused."""
    monkeypatch.chdir(tmp_path)
    for text, row in (("prompt\na\n\nb\n", 1), ("prompt\r\na\r\nb\r\n   \r\n", 2), ("prompt,n\na,1\n\nb,2\n", 1)):
        Path("p.csv").write_text(text, newline="")
        with pytest.raises(DataError) as err:
            load_prompts("p.csv")
        assert str(err.value) == f'p.csv: row {row}: empty "prompt"; give every row a prompt or drop the row'
    Path("p.csv").write_text("prompt\na\nb\n")  # the file's last newline ends its last row
    assert [r.prompt for r in load_prompts("p.csv")] == ["a", "b"]
    Path("p.csv").write_text("\n  \nprompt\na\n")  # blank lines before the header are no rows (it is still the header)
    assert [r.prompt for r in load_prompts("p.csv")] == ["a"]


@pytest.mark.parametrize("name", ["p.txt", "p.jsonl", "p.parquet", "p.csv", "p.json"])
def test_a_split_of_one_file_is_said(tmp_path, name):
    """Only .txt and .jsonl were said; a .parquet / .csv / .json is one split too and data.split was ignored."""
    cfg = load_config(None, [*BASE, f"data.train_file={tmp_path / name}", "data.split=validation"])
    assert f"data.split=validation on one .{name.split('.')[1]} file, which has no splits" in unused_settings(cfg)
    cfg = load_config(
        None, [*BASE, f"data.train_file={tmp_path / name}", f"eval.file={tmp_path / name}", "eval.split=validation"]
    )
    assert f"eval.split=validation on one .{name.split('.')[1]} file, which has no splits" in unused_settings(cfg)


def test_a_split_of_a_saved_dataset_is_said_and_of_a_saved_dataset_dict_is_not(tmp_path):
    ds = datasets.Dataset.from_dict({"prompt": ["a"]})
    ds.save_to_disk(tmp_path / "one")
    datasets.DatasetDict({"validation": ds}).save_to_disk(tmp_path / "dict")
    said = unused_settings(load_config(None, [*BASE, f"data.train_file={tmp_path / 'one'}", "data.split=validation"]))
    assert said == [
        f"data.split=validation on {tmp_path / 'one'}, a saved Dataset (not a DatasetDict), which has no splits"
    ]
    assert (
        unused_settings(load_config(None, [*BASE, f"data.train_file={tmp_path / 'dict'}", "data.split=validation"]))
        == []
    )
