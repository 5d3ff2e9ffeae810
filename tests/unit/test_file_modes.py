"""Weight files follow the umask (issue #27: safetensors writes 0600, unreadable for teammates on shared
storage). Real safetensors writes here; the trainer and merge call follow_umask (glm_grpo_ds/ds/io.py,
commands/merge.py)."""

import os
import stat

import torch
from safetensors.torch import save_file

from glm_grpo_ds.runtime.file_modes import follow_umask, umask


def test_umask_is_read_without_changing_it():
    old = os.umask(0o027)
    try:
        assert umask() == 0o027 and umask() == 0o027
    finally:
        os.umask(old)


def test_a_safetensors_file_gets_the_umask_modes(tmp_path):
    old = os.umask(0o022)
    try:
        (tmp_path / "a").mkdir()
        save_file({"w": torch.zeros(2)}, tmp_path / "a" / "m.safetensors")
        (tmp_path / "a" / "x.json").write_text("{}")
        os.chmod(tmp_path / "a" / "x.json", 0o664)  # wider than the umask: left alone
        follow_umask(tmp_path / "a")
        assert stat.S_IMODE((tmp_path / "a" / "m.safetensors").stat().st_mode) == 0o644
        assert stat.S_IMODE((tmp_path / "a" / "x.json").stat().st_mode) == 0o664
    finally:
        os.umask(old)
