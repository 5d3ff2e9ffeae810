"""Config: YAML + dotted overrides into the dataclasses, type conversion, one line per problem."""

import pytest

from glm_grpo_ds.config import ConfigError, TrainConfig, load_config

BASE = ["model.path=/m", "data.train_file=/d.jsonl", "rewards=[{name: pixel_mse}]"]


def test_yaml_and_overrides(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(
        "model: {path: /models/glm}\ndata: {train_file: p.txt}\nrewards: [{name: pixel_mse, weight: 2}]\n"
        "grpo: {group_size: 4, sampling: {temperature: 0.9}}\nbatch: {prompts_per_rank: 2, micro_batch_size: 2}\n"
    )
    cfg = load_config(str(cfg_file), ["optimizer.lr=1e-4", "grpo.beta=0", "lora.r=8", "max_steps=3", "decoder.fixed_seeds=true"])
    assert cfg.model.path == "/models/glm" and cfg.grpo.group_size == 4 and cfg.grpo.sampling.temperature == 0.9
    assert cfg.optimizer.lr == 1e-4 and isinstance(cfg.optimizer.lr, float)  # "1e-4" is a string to PyYAML
    assert cfg.grpo.beta == 0.0 and cfg.lora.r == 8 and cfg.max_steps == 3 and cfg.decoder.fixed_seeds is True
    assert cfg.rewards[0].name == "pixel_mse" and cfg.rewards[0].weight == 2.0
    assert cfg.sequences_per_rank == 8


def test_lora_null_is_full_finetuning_and_back():
    assert load_config(None, BASE + ["lora=null"]).lora is None
    cfg = load_config(None, BASE + ["lora=null", "lora.r=4"])
    assert cfg.lora is not None and cfg.lora.r == 4 and cfg.lora.alpha == TrainConfig().lora.alpha


def test_unknown_key_suggests_close_match():
    with pytest.raises(ConfigError, match=r"unknown config key 'grpo\.betta'; did you mean 'grpo\.beta'\?"):
        load_config(None, BASE + ["grpo.betta=0.1"])
    with pytest.raises(ConfigError, match="did you mean 'optimizer'"):
        load_config(None, BASE + ["optimiser.lr=1"])


def test_type_errors_name_the_key():
    with pytest.raises(ConfigError, match="grpo.group_size must be an integer"):
        load_config(None, BASE + ["grpo.group_size=many"])
    with pytest.raises(ConfigError, match="model.gradient_checkpointing must be true or false"):
        load_config(None, BASE + ["model.gradient_checkpointing=maybe"])


def test_validation_reports_every_problem_one_line_each():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["grpo.group_size=8", "batch.micro_batch_size=3", "rollout.height=100", "optimizer.name=sgd"])
    lines = str(err.value).splitlines()
    assert any(line.startswith("model.path is required") for line in lines)
    assert any(line.startswith("data.train_file is required") for line in lines)
    assert any("batch.micro_batch_size=3 must divide" in line for line in lines)
    assert any(line.startswith("rollout.height=100 must be a positive multiple of 32") for line in lines)
    assert any(line.startswith("optimizer.name must be") for line in lines)
    assert any(line.startswith("rewards: at least one reward") for line in lines)


def test_bad_yaml_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  path: [unclosed\n")
    with pytest.raises(ConfigError, match=r"bad.yaml line \d+, column \d+ is not valid YAML"):
        load_config(str(bad))
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError, match="key=value"):
        load_config(None, ["grpo.beta"])
