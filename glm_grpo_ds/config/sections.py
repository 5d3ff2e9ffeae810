"""The sections of a training config (``model``, ``lora``, ``grpo``, ``optimizer``, ...), gathered in one place:
every default and every help text lives in the dataclasses of the modules below, once, and each section checks
its own fields (``problems()``); docs/config_reference.md is generated from them.

* ``model_sections.py``: what is loaded and how it samples: ``model``, ``lora``, ``rollout``, ``decoder``,
  ``grpo.sampling``;
* ``training_sections.py``: the objective and its optimisation: ``grpo``, ``rewards``, ``optimizer``, ``batch``;
* ``run_sections.py``: a run's inputs and outputs: ``data``, ``eval``, ``logging``, ``monitor``, ``hub``;
* ``checks.py``: how a section reports problems, and the checks of a decode's settings.

The rules that tie sections together are TrainConfig.validate's (train_config.py).
"""

from __future__ import annotations

from .checks import decode_problems, guided_steps, raise_problems
from .model_sections import DecoderConfig, LoraConfig, ModelConfig, RolloutConfig, SamplingConfig
from .run_sections import (
    DEFAULT_ALARMS,
    REPORT_TO,
    TRACKER_PIP,
    TRACKERS,
    DataConfig,
    EvalConfig,
    HubConfig,
    LoggingConfig,
    MonitorConfig,
    tracker_installed,
)
from .training_sections import BatchConfig, GRPOConfig, OptimizerConfig, RewardSpec

__all__ = [
    "DEFAULT_ALARMS",
    "REPORT_TO",
    "TRACKERS",
    "TRACKER_PIP",
    "BatchConfig",
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
    "decode_problems",
    "guided_steps",
    "raise_problems",
    "tracker_installed",
]
