"""`glm-grpo bench` starts from package data (so an installed wheel has its defaults), the same settings as the
checkout's launch/configs/tiny_cpu.yaml and ds_configs/zero3.json."""

import json
from pathlib import Path

import yaml

from glm_grpo_ds.commands import bench

ROOT = Path(__file__).resolve().parents[2]


def test_bench_defaults_are_package_data_equal_to_the_launch_configs():
    assert bench.CONFIG.parent == bench.ZERO3.parent == Path(bench.__file__).parent / "bench_defaults"
    tiny_cpu = yaml.safe_load((ROOT / "launch" / "configs" / "tiny_cpu.yaml").read_text())
    assert yaml.safe_load(bench.CONFIG.read_text()) == tiny_cpu
    assert json.loads(bench.ZERO3.read_text()) == json.loads((ROOT / "ds_configs" / "zero3.json").read_text())
    assert bench.parse_args([]).config == str(bench.CONFIG)


def test_setup_ships_the_bench_defaults():
    setup = (ROOT / "setup.py").read_text()
    assert '"glm_grpo_ds.commands": ["bench_defaults/*.yaml", "bench_defaults/*.json"]' in setup
