"""Unknown config keys (glm_grpo_ds/config/loading.py, config/other_names.py): every one of a config is reported at
once, each with the hint that names the key it most likely means: another trainer's name (the seeds' plan,
OpenRLHF, verl) before a close spelling that would mislead, our key of that name in another section, then
spelling."""

from pathlib import Path

import pytest

from glm_grpo_ds.config import ConfigError, load_config
from glm_grpo_ds.config.loading import _config_keys
from glm_grpo_ds.config.other_names import OTHER_KEYS

CONFIG = Path(__file__).resolve().parents[2] / "launch" / "configs" / "tiny_cpu.yaml"


def _error(tmp_path, text: str, overrides=()) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(str(path), list(overrides))
    return str(err.value)


def test_every_other_name_leads_to_a_key_of_ours_and_is_not_one():
    keys = set(_config_keys())
    leaves = {k.rsplit(".", 1)[-1] for k in keys}
    for name, (ours, _, _) in OTHER_KEYS.items():
        assert ours in keys, (name, ours)
        assert name not in leaves, f"{name} is one of our own keys: a hint for it would never be asked"


@pytest.mark.parametrize(
    "override, expected",
    [
        # the close matches would mislead: kl_coef is not entropy_coef, num_samples is not sampling
        ("grpo.kl_coef=0.1", "unknown config key 'grpo.kl_coef'; kl_coef (the seeds' plan, verl) is grpo.beta here"),
        ("grpo.num_samples=8", "num_samples (the seeds' plan) is grpo.group_size here"),
        ("grpo.clip_range=0.2", "clip_range (the seeds' plan) is grpo.epsilon_low here"),
        ("eps_clip=0.2", "eps_clip (OpenRLHF) is grpo.epsilon_low here"),
        # our key in another section
        ("grpo.lr=1e-5", "unknown config key 'grpo.lr'; it is 'optimizer.lr'"),
        ("weight_decay=0.01", "it is 'optimizer.weight_decay'"),
        # spelling, as before
        ("grpo.betta=0.1", "unknown config key 'grpo.betta'; did you mean 'grpo.beta', 'grpo.delta'?"),
    ],
)
def test_one_unknown_key_names_what_it_means(override, expected):
    with pytest.raises(ConfigError) as err:
        load_config(str(CONFIG), [override])
    assert str(err.value).startswith("unknown config key ") and expected in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


def test_every_unknown_key_of_a_config_at_once(tmp_path):
    text = (
        "grpo:\n  kl_coef: 0.1\n  num_samples: 8\nreward:\n  metrics: []\n"
        "rewards:\n  - {name: ocr, wieght: 1.0}\noptimizer:\n  lr: 1.0e-5\n"
    )
    message = _error(tmp_path, text, ["clip_range=0.2", "grpo.kl_coef=0.2", "optimizer.lr=2e-5"])
    lines = message.splitlines()
    assert lines[0].startswith("5 unknown config keys (config file "), message
    assert [line.split(":", 1)[0] for line in lines[1:]] == [
        "grpo.kl_coef",  # in the file and again as an override: once
        "grpo.num_samples",
        "reward",
        "rewards[0].wieght",
        "clip_range",
    ]
    assert "rewards[0].wieght: did you mean 'rewards[0].weight'?" in lines
    assert lines[3].startswith("reward: reward (the seeds' plan) is rewards here")


def test_a_known_config_loads_and_its_overrides_apply():
    cfg = load_config(str(CONFIG), ["grpo.beta=0.5", "optimizer.lr=2e-5"])
    assert (cfg.grpo.beta, cfg.optimizer.lr) == (0.5, 2e-5)
