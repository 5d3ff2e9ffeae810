"""evaluation/exports.py: a prompt row's field that names an exported file (DPG's ``item_id``, OneIG's ``category``)
must be a plain file name; a path in it (absolute, ``..``, ``a/b``) would write outside the export directory."""

import pytest
import torch

from glm_grpo_ds.data.rows import PromptRow
from glm_grpo_ds.evaluation.exports import EXPORTERS, check_rows

IMAGES = torch.rand(4, 3, 8, 8)


@pytest.mark.parametrize(
    "layout, extra, key",
    [
        ("dpg", {"item_id": "{outside}/victim"}, "item_id"),
        ("dpg", {"item_id": "../victim"}, "item_id"),
        ("oneig", {"category": "../../victim", "id": 7}, "category"),
        ("oneig", {"category": "..", "id": 7}, "category"),
    ],
)
def test_a_field_holding_a_path_is_refused_before_sampling_and_nothing_is_written_outside(tmp_path, layout, extra, key):
    outside, out = tmp_path / "outside", tmp_path / "export"
    outside.mkdir()
    extra = {k: v.format(outside=outside) if isinstance(v, str) else v for k, v in extra.items()}
    rows = [PromptRow(index=3, prompt="a cat", extra=extra)]
    with pytest.raises(ValueError, match=rf"--export {layout}: prompt row 3's '{key}' is .*not a plain file name"):
        check_rows(layout, rows, 4, (8, 8))
    with pytest.raises(ValueError, match="not a plain file name"):
        EXPORTERS.get(layout)(out, "base", rows, IMAGES, 4)
    assert list(outside.iterdir()) == [] and not (tmp_path / "victim").exists()


def test_plain_names_are_written_inside_the_export_directory(tmp_path):
    rows = [PromptRow(index=3, prompt="a cat", extra={"item_id": "cat_17", "category": "Portrait", "id": 7})]
    check_rows("dpg", rows, 4, (8, 8))
    check_rows("oneig", rows, 4, (8, 8))
    assert EXPORTERS.get("dpg")(tmp_path, "base", rows, IMAGES, 4) == [tmp_path / "base" / "cat_17.png"]
    assert EXPORTERS.get("oneig")(tmp_path, "base", rows, IMAGES, 4) == [tmp_path / "human" / "base" / "007.webp"]


def test_a_geneval_row_without_the_fields_its_scorer_reads_is_refused_before_sampling():
    """GenEval's evaluate_images.py reads each metadata.jsonl's tag and include: a row without them was exported (exit
    0) into files its scorer cannot read. An empty include is GenEval's own (no object to find)."""
    with pytest.raises(ValueError, match=r"--export geneval: prompt row 3 has no 'tag' field"):
        check_rows("geneval", [PromptRow(index=3, prompt="a cat", extra={})], 1, (8, 8))
    with pytest.raises(ValueError, match=r"--export geneval: prompt row 3 has no 'include' field"):
        check_rows("geneval", [PromptRow(index=3, prompt="a cat", extra={"tag": "colors"})], 1, (8, 8))
    check_rows("geneval", [PromptRow(index=3, prompt="a cat", extra={"tag": "colors", "include": []})], 1, (8, 8))
