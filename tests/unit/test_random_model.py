"""``model.path=random:...`` (glm_grpo_ds/model/random_weights.py, glm_grpo_ds/testing/random_model.py): the name
read or refused in one line, a configs-only directory written once per name and reused, the planner reading it as
it reads the slice ``glm-grpo tiny-model --real-width`` writes, and the loaders building seeded weights from it
without touching the caller's random streams."""

import json
import os

import pytest
import torch

from glm_grpo_ds.model import random_weights
from glm_grpo_ds.model.random_weights import MARKER, RandomSpec, parse
from glm_grpo_ds.model.source import ModelSourceError, resolve_model
from glm_grpo_ds.testing.random_model import materialize


@pytest.fixture(autouse=True)
def _own_tmp(tmp_path, monkeypatch):
    """Every test writes its configs under its own temporary directory (TMPDIR), not the machine's shared one."""
    import tempfile

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again


def test_names_read_with_their_defaults_and_options():
    assert parse("random:glm-image") == RandomSpec("glm-image", 40, 30, 0)
    assert parse("random:tiny") == RandomSpec("tiny", 2, 2, 0)
    spec = parse("random:glm-image,ar_layers=8, dit_layers=2,seed=3")
    assert spec == RandomSpec("glm-image", 8, 2, 3)
    assert spec.name == "random:glm-image,ar_layers=8,dit_layers=2,seed=3"
    assert parse(spec.name) == spec  # the recorded name reads back as itself
    assert parse("random:tiny,seed=1").directory() != parse("random:tiny").directory()  # the seed is in the marker


@pytest.mark.parametrize(
    "name, words",
    [
        ("random:glm-imag", "unknown random model 'glm-imag'"),
        ("random:glm-image,ar_layers=x", "cannot read 'ar_layers=x'"),
        ("random:glm-image,layers=4", "cannot read 'layers=4'"),
        ("random:tiny,ar_layers=0", "ar_layers and dit_layers must be at least 1"),
    ],
)
def test_a_bad_name_is_one_line_naming_the_flag_and_the_form(name, words):
    with pytest.raises(ModelSourceError) as err:
        materialize(name, "--model")
    text = str(err.value)
    assert text.startswith(f"--model={name}: {words}") and "random:glm-image (or random:tiny)" in text
    assert "\n" not in text


def test_the_configs_directory_is_written_once_and_resolves_as_a_pipeline(tmp_path):
    with pytest.raises(ModelSourceError, match="is not written"):  # resolving alone never writes
        resolve_model("random:tiny")
    assert materialize("random:tiny") == "random:tiny"
    source = resolve_model("random:tiny")
    assert source.random_weights == "random:tiny,ar_layers=2,dit_layers=2,seed=0"
    assert source.path.parent.parent == tmp_path
    assert source.record()["random_weights"] == source.random_weights
    assert "random weights" in source.describe()
    assert not list(source.path.rglob("*.safetensors")) and not list(source.path.rglob("*.bin"))  # no weights
    marker = source.path / MARKER
    stamp = marker.stat().st_mtime_ns
    materialize("random:tiny")
    assert marker.stat().st_mtime_ns == stamp  # reused, not written again
    # the directory given by its path is still known as random weights (bench hands its workers the path)
    assert resolve_model(str(source.path)).random_weights == source.random_weights
    with pytest.raises(ModelSourceError, match="model.revision=main applies to Hub ids"):
        resolve_model("random:tiny", "main")


def test_a_directory_of_another_format_is_written_again():
    materialize("random:tiny")
    path = parse("random:tiny").directory()
    record = json.loads((path / MARKER).read_text())
    (path / MARKER).write_text(json.dumps({**record, "format": 0}))
    materialize("random:tiny")
    assert json.loads((path / MARKER).read_text())["format"] == random_weights.FORMAT


def test_the_per_user_folder_is_this_users_alone(tmp_path):
    """Its name under the shared TMPDIR is predictable: a folder another user made first (or a link) could hold
    configs of their choosing (other shapes, another class in model_index.json); it is refused, ours is closed."""
    root = parse("random:tiny").directory().parent
    root.mkdir(mode=0o755)
    root.chmod(0o755)
    materialize("random:tiny")
    assert root.stat().st_mode & 0o777 == 0o700  # an earlier version's, open to reading: closed
    elsewhere = tmp_path / "elsewhere"
    root.rename(elsewhere)
    root.symlink_to(elsewhere)
    with pytest.raises(ModelSourceError, match=rf"model.path=random:tiny: {root} is a link or another user's"):
        materialize("random:tiny")
    root.unlink()
    elsewhere.rename(root)
    try:
        os.chown(root, 12345, -1)
    except PermissionError:
        pytest.skip("not allowed to give a folder to another user here (root can)")
    with pytest.raises(ModelSourceError, match=r"another user's \(uid 12345\)"):
        materialize("random:tiny")


def test_the_planner_reads_it_as_the_slice_tiny_model_writes(tmp_path):
    """random:glm-image,ar_layers=2,dit_layers=1 has the parameter counts of ``glm-grpo tiny-model --real-width
    --ar-layers 2 --dit-layers 1`` (its configs, on the meta device)."""
    from glm_grpo_ds.config import load_config
    from glm_grpo_ds.memory.sizes import model_sizes
    from glm_grpo_ds.testing.slice import write_slice_configs

    name = "random:glm-image,ar_layers=2,dit_layers=1"
    materialize(name)
    configs = write_slice_configs(tmp_path / "slice", 2, 1)
    ours, theirs = (
        model_sizes(load_config("launch/configs/gpu_check.yaml", [f"model.path={p}"])) for p in (name, configs)
    )
    assert (sum(ours.ar_base), ours.trainable, ours.decoder) == (sum(theirs.ar_base), theirs.trainable, theirs.decoder)
    assert ours.text["layers"] == 2 and sum(ours.ar_base) > 1e9


def test_the_loaders_build_seeded_weights_and_leave_the_callers_streams_alone():
    from glm_grpo_ds.decoder.image_decoder import load_component
    from glm_grpo_ds.model.policy import load_ar

    materialize("random:tiny")
    materialize("random:tiny,seed=1")
    root, other = parse("random:tiny").directory(), parse("random:tiny,seed=1").directory()
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    a = load_ar(root, torch.float32, "sdpa")
    dit = load_component(root, "transformer", torch.float32, torch.device("cpu"))
    assert torch.equal(torch.rand(3), expected)  # the build drew from its own seeded streams only
    b = load_ar(root, torch.float32, "sdpa")
    c = load_ar(other, torch.float32, "sdpa")
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(pa, pb), name  # same name: the same weights
    assert not all(torch.equal(pa, pc) for pa, pc in zip(a.parameters(), c.parameters()))  # another seed: others
    assert len(a.model.language_model.layers) == 2 and not a.training
    assert a.generation_config.suppress_tokens  # the sampler's codebook mask, as the written pipeline has it
    assert len(dit.transformer_blocks) == 2 and dit.dtype == torch.float32
    glyph = load_component(root, "text_encoder", torch.bfloat16, torch.device("cpu"))
    assert glyph.dtype == torch.bfloat16 and not glyph.training


def test_the_full_size_has_the_real_vision_tower_and_plans_as_the_real_model():
    """random:glm-image built the slice's 1-layer vision tower: 9.01 B AR parameters where GLM-Image has 10.11 B, so
    a cluster measured on it came out ~2 GiB per GPU short of the real model (an audit's estimate-memory)."""
    from glm_grpo_ds.config import load_config
    from glm_grpo_ds.memory.sizes import model_sizes

    for name, depth in (("random:glm-image", 40), ("random:glm-image,ar_layers=2,dit_layers=1", 1)):
        config = json.loads(
            (resolve_model(materialize(name)).path / "vision_language_encoder" / "config.json").read_text()
        )
        assert config["vision_config"]["depth"] == depth, name
    ours, real = (  # an uncached Hub id: the planner's built-in GLM-Image configs
        model_sizes(load_config("launch/configs/gpu_check.yaml", [f"model.path={p}"]))
        for p in ("random:glm-image", "zai-org/GLM-Image")
    )
    assert (sum(ours.ar_base), ours.decoder) == (sum(real.ar_base), real.decoder)
    assert round(sum(ours.ar_base) / 1e9, 2) == 10.11
