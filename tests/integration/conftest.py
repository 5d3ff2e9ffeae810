"""Fixtures of the integration tests (the session-wide tiny model is in tests/conftest.py): the tiny
prompt files with their target images, the learnable tiny world, and one short training run that several
modules read instead of training their own (:func:`short_run`)."""

import pytest
from built_once import built_once  # noqa: E402  (tests/built_once.py)
from launching import FAST, common, run_train  # noqa: E402  (tests/integration/launching.py)


def _dataset(tiny_model_dir, size):
    from glm_grpo_ds.config import DecoderConfig
    from glm_grpo_ds.testing.tiny_data import write_tiny_dataset

    return lambda path: write_tiny_dataset(tiny_model_dir, path, size, size, DecoderConfig(num_inference_steps=2))


@pytest.fixture(scope="session")
def tiny_data(tiny_model_dir, tmp_path_factory):
    """The tiny prompts with 256x256 targets (prompts.jsonl)."""
    return built_once(tmp_path_factory, "tiny_data", _dataset(tiny_model_dir, 256)) / "prompts.jsonl"


@pytest.fixture(scope="session")
def data64(tiny_model_dir, tmp_path_factory):
    """The tiny prompts with 64x64 targets: what the quickest runs (launching.FAST) train on."""
    return built_once(tmp_path_factory, "data64", _dataset(tiny_model_dir, 64)) / "prompts.jsonl"


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory):
    """The learnable tiny world (glm_grpo_ds/testing/world.py write_world, seed 0: model, prompt files, best.json),
    built once for the learning tests (test_world) and the sweep's smoke (test_sweep_seeds): ~12 s. Read-only."""
    from glm_grpo_ds.testing import world

    return built_once(tmp_path_factory, "tiny_world", world.write_world)


@pytest.fixture(scope="session")
def short_run(tiny_model_dir, data64, tmp_path_factory):
    """A real one-step run (1 process, ZeRO-2, LoRA, launching.FAST) with its step-1 checkpoint, metrics,
    logs and final adapter: the bad-input, overwrite and checkpoint-content tests read it (copy it before
    changing anything). Its progress is on, every step-status line printed (status_interval_s=0); stderr
    is kept beside it (:func:`short_run_stderr`). ~12 s on 2 idle cores."""

    def train(out):
        progress = [o for o in FAST if not o.startswith("logging.progress_bar")] + ["logging.status_interval_s=0"]
        proc = run_train(*common(tiny_model_dir, data64, out, "max_steps=1", "save_steps=1", *progress))
        assert proc.returncode == 0, proc.stderr[-3000:]
        out.with_name("short_run.stderr").write_text(proc.stderr)

    return built_once(tmp_path_factory, "short_run", train)


@pytest.fixture(scope="session")
def short_run_stderr(short_run):
    """What :func:`short_run` wrote to stderr (kept beside the run, not in it)."""
    return short_run.with_name("short_run.stderr").read_text()


# The rollout tests' tiny LoRA policy (glm_grpo_ds.testing.tiny.lora_policy: r=4, random lora_B) and processor, one
# per module: a test that changes the policy's weights restores them, a module that needs another policy defines its
# own fixture.
@pytest.fixture(scope="module")
def processor(tiny_model_dir):
    from glm_grpo_ds.model.glm_image import load_processor

    return load_processor(tiny_model_dir)


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    from glm_grpo_ds.testing.tiny import lora_policy

    return lora_policy(tiny_model_dir).eval()
