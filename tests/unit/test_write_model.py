"""A full fine-tuning's final_model/ (ds/io.py write_model): written one file at a time, in the layout transformers'
own save_pretrained gives the same weights, and loaded back to the same values. (Under ZeRO-3 on 2 ranks:
tests/integration/test_reference_reset.py and test_checkpoint_resume.py load final_model/ back.)"""

import json

import pytest
import torch
from safetensors import safe_open

from glm_grpo_ds.ds.io import WEIGHTS, WEIGHTS_INDEX, write_model
from glm_grpo_ds.model.policy import is_ar_dir, load_ar
from glm_grpo_ds.testing.tiny import build_tiny_components

BOUND = 200_000  # bytes per file: the tiny AR (about 0.8 MB in fp32) in several files, its embedding alone


@pytest.fixture(scope="module")
def ar():
    return build_tiny_components()["vision_language_encoder"]


def _file_tensors(directory) -> dict[str, dict[str, torch.Tensor]]:
    out = {}
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            out[path.name] = {k: f.get_tensor(k) for k in f.keys()}
    return out


def test_sharded_model_is_what_save_pretrained_writes_and_loads_back_bitwise(ar, tmp_path):
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    write_model(ar, ours, rank=0, zero3=False, shard_bytes=BOUND)
    ar.save_pretrained(theirs, max_shard_size=BOUND)
    files = _file_tensors(ours)
    assert len(files) > 2 and WEIGHTS not in files and is_ar_dir(ours)
    for tensors in files.values():  # each file within the bound, or one larger tensor alone
        size = sum(t.numel() * t.element_size() for t in tensors.values())
        assert size <= BOUND or len(tensors) == 1, (size, list(tensors))
    index, their_index = (json.loads((d / WEIGHTS_INDEX).read_text()) for d in (ours, theirs))
    assert index["metadata"]["total_size"] == their_index["metadata"]["total_size"]
    assert index["weight_map"] == {k: f for f, tensors in files.items() for k in tensors}
    assert set(index["weight_map"]) == set(their_index["weight_map"])
    for name in ("config.json", "generation_config.json"):
        assert json.loads((ours / name).read_text()) == json.loads((theirs / name).read_text()), name
    loaded, want = load_ar(ours, torch.float32).state_dict(), ar.state_dict()
    assert set(loaded) == set(want) and all(torch.equal(loaded[k], want[k]) for k in want)


def test_a_model_within_the_bound_is_one_file_without_an_index(ar, tmp_path):
    write_model(ar, tmp_path, rank=0, zero3=False)  # 2 GiB
    assert list(_file_tensors(tmp_path)) == [WEIGHTS] and not (tmp_path / WEIGHTS_INDEX).exists()


def test_other_ranks_write_nothing(ar, tmp_path):
    write_model(ar, tmp_path, rank=1, zero3=False, shard_bytes=BOUND)
    assert list(tmp_path.iterdir()) == []
