"""Text-rendering benchmarks' own prompt files, as published, read by ``load_prompts`` (what ``glm-grpo evaluate
--prompts`` and training read) into rows whose ``text`` is the list of texts to render, one per region, which the
OCR rewards score region by region: CVTG-2K's ``{"data_list": [...]}`` files (glm_grpo_ds/data/cvtg.py) and
LongText-Bench's ``text_prompts.jsonl``. Each file is written here in the benchmark's exact layout."""

import json

import pytest

from glm_grpo_ds.data import DataError, load_prompts
from glm_grpo_ds.data.cvtg import quoted_spans
from glm_grpo_ds.rewards.ocr import text_regions

# CVTG-2K/CVTG/3.json: fine-grained entries (TextCrafter's eval.py reads index, prompt, carrier_list, sentence_list)
CVTG_FINE = {
    "data_list": [
        {
            "index": 1,
            "prompt": "A retro book cover showing a detective holding a magnifying glass with 'Crime Scene' in bold, "
            "a title at the top that says 'The Mystery' in large italic, and the author name at the bottom with "
            "'Coming Soon' in small regular letters.",
            "carrier_list": ["glass", "title", "name"],
            "sentence_list": [
                "a magnifying glass with 'Crime Scene' in bold.",
                "a title at the top that says 'The Mystery' in large italic.",
                "the author name at the bottom with 'Coming Soon' in small regular letters.",
            ],
        },
        {
            "index": 2,
            "prompt": "A diner at night: the owner's neon sign reads 'Joe's Diner', a chalkboard says 'Pie Today' "
            "and the door shows 'OPEN 24/7'.",
            "carrier_list": ["sign", "chalkboard", "door"],
            "sentence_list": [
                "the owner's neon sign reads 'Joe's Diner'",
                "a chalkboard says 'Pie Today'",
                "the door shows 'OPEN 24/7'.",
            ],
        },
    ]
}

# LongText-Bench (X-Omni textbench/text_prompts.jsonl): one JSON object per line, text = the regions' texts
LONGTEXT = {
    "category": "sign",
    "length": "short",
    "prompt": 'A street with a billboard that reads "FRESH BREWS, EVERY MORNING" and a sign "CENTRAL PARK - 2 BLOCKS".',
    "text": ["FRESH BREWS, EVERY MORNING", "CENTRAL PARK - 2 BLOCKS"],
    "text_length": 8,
    "prompt_id": 0,
}


def test_a_cvtg_file_gives_each_entry_its_regions_texts(tmp_path):
    (tmp_path / "3.json").write_text(json.dumps(CVTG_FINE, indent=4, ensure_ascii=False), encoding="utf-8")
    rows = load_prompts(tmp_path / "3.json", "--prompts")
    assert len(rows) == 2 and rows[0].prompt == CVTG_FINE["data_list"][0]["prompt"]
    assert rows[0].text == ["Crime Scene", "The Mystery", "Coming Soon"]
    assert rows[1].text == ["Joe's Diner", "Pie Today", "OPEN 24/7"]  # apostrophes do not split a region
    assert rows[0].extra == {k: v for k, v in CVTG_FINE["data_list"][0].items() if k != "prompt"}
    sample = rows[1].reward_sample()
    assert text_regions(rows[1].prompt, sample) == ["Joe's Diner", "Pie Today", "OPEN 24/7"]  # what the OCR scores


def test_a_cvtg_combined_file_takes_the_texts_from_the_prompt(tmp_path):
    """``<n>_combined.json``: entries without the fine-grained lists; the quoted spans of the prompt, in order."""
    combined = {"data_list": [{k: e[k] for k in ("index", "prompt")} for e in CVTG_FINE["data_list"]]}
    (tmp_path / "3_combined.json").write_text(json.dumps(combined))
    rows = load_prompts(tmp_path / "3_combined.json", "eval.file")
    assert [r.text for r in rows] == [
        ["Crime Scene", "The Mystery", "Coming Soon"],
        ["Joe's Diner", "Pie Today", "OPEN 24/7"],
    ]
    assert rows[0].extra == {"index": 1}


def test_quoted_spans_keep_order_and_kinds():
    assert quoted_spans("a 'b c' then \"d\" then \u201ce\u201d and 'f'") == ["b c", "d", "e", "f"]
    assert quoted_spans("the chef's hat and the cook's apron") == []  # apostrophes are not quotes
    assert quoted_spans("'' and ' ' and 'x'") == ["x"]


@pytest.mark.parametrize(
    "doc, message",
    [
        ({"data_list": []}, "holds no prompts"),
        ({"data_list": [{"index": 1, "prompt": " "}]}, 'data_list[0] needs a non-empty string field "prompt"'),
        ({"data_list": ["a prompt"]}, 'data_list[0] needs a non-empty string field "prompt"'),
    ],
)
def test_a_bad_cvtg_file_is_one_line(tmp_path, doc, message):
    (tmp_path / "2.json").write_text(json.dumps(doc))
    with pytest.raises(DataError) as err:
        load_prompts(tmp_path / "2.json", "--prompts")
    assert message in str(err.value) and str(tmp_path / "2.json") in str(err.value)
    assert len(str(err.value).splitlines()) == 1


def test_other_json_files_still_go_to_datasets(tmp_path):
    """A JSON array of rows, and JSON lines whose rows have a data_list column, are not CVTG-2K files."""
    (tmp_path / "a.json").write_text(json.dumps([{"prompt": "a cat", "text": "HI"}]))
    assert [(r.prompt, r.text) for r in load_prompts(tmp_path / "a.json")] == [("a cat", "HI")]
    lines = [{"prompt": "a dog", "data_list": [1, 2]}, {"prompt": "a fox", "data_list": [3]}]
    (tmp_path / "l.json").write_text("".join(json.dumps(r) + "\n" for r in lines))
    rows = load_prompts(tmp_path / "l.json")
    assert [r.prompt for r in rows] == ["a dog", "a fox"] and rows[1].extra["data_list"] == [3]


def test_a_longtext_bench_file_loads_as_it_is(tmp_path):
    other = dict(LONGTEXT, prompt_id=1, category="poster", prompt='A poster "SALE"', text=["SALE"])
    (tmp_path / "text_prompts.jsonl").write_text(json.dumps(LONGTEXT) + "\n" + json.dumps(other) + "\n")
    rows = load_prompts(tmp_path / "text_prompts.jsonl", "--prompts")
    assert rows[0].text == LONGTEXT["text"] and rows[1].text == ["SALE"]
    assert rows[0].extra == {"category": "sign", "length": "short", "text_length": 8, "prompt_id": 0}
    assert text_regions(rows[0].prompt, rows[0].reward_sample()) == LONGTEXT["text"]
