"""Shared fixtures. Tests never touch a model hub: HF_HUB_OFFLINE is forced before any import, and
datasets' Arrow cache goes to a temporary directory (removed at exit), not ~/.cache."""

import atexit
import os
import shutil
import tempfile

os.environ["HF_HUB_OFFLINE"] = "1"
if "HF_DATASETS_CACHE" not in os.environ:
    os.environ["HF_DATASETS_CACHE"] = tempfile.mkdtemp(prefix="glm-grpo-test-datasets-")
    atexit.register(shutil.rmtree, os.environ["HF_DATASETS_CACHE"], ignore_errors=True)
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny GLM-Image pipeline directory (seed 0), built once per test session."""
    from glm_grpo_ds.testing.tiny import build_tiny_pipeline

    return build_tiny_pipeline(tmp_path_factory.mktemp("tiny") / "model", seed=0)
