"""``cpu_comm_op_needs_build`` (glm_grpo_ds/ds/process_group.py): the trainer says "building DeepSpeed's CPU
communication op ... ~40 s" exactly when the process-group start will compile it (issue #27: the first CPU
run said nothing for ~40 s)."""

import os

import pytest

from glm_grpo_ds.ds.engine import cpu_comm_op_needs_build


@pytest.fixture
def ext_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    return tmp_path


def _sources():
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    return builder.name, [os.path.abspath(builder.deepspeed_src_path(s)) for s in builder.sources()]


def test_an_empty_extensions_directory_needs_a_build(ext_dir):
    assert cpu_comm_op_needs_build()


def test_a_library_built_from_these_sources_needs_none_and_another_installs_does(ext_dir):
    name, sources = _sources()
    build = ext_dir / name
    build.mkdir()
    (build / f"{name}.so").write_bytes(b"")
    (build / "build.ninja").write_text("".join(f"build x.o: compile {s}\n" for s in sources))
    assert not cpu_comm_op_needs_build()
    # the same directory after another virtual environment built it: torch recompiles for this one
    (build / "build.ninja").write_text(
        "".join(f"build x.o: compile {s.replace('/deepspeed/', '/deepspeed-other/')}\n" for s in sources)
    )
    assert cpu_comm_op_needs_build()
    (build / "build.ninja").write_text("".join(f"build x.o: compile {s}\n" for s in sources))
    (build / f"{name}.so").unlink()
    assert cpu_comm_op_needs_build()


def test_the_op_builds_with_this_environments_ninja_whatever_path_says(monkeypatch):
    """A ninja 1.11 on the system and a 1.13 in the venv hash their build commands differently in the shared
    extensions directory: processes with and without the venv's bin on PATH rebuilt the op in turn (~40 s each).
    While the process group starts, PATH puts this interpreter's directory first; after, it is as it was."""
    import shutil
    import sys
    from pathlib import Path

    from glm_grpo_ds.ds.engine import this_environments_ninja

    venv_ninja = Path(sys.executable).parent / "ninja"
    if not venv_ninja.is_file():
        pytest.skip("no ninja next to this interpreter (DeepSpeed requires the ninja package)")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    with this_environments_ninja():
        assert Path(shutil.which("ninja")) == venv_ninja
    assert os.environ["PATH"] == "/usr/bin:/bin"
    monkeypatch.delenv("PATH")
    with this_environments_ninja():
        assert os.environ["PATH"] == str(venv_ninja.parent)
    assert "PATH" not in os.environ


def test_each_environment_builds_its_ops_in_a_folder_of_its_own(monkeypatch, tmp_path):
    """torch's default extensions folder serves every virtual environment of a user: an op built from another
    environment's sources is rebuilt (~40 s on 2 cores, the other ranks waiting on its lock), so two environments
    rebuilt it in turn at nearly every run (the suite's 1-step runs timed out at 300 s beside another environment's
    runs). Unset, TORCH_EXTENSIONS_DIR becomes a folder of this environment's; a value the user set is kept."""
    import sys

    from torch.utils.cpp_extension import get_default_build_root

    from glm_grpo_ds.ds.process_group import this_environments_extensions

    folders = []
    for prefix in (tmp_path / "a" / ".venv", tmp_path / "b" / ".venv", tmp_path / "a" / ".venv"):
        monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
        monkeypatch.setattr(sys, "prefix", str(prefix))
        this_environments_extensions()
        folders.append(os.environ["TORCH_EXTENSIONS_DIR"])
    assert folders[0] == folders[2] != folders[1]  # one folder per environment, the same one each time
    assert all(os.path.dirname(f) == get_default_build_root() for f in folders)
    assert os.path.basename(folders[0]).startswith("venv-")  # named after it, not hidden
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "mine"))
    this_environments_extensions()
    assert os.environ["TORCH_EXTENSIONS_DIR"] == str(tmp_path / "mine")
