"""`glm-grpo profile bench` starts from package data (so an installed wheel has its defaults), the same settings as the
checkout's launch/configs/tiny_cpu.yaml and ds_configs/zero3.json."""

import json
from pathlib import Path

import yaml

from glm_grpo_ds.profiling import bench

ROOT = Path(__file__).resolve().parents[2]


def test_bench_defaults_are_package_data_equal_to_the_launch_configs():
    assert bench.CONFIG.parent == bench.ZERO3.parent == Path(bench.__file__).parent / "bench_defaults"
    tiny_cpu = yaml.safe_load((ROOT / "launch" / "configs" / "tiny_cpu.yaml").read_text())
    assert yaml.safe_load(bench.CONFIG.read_text()) == tiny_cpu
    assert json.loads(bench.ZERO3.read_text()) == json.loads((ROOT / "ds_configs" / "zero3.json").read_text())
    assert bench.parse_args([]).config == str(bench.CONFIG)


def test_the_wheel_ships_the_bench_defaults_and_the_build_warns_of_nothing(tmp_path):
    """A real wheel build of a copy of the checkout (setuptools of this environment, no index, ~4 s): the bench
    defaults are in it, and setuptools prints no warning (bench_defaults, a directory without __init__.py that
    Python can import, once cost every install a 40-line "Package would be ignored" warning)."""
    import shutil
    import subprocess
    import sys
    import zipfile

    import pytest
    from packaging.version import Version

    setuptools = pytest.importorskip("setuptools")
    if Version(setuptools.__version__) < Version("70.1"):  # a venv's bundled one (make test-floor's) needs `wheel`
        pytest.skip(f"setuptools {setuptools.__version__} builds wheels only with the wheel package; the index's does")
    src = tmp_path / "src"
    shutil.copytree(ROOT / "glm_grpo_ds", src / "glm_grpo_ds", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("setup.py", "pyproject.toml", "README.md", "constraints.txt", "MANIFEST.in"):
        shutil.copy(ROOT / name, src / name)
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "--no-index", "-w", "wheels"]
    proc = subprocess.run([*cmd, "."], cwd=src, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    build = [line for line in (proc.stdout + proc.stderr).splitlines() if "Location 'file:" not in line]  # pip.conf
    assert not [line for line in build if "warning" in line.lower() or "!!" in line], "\n".join(build)
    (wheel,) = (src / "wheels").glob("glm_grpo_ds-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {
        "glm_grpo_ds/profiling/bench_defaults/train.yaml",
        "glm_grpo_ds/profiling/bench_defaults/zero3.json",
    } <= set(names)
