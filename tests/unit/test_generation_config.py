"""The sampling knobs a run leaves unset are its model's own (model/glm_image.py ``resolve_sampling``, read from the
AR's generation_config.json); a file that cannot be read is one line naming it, in `train --check` and the run alike
(it was an OSError traceback from transformers)."""

import json

import pytest

from glm_grpo_ds.config import ConfigError, TrainConfig
from glm_grpo_ds.model.glm_image import AR_DIR, PIPELINE_PARTS, resolve_sampling


def _pipeline(tmp_path, generation_config: str):
    for part in PIPELINE_PARTS:
        (tmp_path / part).mkdir(parents=True, exist_ok=True)
    (tmp_path / AR_DIR / "generation_config.json").write_text(generation_config)
    return tmp_path


def test_the_models_own_sampling_fills_what_the_config_leaves_unset(tmp_path):
    model = _pipeline(tmp_path, json.dumps({"temperature": 0.9, "top_p": 0.75}))
    sampling = resolve_sampling(TrainConfig().grpo.sampling, model)
    assert (sampling.temperature, sampling.top_p, sampling.top_k) == (0.9, 0.75, 50)  # top_k: generate()'s default


def test_a_generation_config_that_cannot_be_read_is_one_line_naming_it(tmp_path):
    model = _pipeline(tmp_path, "{not json")
    with pytest.raises(ConfigError, match=r"generation_config.json cannot be read \(.*\); fix it, or remove it") as e:
        resolve_sampling(TrainConfig().grpo.sampling, model)
    assert "\n" not in str(e.value)
