"""Fixtures of the integration tests (the session-wide tiny model is in tests/conftest.py)."""

import pytest


@pytest.fixture(scope="session")
def tiny_data(tiny_model_dir, tmp_path_factory):
    from glm_grpo_ds.config import DecoderConfig
    from glm_grpo_ds.testing.tiny_data import write_tiny_dataset

    out = tmp_path_factory.mktemp("tiny_data")
    return write_tiny_dataset(tiny_model_dir, out, 256, 256, DecoderConfig(num_inference_steps=2))
