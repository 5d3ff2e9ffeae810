"""Prompt sets read with the ``datasets`` library (parquet, csv, json, save_to_disk directories, Hub
dataset ids from a real Hugging Face cache layout), column mapping, images stored in the dataset as
reward targets, the one-line errors, and the lazily read rows and sampler."""

import hashlib
import json
import logging
import os
import random
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
import torch
from PIL import Image

from glm_grpo_ds.config import DataConfig
from glm_grpo_ds.data import DataError, DatasetImage, PromptOrder, PromptRow, load_prompts
from glm_grpo_ds.rewards import build_reward

ROOT = Path(__file__).resolve().parents[2]
ROWS = [
    {"prompt": "a cat", "target_image": "t.png", "text": "HI", "style": "flat", "n": 1},
    {"prompt": "  a dog ", "n": 2},
    {"prompt": "a sign 'OPEN'", "style": "neon", "n": 3},
]


def _dataset(rows=ROWS) -> datasets.Dataset:
    return datasets.Dataset.from_list([dict(r) for r in rows])


@pytest.fixture
def ref(tmp_path):
    """The .jsonl prompt file, its rows, and the target image it names."""
    Image.new("RGB", (8, 8), (10, 200, 30)).save(tmp_path / "t.png")
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return list(load_prompts(tmp_path / "p.jsonl"))


def _write(kind: str, tmp: Path) -> Path:
    ds = _dataset()
    if kind == "parquet":
        ds.to_parquet(tmp / "p.parquet")
        return tmp / "p.parquet"
    if kind == "csv":
        ds.to_csv(tmp / "p.csv")
        return tmp / "p.csv"
    if kind == "json-array":
        (tmp / "p.json").write_text(json.dumps(ROWS))
        return tmp / "p.json"
    # a save_to_disk directory: its relative target paths start at the directory itself
    moved = _dataset([dict(r, target_image="../t.png") if "target_image" in r else r for r in ROWS])
    if kind == "saved":
        moved.save_to_disk(tmp / "saved")
    else:
        datasets.DatasetDict({"train": moved, "test": moved.select([2])}).save_to_disk(tmp / "saved")
    return tmp / "saved"


@pytest.mark.parametrize("kind", ["parquet", "csv", "json-array", "saved", "saved-dict"])
def test_each_format_gives_the_jsonl_rows(tmp_path, ref, kind):
    path = _write(kind, tmp_path)
    rows = load_prompts(path)
    assert list(rows) == ref and len(rows) == 3
    assert ref[0] == PromptRow(0, "a cat", str((tmp_path / "t.png").resolve()), "HI", {"style": "flat", "n": 1})
    assert ref[1] == PromptRow(1, "a dog", None, None, {"n": 2})  # nulls are absent keys, as in the .jsonl
    assert rows[-1] == ref[2] and list(rows[1:]) == ref[1:]  # indexing and slicing like a list


def test_csv_words_like_na_and_none_are_text_and_only_an_empty_cell_is_missing(tmp_path):
    """pandas reads NA, None, null, nan, N/A as missing by default: a prompt "NA" was an empty-prompt error, a
    text "None" no text at all, a category "NA" the category None."""
    (tmp_path / "p.csv").write_text('prompt,text,category\nNA,None,NA\n"a dog",,x\n')
    rows = load_prompts(tmp_path / "p.csv")
    assert rows[0] == PromptRow(0, "NA", None, "None", {"category": "NA"})
    assert rows[1] == PromptRow(1, "a dog", None, None, {"category": "x"})


def test_datasetdict_split(tmp_path, ref):
    path = _write("saved-dict", tmp_path)
    (row,) = load_prompts(path, split="test")
    assert row == PromptRow(0, "a sign 'OPEN'", None, None, {"style": "neon", "n": 3})
    with pytest.raises(DataError, match=r'^data.train_file .*saved: split "val" not found; set data.split to one '):
        load_prompts(path, split="val")
    with pytest.raises(DataError, match=r'^eval.file .*saved: split "val" not found; set eval.split to one of: train'):
        load_prompts(path, "eval.file", split="val")


def test_column_mapping(tmp_path):
    Image.new("RGB", (8, 8)).save(tmp_path / "t.png")
    cols = {"caption": ["x ", "y"], "img": ["t.png", None], "words": ["HI", None], "prompt": ["not", "this"]}
    datasets.Dataset.from_dict(cols).to_parquet(tmp_path / "p.parquet")
    mapped = DataConfig(prompt_key="caption", target_image_key="img", text_key="words")
    rows = list(load_prompts(tmp_path / "p.parquet", data=mapped))
    target = str((tmp_path / "t.png").resolve())
    assert rows == [
        PromptRow(0, "x", target, "HI", {"prompt": "not"}),
        PromptRow(1, "y", None, None, {"prompt": "this"}),
    ]
    # the same mapping applies to .jsonl keys
    (tmp_path / "p.jsonl").write_text('{"caption": "x", "img": "t.png", "words": "HI", "prompt": "not"}\n')
    assert list(load_prompts(tmp_path / "p.jsonl", data=mapped))[0] == rows[0]
    (tmp_path / "q.jsonl").write_text('{"prompt": "x"}\n')
    with pytest.raises(DataError, match=r'q.jsonl:1: each line needs a non-empty string field "caption"'):
        load_prompts(tmp_path / "q.jsonl", data=mapped)
    # an optional column under a name of the user's own must exist; under its default name it may be absent
    with pytest.raises(
        DataError, match=r'^data.target_image_key "picture" is not a column of .*p.parquet \(columns: cap'
    ):
        load_prompts(tmp_path / "p.parquet", data=DataConfig(prompt_key="caption", target_image_key="picture"))
    assert load_prompts(tmp_path / "p.parquet", data=DataConfig(prompt_key="caption"))[0].target_image is None


def _image_parquet(tmp: Path, image: Image.Image) -> Path:
    """A parquet file holding the image's PNG bytes (a datasets.Image column, as push_to_hub writes it)."""
    image.save(tmp / "t.png")
    cells = [{"bytes": (tmp / "t.png").read_bytes(), "path": None}, None]
    (tmp / "t.png").unlink()  # the parquet file alone holds the image
    feats = datasets.Features({"prompt": datasets.Value("string"), "target_image": datasets.Image()})
    datasets.Dataset.from_dict({"prompt": ["a", "b"], "target_image": cells}, features=feats).to_parquet(
        tmp / "i.parquet"
    )
    return tmp / "i.parquet"


def test_image_column_reaches_the_reward_like_a_path(tmp_path):
    g = torch.Generator().manual_seed(0)
    target = Image.frombytes(
        "RGB", (24, 16), torch.randint(0, 256, (16 * 24 * 3,), generator=g, dtype=torch.uint8).numpy()
    )
    rows = load_prompts(_image_parquet(tmp_path, target))
    assert isinstance(rows[0].target_image, DatasetImage) and rows[1].target_image is None
    target.save(tmp_path / "same.png")
    path_sample = {"target_image": str(tmp_path / "same.png")}
    images = torch.rand(2, 3, 32, 32, generator=g)
    reward = build_reward("pixel_mse", {})
    from_dataset = reward(images, ["a", "b"], [rows[0].reward_sample(), rows[1].reward_sample()])
    from_path = reward(images, ["a", "b"], [path_sample, {"target_image": None}])
    assert torch.isfinite(from_dataset[0]) and torch.isnan(from_dataset[1])
    torch.testing.assert_close(from_dataset, from_path, equal_nan=True)


def _empty_prompt(tmp):
    prompts = [f"p{i}" for i in range(20)]
    prompts[17] = "  "
    datasets.Dataset.from_dict({"prompt": prompts}).to_parquet(tmp / "prompts.parquet")
    return tmp / "prompts.parquet", r'^prompts.parquet: row 17: empty "prompt"; give every row a prompt'


def _null_prompt(tmp):
    (tmp / "prompts.csv").write_text("prompt,n\na,1\n,2\n")
    return tmp / "prompts.csv", r'^prompts.csv: row 1: empty "prompt"'


def _missing_column(tmp):
    (tmp / "prompts.csv").write_text("a,b,c\n1,2,3\n")
    return (
        tmp / "prompts.csv",
        r'^data.prompt_key "prompt" is not a column of prompts.csv \(columns: a, b, c\); set data',
    )


def _missing_target(tmp):
    datasets.Dataset.from_dict({"prompt": ["a", "b"], "target_image": [None, "gone.png"]}).to_parquet(tmp / "p.parquet")
    return tmp / "p.parquet", r"^p.parquet: row 1: target_image gone.png not found at .*gone.png; fix the path \(rel"


def _bad_image_bytes(tmp):
    feats = datasets.Features({"prompt": datasets.Value("string"), "target_image": datasets.Image()})
    cells = [None, {"bytes": b"not an image", "path": None}]
    datasets.Dataset.from_dict({"prompt": ["a", "b"], "target_image": cells}, features=feats).to_parquet(
        tmp / "p.parquet"
    )
    return tmp / "p.parquet", r"^p.parquet: row 1: target_image \(image bytes\) cannot be read as an image"


def _wrong_types(tmp):
    datasets.Dataset.from_dict({"prompt": [1, 2]}).to_parquet(tmp / "p.parquet")
    return tmp / "p.parquet", r'^data.prompt_key "prompt" of p.parquet holds .*int64.*, not text'


def _empty(tmp):
    datasets.Dataset.from_dict(
        {"prompt": []}, features=datasets.Features({"prompt": datasets.Value("string")})
    ).to_parquet(tmp / "p.parquet")
    return tmp / "p.parquet", r'^data.train_file p.parquet holds no prompts; add rows with a "prompt" column'


def _unreadable(tmp):
    (tmp / "p.parquet").write_bytes(b"not parquet")
    return tmp / "p.parquet", r"^data.train_file p.parquet cannot be read as a dataset \(ArrowInvalid: "


def _unknown_suffix(tmp):
    (tmp / "p.tsv").write_text("prompt\na\n")
    return tmp / "p.tsv", r"^data.train_file p.tsv must end in .txt, .jsonl, .parquet, .csv, .json, or be a dataset"


def _several_configs(tmp):
    """A dataset directory (a Hub dataset's layout) of two configs and no default: datasets' own first line was
    "Config name is missing.", naming neither the configs nor a fix."""
    (tmp / "ds").mkdir()
    for name in "ab":
        (tmp / "ds" / f"{name}.jsonl").write_text('{"prompt": "a cat"}\n')
    configs = "".join(f"- config_name: {n}\n  data_files: {n}.jsonl\n" for n in "ab")
    (tmp / "ds" / "README.md").write_text(f"---\nconfigs:\n{configs}---\n")
    return tmp / "ds", r"^data.train_file ds holds several subsets \(configs\); set data.subset to one of \['a', 'b'\]$"


def _folder_without_prompt_files(tmp):
    """A folder holding only a README: datasets' own words named no fix (and in one version, task.toml files)."""
    (tmp / "ds").mkdir()
    (tmp / "ds" / "README.md").write_text("# notes\n")
    return tmp / "ds", r"^data.train_file ds is a folder without prompt files \(.*\); point data.train_file at a prompt"


def _empty_csv(tmp):
    """pandas' `EmptyDataError: No columns to parse from file`, with no fix."""
    (tmp / "p.csv").write_text("")
    return tmp / "p.csv", r'^data.train_file p.csv is empty; add a header with a "prompt" column and rows$'


def test_a_subset_picks_one_config_of_a_dataset_of_several(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path, _ = _several_configs(Path("."))
    (path / "b.jsonl").write_text('{"prompt": "a dog"}\n{"prompt": "a fox"}\n')
    assert [r.prompt for r in load_prompts(str(path), data=DataConfig(subset="b"))] == ["a dog", "a fox"]
    # eval's own subset, whatever data.subset says
    rows = load_prompts(str(path), "eval.file", DataConfig(subset="b"), "train", None, subset="a")
    assert [r.prompt for r in rows] == ["a cat"]
    with pytest.raises(DataError, match=r"^eval.file ds has no subset 'c'; set eval.subset to one of \['a', 'b'\]$"):
        load_prompts(str(path), "eval.file", None, "train", None, subset="c")
    (tmp_path / "p.jsonl").write_text('{"prompt": "a cat"}\n')
    one_file = r"^data.subset b is set but data.train_file p.jsonl is one file, which has no subsets; remove the subset"
    with pytest.raises(DataError, match=one_file):
        load_prompts("p.jsonl", data=DataConfig(subset="b"))


@pytest.mark.parametrize(
    "case",
    [_empty_prompt, _null_prompt, _missing_column, _missing_target, _bad_image_bytes, _wrong_types, _empty, _unreadable]
    + [_unknown_suffix, _several_configs, _folder_without_prompt_files, _empty_csv],
)
def test_errors_are_one_line_with_the_row(tmp_path, monkeypatch, case):
    monkeypatch.chdir(tmp_path)  # relative names, as a user writes them
    path, message = case(Path("."))
    logged = _Records()  # what datasets' own loggers print (its handler, and ours through propagation)
    logging.getLogger("datasets").addHandler(logged)
    try:
        with pytest.raises(DataError, match=message) as err:
            load_prompts(str(path))
    finally:
        logging.getLogger("datasets").removeHandler(logged)
    assert "\n" not in str(err.value)
    # the line is the whole message: datasets' own ERROR log of an unreadable parquet said its reason twice before it
    assert [r.getMessage() for r in logged.records if r.levelno >= logging.ERROR] == []


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        self.records.append(record)


def test_eval_has_its_own_split_and_revision(tmp_path, ref):
    pinned = DataConfig(revision="a" * 40)  # the training set's Hub commit does not apply to a local eval file
    assert list(load_prompts(tmp_path / "p.jsonl", "eval.file", pinned, "test", None)) == ref
    with pytest.raises(DataError, match=r"^data.revision a{40} is set but data.train_file .*p.jsonl is a local path"):
        load_prompts(tmp_path / "p.jsonl", data=pinned)
    with pytest.raises(DataError, match=r"^eval.revision main is set but eval.file .*p.jsonl is a local path"):
        load_prompts(tmp_path / "p.jsonl", "eval.file", DataConfig(), "test", "main")


def test_config_checks_the_keys():
    from glm_grpo_ds.config import ConfigError, load_config

    base = ["model.path=/m", "data.train_file=/d.parquet", "rewards=[{name: pixel_mse}]"]
    with pytest.raises(ConfigError, match=r"must name three different columns"):
        load_config(None, base + ["data.text_key=prompt"])
    cfg = load_config(None, base + ["data.prompt_key=caption", "eval.split=validation", "data.revision=abc123"])
    assert (cfg.data.prompt_key, cfg.data.split, cfg.eval.split, cfg.data.revision) == (
        "caption",
        "train",
        "validation",
        "abc123",
    )


# ---------------------------------------------------------------- the Hub cache
def _hub_repo(cache: Path, repo: str, commit: str, files: dict[str, bytes], main: bool) -> None:
    """Lay files out as huggingface_hub's cache does: blobs/<sha256>, snapshots/<commit>/<path> -> blob
    (relative symlinks), refs/main = the commit."""
    root = cache / f"datasets--{repo.replace('/', '--')}"
    for rel, data in files.items():
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = root / "snapshots" / commit / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    if main:
        (root / "refs").mkdir(exist_ok=True)
        (root / "refs" / "main").write_text(commit)


def _parquet_bytes(tmp: Path, rows) -> bytes:
    _dataset(rows).to_parquet(tmp / "x.parquet")
    return (tmp / "x.parquet").read_bytes()


HUB_SNIPPET = """
import json, sys
from glm_grpo_ds.data import DataError, load_prompts
out = []
for spec, split, revision in json.loads(sys.argv[1]):
    try:
        out.append([[r.index, r.prompt, r.text, r.extra] for r in load_prompts(spec, split=split, revision=revision)])
    except DataError as err:
        out.append(str(err))
print(json.dumps(out))
"""


def _hub_run(tmp: Path, calls, **env) -> list:
    env = dict(os.environ, HF_HUB_CACHE=str(tmp / "hub"), HF_DATASETS_CACHE=str(tmp / "arrow"), **env)
    proc = subprocess.run(
        [sys.executable, "-c", HUB_SNIPPET, json.dumps(calls)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_hub_dataset_id_from_the_cache(tmp_path):
    old, new = "a" * 40, "b" * 40
    no_targets = [{k: v for k, v in r.items() if k != "target_image"} for r in ROWS]
    _hub_repo(
        tmp_path / "hub",
        "acme/prompts",
        old,
        {"data/train-00000-of-00001.parquet": _parquet_bytes(tmp_path, no_targets[:1])},
        main=False,
    )
    files = {
        "README.md": b"---\nlicense: mit\n---\nprompts\n",
        "data/train-00000-of-00001.parquet": _parquet_bytes(tmp_path, no_targets),
        "data/test-00000-of-00001.parquet": _parquet_bytes(tmp_path, no_targets[2:]),
    }
    _hub_repo(tmp_path / "hub", "acme/prompts", new, files, main=True)
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in no_targets))
    expected = [[r.index, r.prompt, r.text, r.extra] for r in load_prompts(tmp_path / "p.jsonl")]
    calls = [
        ["acme/prompts", "train", None],
        ["acme/prompts", "test", None],
        ["acme/prompts", "train", old],  # a pinned commit
        ["acme/prompts", "validation", None],
        ["acme/missing", "train", None],
        ["acme/prompts", "train", "c" * 40],
    ]
    main, test, pinned, no_split, missing, no_rev = _hub_run(tmp_path, calls, HF_HUB_OFFLINE="1")
    assert main == expected and test == [[0, *expected[2][1:]]] and pinned == expected[:1]
    assert (
        no_split == 'data.train_file acme/prompts: split "validation" not found; set data.split to one of: train, test'
    )
    assert missing.startswith(
        "data.train_file acme/missing is neither a file nor a directory, and as a Hub dataset id it is not in the "
        f"Hugging Face cache ({tmp_path / 'hub'}) and HF_HUB_OFFLINE=1 forbids downloading it; fetch it once where "
        "the Hub is reachable (hf download acme/missing --repo-type dataset, same HF_HUB_CACHE)"
    )
    assert (
        f"at revision {'c' * 40} it is not in the Hugging Face cache" in no_rev and f"--revision {'c' * 40}" in no_rev
    )


def test_hf_datasets_offline_alone_keeps_the_hub_out(tmp_path):
    # HF_HUB_OFFLINE=0 and an endpoint nothing listens on: only HF_DATASETS_OFFLINE keeps the call local
    (missing,) = _hub_run(
        tmp_path,
        [["acme/missing", "train", None]],
        HF_HUB_OFFLINE="0",
        HF_DATASETS_OFFLINE="1",
        HF_ENDPOINT="http://127.0.0.1:9",
    )
    assert "not in the Hugging Face cache" in missing and "HF_DATASETS_OFFLINE=1 forbids downloading it" in missing


# ---------------------------------------------------------------- rows on demand, same order as ever
def _old_order(n: int, world: int, per_rank: int, seed: int, steps: int) -> list[list[int]]:
    """The sampler's order as it was when prompt files were read into a list."""
    epoch, position, order, out = 0, 0, list(range(n)), []
    random.Random(seed * 1_000_003).shuffle(order)
    for _ in range(steps):
        picked = []
        while len(picked) < world * per_rank:
            if position >= len(order):
                epoch, position, order = epoch + 1, 0, list(range(n))
                random.Random(seed * 1_000_003 + epoch).shuffle(order)
            take = order[position : position + world * per_rank - len(picked)]
            picked += take
            position += len(take)
        out.append(picked)
    return out


@pytest.mark.parametrize("n,world,per_rank,seed", [(10, 2, 2, 3), (7, 1, 3, 1), (1000, 4, 8, 42)])
def test_sampler_order_is_unchanged(tmp_path, n, world, per_rank, seed):
    datasets.Dataset.from_dict({"prompt": [f"p{i}" for i in range(n)]}).to_parquet(tmp_path / "p.parquet")
    (tmp_path / "p.txt").write_text("".join(f"p{i}\n\n" for i in range(n)))
    for path in (tmp_path / "p.parquet", tmp_path / "p.txt"):
        rows = load_prompts(path)
        samplers = [PromptOrder(rows, world, r, per_rank, seed) for r in range(world)]
        got = [[row.index for s in samplers for row in s.next()] for _ in range(60)]
        old = _old_order(n, world, per_rank, seed, 60)
        # the same order up to the first step where the old one took a prompt twice (a step across an epoch
        # end); from there the sampler defers that prompt to the next step, so no step repeats one
        first_repeat = next((i for i, step in enumerate(old) if len(set(step)) < len(step)), len(old))
        assert got[:first_repeat] == old[:first_repeat]
        assert all(len(set(step)) == len(step) for step in got)
        assert all(rows[i].prompt == f"p{i}" for i in got[-1])
        resumed = PromptOrder(rows, world, 0, per_rank, seed)
        resumed.load_state(samplers[0].state())
        assert [r.index for r in resumed.next()] == [r.index for r in samplers[0].next()]


def test_a_txt_line_ends_at_a_newline_only(tmp_path):
    # str.splitlines also ends lines at a lone \\r, \\v, a form feed, \\x1c-\\x1e, \\x85, U+2028 and U+2029: a line
    # holding one was several prompts (and an editor's line numbers no longer named the rows); only \\n and \\r\\n do
    inside = "b\rc\x0bd\x0ce\x1cf\x1dg\x1eh\x85i\u2028j\u2029k"
    text = f"a\r\n{inside}\n\n  \nf é\n"
    (tmp_path / "p.txt").write_bytes(text.encode("utf-8"))
    rows = load_prompts(tmp_path / "p.txt")
    assert [r.prompt for r in rows] == ["a", inside, "f é"]
    assert [r.index for r in rows] == list(range(3))
    # a .jsonl's lines end at \n only (JSON Lines): U+2028 in a string is JSON, written raw by ensure_ascii=False
    objects = [{"prompt": "two\u2028lines"}, {"prompt": "b"}]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(o, ensure_ascii=False) + "\r\n" for o in objects))
    assert [r.prompt for r in load_prompts(tmp_path / "p.jsonl")] == ["two\u2028lines", "b"]
    (tmp_path / "p.jsonl").write_bytes(b'{"prompt": "x"}\n\n\xff\n')
    with pytest.raises(DataError, match=r"p.jsonl:3: not UTF-8 text"):
        load_prompts(tmp_path / "p.jsonl")
    (tmp_path / "p.jsonl").write_text('{"prompt": "x"}\n\n{"prompt": broken}\n')
    with pytest.raises(DataError, match=r"p.jsonl:3: not valid JSON"):
        load_prompts(tmp_path / "p.jsonl")


def test_a_byte_order_mark_is_not_part_of_the_first_prompt(tmp_path):
    """Windows editors start UTF-8 files with U+FEFF: it was the first prompt's first character (.txt), a JSON error
    (.jsonl), and a CVTG-2K file read as a table with one column data_list."""
    bom = b"\xef\xbb\xbf"
    (tmp_path / "p.txt").write_bytes(bom + b"a red cube\nb\n")
    assert [r.prompt for r in load_prompts(tmp_path / "p.txt")] == ["a red cube", "b"]
    (tmp_path / "p.jsonl").write_bytes(bom + b'{"prompt": "a red cube"}\n')
    assert [r.prompt for r in load_prompts(tmp_path / "p.jsonl")] == ["a red cube"]
    (tmp_path / "only.txt").write_bytes(bom + b"\n")
    with pytest.raises(DataError, match="holds no prompts"):
        load_prompts(tmp_path / "only.txt")
    doc = {"data_list": [{"index": 7, "prompt": "a sign", "text": "OPEN"}]}
    (tmp_path / "c.json").write_bytes(bom + json.dumps(doc).encode())
    assert [(r.prompt, r.text) for r in load_prompts(tmp_path / "c.json")] == [("a sign", "OPEN")]
    (tmp_path / "p.txt").write_text("one\ntwo\n")
    rows = load_prompts(tmp_path / "p.txt")
    (tmp_path / "p.txt").write_text("one\nthree, longer\n")
    with pytest.raises(DataError, match=r"p.txt changed while the run was reading it; restore it, or restart"):
        rows[1]


# ---------------------------------------------------------------- several ranks
RANK_SNIPPET = """
import datetime, json, os, sys, time
import torch
from glm_grpo_ds.data import load_prompts
from glm_grpo_ds.ds.dist import in_rank_order

rank, tmp = int(os.environ["RANK"]), sys.argv[1]
# a process group timeout shorter than rank 0's turn: the waiting ranks must not wait on this group. Set once the
# ranks have met: init_process_group's is also how long they wait for each other to arrive (imports seconds apart)
torch.distributed.init_process_group("gloo", rank=rank, world_size=3)
short = datetime.timedelta(seconds=3)
set_timeout = getattr(torch.distributed, "set_timeout", None)  # torch >= 2.12; before, the private one
set_timeout(short) if set_timeout else torch.distributed.distributed_c10d._set_pg_timeout(short)
local_rank = [0, 1, 0][rank]  # ranks 0, 1 on node 0; rank 2 on node 1


def prepare(log, fail):
    with open(log, "a") as f:
        f.write(f"{rank} start\\n")
    time.sleep(5 if rank == 0 and not fail else 0.5)  # e.g. a download
    if rank == 0 and fail:
        raise ValueError("rank 0 failed")
    with open(log, "a") as f:
        f.write(f"{rank} end\\n")
    return rank


out = [in_rank_order(lambda: prepare(tmp + "/ok.log", False), rank, local_rank, "ok")]
try:
    in_rank_order(lambda: prepare(tmp + "/fail.log", True), rank, local_rank, "fail", ValueError)
    out.append("no error")
except ValueError as err:
    out.append(str(err))
out.append([r.prompt for r in load_prompts(tmp + "/p.parquet", rank=rank, local_rank=local_rank)])
print(json.dumps(out))
torch.distributed.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.distributed
def test_rank_zero_prepares_first_then_each_node_and_a_failure_stops_every_rank(tmp_path):
    from glm_grpo_ds.runtime.ports import free_port

    datasets.Dataset.from_dict({"prompt": [f"p{i}" for i in range(50)]}).to_parquet(tmp_path / "p.parquet")
    port = free_port()
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), HF_DATASETS_CACHE=str(tmp_path / "arrow"))
    cmd = [sys.executable, "-c", RANK_SNIPPET, str(tmp_path)]
    procs = [
        subprocess.Popen(cmd, env=dict(env, RANK=str(r)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for r in range(3)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    # global rank 0 alone, then the other node's local rank 0, then the rest: never two at once
    later = ["2 start", "2 end", "1 start", "1 end"]
    assert (tmp_path / "ok.log").read_text().splitlines() == ["0 start", "0 end", *later]
    assert (tmp_path / "fail.log").read_text().splitlines() == ["0 start", *later]
    # nobody hung, and nobody went on alone: every rank stops, naming the rank that failed and its line
    told = "fail: rank 0 failed, so every rank stops: rank 0 failed"
    assert [r[:2] for r in results] == [[0, "rank 0 failed"], [1, told], [2, told]]
    assert all(r[2] == [f"p{i}" for i in range(50)] for r in results)  # one Arrow cache, built once, read by all
