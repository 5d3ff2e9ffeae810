"""Training configuration: dataclasses that hold every default and its help text, and their loader.

A run is described by :class:`TrainConfig`, filled from a YAML file and dotted ``key=value``
command-line overrides::

    cfg = load_config("launch/configs/tiny_cpu.yaml", ["max_steps=10", "lora.r=8", "lora=null"])

Unknown keys fail with a close-match suggestion, values are converted to the field's type, and
:meth:`TrainConfig.validate` reports every problem, one line each; a ``Literal[...]`` field's choices
come from its annotation (for the math variants, from the registries in grpo.py and
advantages.py). docs/config_reference.md is generated from the fields' help
(``glm-grpo config-docs``). Command-line tools keep their own defaults (glm_grpo_ds/commands/).

* ``fields.py``: ``ConfigError``, :func:`setting` (a field with its help), the ``Literal`` choice check;
* every section's dataclass (``model``, ``lora``, ``grpo``, ...), each checking its own fields (``problems()``):
  ``model_sections.py`` (model, lora, rollout, decoder, sampling), ``grpo_section.py`` (grpo), ``training_sections.py``
  (rewards, optimizer, batch) and ``run_sections.py`` (data, eval, logging, monitor, hub); ``checks.py``: how a section
  reports problems, and the checks of a decode's settings;
* ``train_config.py``: :class:`TrainConfig` and the rules that tie sections together;
* ``loading.py``: YAML + overrides -> validated :class:`TrainConfig`;
* ``arguments.py``: command lines with overrides anywhere among the options, hints for ``--key value``.
"""

from .arguments import parse_with_overrides
from .fields import ConfigError
from .grpo_section import GRPOConfig
from .loading import apply_override, load_config, to_dict, with_overrides
from .model_sections import DecoderConfig, LoraConfig, ModelConfig, RolloutConfig, SamplingConfig
from .run_sections import TRACKERS, DataConfig, EvalConfig, HubConfig, LoggingConfig, MonitorConfig
from .train_config import TrainConfig
from .training_sections import BatchConfig, OptimizerConfig, RewardSpec
from .yaml_file import parse_scalar

__all__ = [
    "TRACKERS",
    "BatchConfig",
    "ConfigError",
    "DataConfig",
    "DecoderConfig",
    "EvalConfig",
    "GRPOConfig",
    "HubConfig",
    "LoggingConfig",
    "LoraConfig",
    "ModelConfig",
    "MonitorConfig",
    "OptimizerConfig",
    "RewardSpec",
    "RolloutConfig",
    "SamplingConfig",
    "TrainConfig",
    "apply_override",
    "load_config",
    "parse_scalar",
    "parse_with_overrides",
    "to_dict",
    "with_overrides",
]
