"""glm-grpo wheelhouse's offline parts: the target's platform tags, the freeze file, the placeholders
that stand for the target's packages, pip's two ways of saying a distribution is missing, and the
refusals that come before any download (the real bundle: tests/install/test_wheelhouse.py)."""

import zipfile

import pytest

from glm_grpo_ds.commands.wheelhouse import main
from glm_grpo_ds.install.pip_runs import BundleError, Target, Unresolved, placeholder_wheels, platform_tags, read_freeze


def test_a_manylinux_tag_brings_every_older_one_pip_would_otherwise_miss():
    tags = platform_tags("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64" and tags.index("manylinux_2_17_x86_64") > 0
    assert {"manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "manylinux_2_5_x86_64"} <= set(tags)
    assert "manylinux_2_29_x86_64" not in tags and len(tags) == len(set(tags))
    assert platform_tags("manylinux2014_aarch64")[0] == "manylinux_2_17_aarch64"
    assert "manylinux2010_aarch64" in platform_tags("manylinux2014_aarch64")
    assert platform_tags("musllinux_1_2_x86_64") == [
        "musllinux_1_2_x86_64",
        "musllinux_1_1_x86_64",
        "musllinux_1_0_x86_64",
    ]
    assert platform_tags("macosx_14_0_arm64") == ["macosx_14_0_arm64"]


def test_target_flags_are_wheels_only_and_another_python_is_cpython():
    assert Target().pip_flags() == ["--only-binary=:all:"] and Target().is_here
    flags = Target("3.12", "manylinux_2_28_x86_64").pip_flags()
    assert flags[:3] == ["--only-binary=:all:", "--python-version", "3.12"] and flags[-2:] == ["--implementation", "cp"]
    assert flags.count("--platform") == len(platform_tags("manylinux_2_28_x86_64"))


def test_the_freeze_file_gives_pins_and_refuses_a_line_without_a_version(tmp_path):
    freeze = tmp_path / "freeze.txt"
    freeze.write_text(
        "# a comment\nTorch==2.11.0+cu130\n\n-e git+https://example.invalid/x#egg=x\nnvidia_nccl_cu13==2.28.9\n"
    )
    assert read_freeze(freeze) == {"torch": "2.11.0+cu130", "nvidia-nccl-cu13": "2.28.9"}
    freeze.write_text("numpy==2.0\nfoo @ file:///tmp/foo-1.0-py3-none-any.whl\n")
    with pytest.raises(BundleError, match=r"freeze.txt:2: .*foo @ .*pip list --format=freeze"):
        read_freeze(freeze)


def test_a_placeholder_is_a_valid_wheel_of_that_name_and_version(tmp_path):
    placeholder_wheels({"torch": "2.11.0+cu130", "nvidia-nccl-cu13": "2.28.9"}, tmp_path)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["nvidia_nccl_cu13-2.28.9-py3-none-any.whl", "torch-2.11.0+cu130-py3-none-any.whl"]
    with zipfile.ZipFile(tmp_path / names[1]) as wheel:
        metadata = wheel.read("torch-2.11.0+cu130.dist-info/METADATA").decode()
        assert "Name: torch\nVersion: 2.11.0+cu130\n" in metadata
        assert "torch-2.11.0+cu130.dist-info/RECORD,," in wheel.read("torch-2.11.0+cu130.dist-info/RECORD").decode()


def test_pips_missing_distribution_is_named_in_both_of_its_wordings():
    plain = Unresolved(
        "ERROR: Could not find a version that satisfies the requirement hjson (from deepspeed==0.19.8) "
        "(from versions: none)\nERROR: No matching distribution found for hjson (from deepspeed==0.19.8)\n"
    )
    assert (plain.missing, plain.needed_by) == ("hjson", "deepspeed==0.19.8")
    conflict = Unresolved(
        "The conflict is caused by:\n    glm-grpo-ds 0.1.0 depends on deepspeed>=0.19.3\n"
        "    The user requested (constraint) deepspeed==0.19.8\n\nAdditionally, some packages in these conflicts "
        "have no matching distributions available for your environment:\n    deepspeed\n\nTo fix this ...\n"
    )
    assert (conflict.missing, conflict.needed_by) == ("deepspeed", "glm-grpo-ds 0.1.0")
    clash = Unresolved("The conflict is caused by:\n    a 1 depends on b<2\n    c 1 depends on b>=2\n\nTo fix")
    assert clash.missing is None and str(clash) == "a 1 depends on b<2 c 1 depends on b>=2"


def test_a_non_empty_folder_and_a_missing_freeze_are_refused_before_any_download(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    assert main([str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.startswith(f"glm-grpo wheelhouse: {tmp_path / 'out'} is not empty")
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"
    assert main([str(tmp_path / "new"), "--skip-installed", str(tmp_path / "none.txt")]) == 2
    assert "none.txt" in capsys.readouterr().err and not (tmp_path / "new").exists()
    assert main(["--check", str(tmp_path / "out")]) == 2
    assert "has no bundle.json" in capsys.readouterr().err


def test_a_tested_top_pin_that_misses_the_targets_torch_is_the_one_that_gives_way():
    """pip's conflict for a container with torch 2.11 and constraints.txt's torchvision 0.29.2: torchvision
    is the misfit (its torch requirement misses 2.11), not the packages whose requirement 2.11 meets."""
    from glm_grpo_ds.install.bundle import _misfits

    err = Unresolved(
        "The conflict is caused by:\n    glm-grpo-ds 0.1.0 depends on torch>=2.11.0\n"
        "    accelerate 1.15.0 depends on torch>=2.0.0\n    bitsandbytes 0.50.2 depends on torch<3 and >=2.4\n"
        "    torchvision 0.29.2 depends on torch>=2.14.0\n    The user requested (constraint) torch==2.11.0+cu130\n\n"
        "Additionally, some packages in these conflicts have no matching distributions available for your "
        "environment:\n    torch\n"
    )
    assert err.missing == "torch"
    assert _misfits(err, {"torch": "2.11.0+cu130"}) == ["torchvision"]
    assert _misfits(err, {"torch": "2.15.0"}) == []  # nothing misses it: a real conflict, reported


def test_wheels_pip_took_from_a_find_links_folder_are_copied_not_downloaded_by_name(tmp_path, monkeypatch):
    """Only the wheels built here were copied: one of the user's --find-links folder (what docs/install.md prescribes
    for a wheel the index lacks) was downloaded again as name==version: not found, or the index's build instead."""
    from glm_grpo_ds.install import bundle
    from glm_grpo_ds.install.pip_runs import Resolved

    links, folder = tmp_path / "links", tmp_path / "bundle"
    links.mkdir()
    folder.mkdir()
    wheel = links / "mypkg-1.0-py3-none-any.whl"
    wheel.write_bytes(b"a wheel")
    asked = []
    monkeypatch.setattr(bundle, "run_pip", lambda args: asked.append(args))
    bundle._fetch([Resolved("mypkg", "1.0", wheel.resolve().as_uri())], {}, Target(), folder)
    assert (folder / wheel.name).read_bytes() == b"a wheel" and asked == []


def _wheel(folder, name: str, requires: list[str], extras: list[str] = ()):
    """A wheel holding only its METADATA (what the markers' check reads)."""
    meta = [f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0"]
    meta += [f"Provides-Extra: {e}" for e in extras] + [f"Requires-Dist: {r}" for r in requires]
    path = folder / f"{name.replace('-', '_')}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name.replace('-', '_')}-1.0.dist-info/METADATA", "\n".join(meta) + "\n")
    return path


def test_what_the_target_needs_by_its_own_markers_is_named_when_the_bundle_lacks_it(tmp_path):
    """pip evaluates markers for the machine it runs on (pypa/pip#11664): a bundle built on Python 3.12 for a 3.10
    node lacked tomli (huggingface_hub's, python_version < "3.11"), one built on a Mac lacked torch's Linux CUDA
    wheels; the check resolved on the same machine and passed them."""
    from glm_grpo_ds.install.markers import lacking, target_environment

    _wheel(tmp_path, "huggingface-hub", ['tomli; python_version < "3.11"', "filelock"])
    _wheel(tmp_path, "torch", ['nvidia-nccl-cu13; platform_system == "Linux"', 'setuptools; python_version >= "3.12"'])
    _wheel(tmp_path, "glm-grpo-ds", ["torch", 'rapidfuzz; extra == "ocr"', 'wandb; extra == "tracking"'], ["ocr"])
    _wheel(tmp_path, "filelock", [])
    kept = {"setuptools": "80.0"}  # the target's own packages
    linux_310 = target_environment("3.10", "manylinux_2_28_x86_64")
    assert lacking(tmp_path, kept, linux_310, "glm-grpo-ds", ["ocr"]) == [
        "nvidia-nccl-cu13 (torch needs it)",
        "rapidfuzz (glm-grpo-ds needs it)",
        "tomli (huggingface-hub needs it)",
    ]
    mac_312 = target_environment("3.12", "macosx_14_0_arm64")
    assert lacking(tmp_path, kept, mac_312, "glm-grpo-ds", []) == []
    assert lacking(tmp_path, {}, mac_312, "glm-grpo-ds", []) == ["setuptools (torch needs it)"]
