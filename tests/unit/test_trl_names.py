"""TRL's GRPOConfig names lead to our keys (glm_grpo_ds/config/trl_names.py): every TRL name in the map is a field
of TRL's own GRPOConfig, every key it names exists here, the docs' table is the map's, and a config written with
TRL's words gets an error naming our key (not the close-looking one that means something else)."""

import dataclasses
import typing
from pathlib import Path

import pytest

from glm_grpo_ds.config import ConfigError, TrainConfig, load_config
from glm_grpo_ds.config.trl_names import TRL_KEYS, TRL_VALUES, trl_table

CONFIG = Path(__file__).resolve().parents[2] / "launch" / "configs" / "tiny_cpu.yaml"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "migrating.md"


def _has_key(cls, dotted: str) -> bool:
    head, _, rest = dotted.partition(".")
    hints = typing.get_type_hints(cls)
    if head not in hints:
        return False
    if not rest:
        return True
    inner = [a for a in (typing.get_args(hints[head]) or (hints[head],)) if dataclasses.is_dataclass(a)]
    return bool(inner) and _has_key(inner[0], rest)


def test_every_trl_name_is_trls_and_every_key_is_ours():
    from trl import GRPOConfig

    trl_fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    assert set(TRL_KEYS) <= trl_fields, set(TRL_KEYS) - trl_fields
    assert {field for field, _ in TRL_VALUES.values()} <= trl_fields
    for trl_name, (ours, _) in TRL_KEYS.items():
        assert _has_key(TrainConfig, ours), (trl_name, ours)
    assert trl_table() in DOCS.read_text(encoding="utf-8"), "docs/migrating.md's TRL table is not the map's"


def test_every_field_of_trls_grpo_config_is_answered():
    """Each of GRPOConfig's own fields (not TrainingArguments') is mapped to our key, is our key's name, or is said
    to have no counterpart, with why: a TRL upgrade that adds one fails here until it is answered."""
    from transformers import TrainingArguments
    from trl import GRPOConfig

    from glm_grpo_ds.config.loading import _config_keys
    from glm_grpo_ds.config.trl_names import TRL_ABSENT

    inherited = {f.name for f in dataclasses.fields(TrainingArguments)}
    own = {f.name for f in dataclasses.fields(GRPOConfig)} - inherited
    ours = {key.rsplit(".", 1)[-1] for key in _config_keys()}
    assert own - set(TRL_KEYS) - set(TRL_ABSENT) - ours == set()
    assert set(TRL_ABSENT) <= own and not set(TRL_ABSENT) & set(TRL_KEYS)


@pytest.mark.parametrize(
    "override, line",
    [
        ("grpo.num_generations=8", "key 'grpo.num_generations'; TRL's num_generations is grpo.group_size"),
        ("num_generations=8", "unknown config key 'num_generations'; TRL's num_generations is grpo.group_size"),
        ("grpo.vllm_importance_sampling_cap=2", "TRL's vllm_importance_sampling_cap is grpo.sampler_correction_max"),
        ("grpo.loss_type=dapo", "TRL's loss_type is grpo.aggregation here: the loss normaliser: TRL's dapo / bnpo = "),
        ("grpo.scale_rewards=batch", "TRL's scale_rewards is grpo.advantage_estimator here"),
        ("grpo.aggregation=dapo", "aggregation 'dapo'; TRL's loss_type 'dapo' is aggregation 'token_mean' here"),
        ("grpo.aggregation=cispo", "TRL's loss_type 'cispo' is grpo.objective 'cispo' (TRL sums it as aggregation "),
        ("grpo.advantage_estimator=false", "TRL's scale_rewards 'false' is advantage_estimator 'none' here"),
        ("learning_rate=1e-5", "TRL's learning_rate is optimizer.lr here"),
        ("use_vllm=true", "TRL's use_vllm has no counterpart here: no vLLM: the rollout samples in the training"),
        ("grpo.min_p=0.1", "TRL's min_p has no counterpart here: the draw takes grpo.sampling.top_k and top_p"),
    ],
)
def test_a_trl_name_gets_an_error_naming_our_key(override, line):
    with pytest.raises(ConfigError) as err:
        load_config(str(CONFIG), [override])
    assert any(line in text for text in str(err.value).splitlines()), str(err.value)
    assert "num_iterations" not in str(err.value)  # the close-looking key that means something else
