"""The attention choice (glm_image.resolve_attn) with a flash-attn that is missing, broken or working:
a real `flash_attn` package on sys.path whose import raises what an ABI mismatch raises, or works."""

import importlib
import logging
import sys

import pytest
import torch

from glm_grpo_ds.model.glm_image import AttentionError, probe_flash_attn, resolve_attn
from glm_grpo_ds.runtime import log

BROKEN = (
    'raise ImportError("/site-packages/flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so: undefined symbol: '
    '_ZN3c104cuda9SetDeviceEi\\nsecond line of the loader message")\n'
)


def _fake_flash(root, body: str, monkeypatch):
    pkg = root / "flash_attn"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(body)
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delitem(sys.modules, "flash_attn", raising=False)
    importlib.invalidate_caches()


@pytest.fixture
def warnings_seen(monkeypatch):
    """Our logger's warnings (the console handlers stay as they are), and warning_once forgets earlier runs."""
    monkeypatch.setattr(log, "_warned", set())
    seen = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: seen.append(record.getMessage())
    log._LOGGER.addHandler(handler)
    yield seen
    log._LOGGER.removeHandler(handler)


@pytest.fixture
def broken_flash(tmp_path, monkeypatch):
    _fake_flash(tmp_path, BROKEN, monkeypatch)


def test_probe_names_the_first_line_of_the_import_error(broken_flash):
    ok, reason = probe_flash_attn()
    assert not ok
    assert reason.startswith("ImportError: /site-packages/flash_attn_2_cuda") and "undefined symbol" in reason
    assert "second line" not in reason


@pytest.mark.parametrize("error", ["OSError", "RuntimeError"])
def test_probe_catches_loader_and_version_errors(error, tmp_path, monkeypatch):
    _fake_flash(tmp_path, f'raise {error}("libcudart.so.12: cannot open shared object file")\n', monkeypatch)
    assert probe_flash_attn() == (False, f"{error}: libcudart.so.12: cannot open shared object file")


def test_auto_falls_back_to_sdpa_with_one_warning(broken_flash, warnings_seen):
    assert resolve_attn("auto", on_gpu=True, dtype=torch.bfloat16) == "sdpa"
    assert resolve_attn("auto", on_gpu=True, dtype=torch.bfloat16) == "sdpa"  # e.g. the reference model
    assert len(warnings_seen) == 1, warnings_seen
    (line,) = warnings_seen
    assert "\n" not in line
    assert "flash-attn is installed but cannot be imported (ImportError: " in line and "undefined symbol" in line
    assert "using sdpa" in line and "reinstall flash-attn built for this torch" in line


def test_explicit_flash_with_a_broken_install_is_one_line_naming_cause_and_fix(broken_flash):
    with pytest.raises(AttentionError) as err:
        resolve_attn("flash_attention_2", on_gpu=True, dtype=torch.bfloat16)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("model.attn_implementation=flash_attention_2 but flash-attn cannot be imported (ImportError:")
    assert f"torch {torch.__version__.split('+')[0]}" in msg and "--force-reinstall" in msg
    assert "model.attn_implementation=sdpa" in msg


def test_not_installed_auto_is_sdpa_silently_and_explicit_says_install(warnings_seen, monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None)
    assert resolve_attn("auto", on_gpu=True, dtype=torch.bfloat16) == "sdpa" and not warnings_seen
    with pytest.raises(AttentionError, match=r"\(not installed\); install flash-attn built for this torch"):
        resolve_attn("flash_attention_2", on_gpu=True, dtype=torch.bfloat16)


def test_working_flash_is_chosen_on_a_gpu_in_half_precision_only(tmp_path, monkeypatch, warnings_seen):
    _fake_flash(tmp_path, "__version__ = '2.8.3'\n", monkeypatch)
    assert probe_flash_attn() == (True, "")
    assert resolve_attn("auto", on_gpu=True, dtype=torch.bfloat16) == "flash_attention_2"
    assert resolve_attn("auto", on_gpu=True, dtype=torch.float32) == "sdpa"
    assert resolve_attn("auto", on_gpu=False, dtype=torch.bfloat16) == "sdpa"
    assert resolve_attn("flash_attention_2", on_gpu=True, dtype=torch.bfloat16) == "flash_attention_2"
    assert resolve_attn("eager", on_gpu=True, dtype=torch.bfloat16) == "eager" and not warnings_seen
