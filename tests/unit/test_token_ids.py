"""Every token id a prompt can produce has a row in the AR's embedding (glm_grpo_ds/model/token_ids.py), and
the tiny world's vocabulary lists each token once (issue #27: "a red square on a blue background"
crashed training and render with a raw IndexError)."""

import json
import shutil

import pytest

from glm_grpo_ds.data.rows import DataError
from glm_grpo_ds.model.token_ids import check_token_ids
from glm_grpo_ds.testing.tiny import build_processor, build_tokenizer, tiny_vocab
from glm_grpo_ds.testing.world import WORLD_WORDS

PROMPT = "a red square on a blue background"  # a colour_layout prompt of docs/rewards.md


def test_the_world_vocabulary_has_one_id_per_token_and_every_prompt_id_fits():
    vocab = tiny_vocab(WORLD_WORDS)  # the AR's embedding has len(vocab) rows (tiny.build_tiny_components)
    assert sorted(vocab.values()) == list(range(len(vocab)))
    ids = build_tokenizer(WORLD_WORDS)(PROMPT)["input_ids"]
    assert max(ids) < len(vocab)
    assert vocab["a"] in ids and vocab["background"] in ids  # whole-word tokens, not [UNK]
    check_token_ids(build_processor(WORLD_WORDS), len(vocab), "world", [PROMPT], "data.train_file", 64, 64)


def test_a_prompt_past_the_embedding_is_one_line_naming_its_row():
    processor = build_processor(WORLD_WORDS)
    rows = tiny_vocab(WORLD_WORDS)["square"]  # an AR that lacks "square" and every word after it
    prompts = ["a red cube", PROMPT]
    with pytest.raises(DataError) as err:
        check_token_ids(processor, rows, "outputs/m", prompts, "data.train_file", 64, 64)
    msg = str(err.value)
    assert msg.startswith("data.train_file row 1: prompt token 'square'") and "\n" not in msg
    assert "outputs/m" in msg and f"{rows} rows" in msg


def test_a_chat_template_token_past_the_embedding_is_named():
    from glm_grpo_ds.model.prompt_layout import build_prompt_inputs

    processor = build_processor()
    rows = int(build_prompt_inputs(processor, [""], 64, 64)["input_ids"].max())  # the template's last id is out
    with pytest.raises(DataError, match="^model.path: the chat template's token"):
        check_token_ids(processor, rows, "outputs/m", ["a red cube"], "data.train_file", 64, 64)


def test_render_refuses_a_mismatched_tokenizer_before_loading_weights(tiny_model_dir, tmp_path, capsys):
    from glm_grpo_ds.commands import render

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    config_file = model / "vision_language_encoder" / "config.json"
    config = json.loads(config_file.read_text())
    config["text_config"]["vocab_size"] = build_processor().tokenizer.convert_tokens_to_ids("r")
    config_file.write_text(json.dumps(config))
    out = tmp_path / "png"
    assert render.main(["--model", str(model), "--prompt", "abc", "--prompt", "a red cube", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    # the tiny tokenizer's newline (in the chat template) is its last id, so the template is named first
    assert err.startswith("glm-grpo render: model.path: the chat template's token") and "\n" not in err
    assert not out.exists()
