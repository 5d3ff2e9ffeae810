"""data/image_files.py: the image files a run is given (a target path, a dataset's image bytes, a reward server
request's image) are decoded by the raster formats it lists only. An EPS file would otherwise reach PIL's EPS plugin,
which runs Ghostscript on the file's PostScript: here a stand-in ``gs`` on PATH records whether it was run."""

import base64
import io
import os
import subprocess

import pytest
from PIL import EpsImagePlugin, Image

from glm_grpo_ds.data.image_files import READ_FORMATS, open_image
from glm_grpo_ds.data.lines import check_image
from glm_grpo_ds.data.rows import DataError, DatasetImage
from glm_grpo_ds.rewards.remote.protocol import decode_png
from glm_grpo_ds.rewards.targets import _fitted, load_target


def _eps_bytes() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 10, 10)).save(buf, format="EPS")
    return buf.getvalue()


@pytest.fixture
def ghostscript_spy(tmp_path, monkeypatch):
    """A ``gs`` on PATH that leaves a file behind when it runs; PIL looks for it anew."""
    ran = tmp_path / "gs-ran"
    gs = tmp_path / "bin" / "gs"
    gs.parent.mkdir()
    # answers PIL's `gs --version` probe; any other call is a conversion: recorded, and failed
    gs.write_text(f'#!/bin/sh\n[ "$1" = --version ] && echo 10.0 && exit 0\ntouch "{ran}"\nexit 1\n')
    gs.chmod(0o755)
    monkeypatch.setenv("PATH", f"{gs.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(EpsImagePlugin, "gs_binary", None)
    _fitted.cache_clear()
    yield ran
    _fitted.cache_clear()


def test_the_spy_sees_pil_run_ghostscript_on_an_eps_file(ghostscript_spy):
    """The check's own control: PIL left to pick the decoder runs gs on the file."""
    with pytest.raises(subprocess.CalledProcessError):  # the stand-in fails the conversion
        Image.open(io.BytesIO(_eps_bytes())).convert("RGB")
    assert ghostscript_spy.exists()


def test_an_eps_image_is_refused_everywhere_a_run_opens_images_and_ghostscript_never_runs(ghostscript_spy, tmp_path):
    eps = _eps_bytes()
    path = tmp_path / "target.png"  # the suffix does not matter: PIL reads the first bytes
    path.write_bytes(eps)
    with pytest.raises(ValueError, match="not an image of a format read here"):
        decode_png(base64.b64encode(eps).decode())  # a reward server's request
    with pytest.raises(ValueError, match="cannot read target image"):
        load_target(DatasetImage(eps, "prompts.parquet row 3"), 8, 8)  # a dataset's image column
    with pytest.raises(ValueError, match="cannot read target image"):
        load_target(str(path), 8, 8)  # a target path
    with pytest.raises(DataError, match="cannot be read as an image"):
        check_image(lambda: str(path), "row 3's target_image", "fix it")  # the start's check
    assert not ghostscript_spy.exists()


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "BMP", "GIF", "TIFF"])
def test_the_raster_formats_read_as_before(fmt):
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (0, 128, 255)).save(buf, format=fmt)
    with open_image(io.BytesIO(buf.getvalue())) as img:
        assert img.format == fmt and img.size == (8, 8)
    assert fmt in READ_FORMATS


def test_a_decompression_bomb_is_an_unreadable_file_not_pils_own_exception(monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 10)  # 8 x 8 = 64 pixels: over twice the limit
    buf = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buf, format="PNG")
    with pytest.raises(OSError, match="decompression bomb"):
        open_image(io.BytesIO(buf.getvalue()))
    with pytest.raises(ValueError, match="decompression bomb"):
        decode_png(base64.b64encode(buf.getvalue()).decode())
