"""No silent CPU fallback: a node with NVIDIA GPUs that torch cannot use (here: a fake ``nvidia-smi``
listing an H100 next to this machine's torch, which finds no CUDA driver - what an old driver under a
newer torch CUDA build looks like) stops a rank at startup with one line naming torch's build, the
driver and the fix, exit 2, before any model loads; DS_ACCELERATOR=cpu runs on the CPU on purpose,
and a machine without GPUs keeps running on the CPU."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fake_gpu import fake_gpu_bin  # noqa: E402  (tests/unit/fake_gpu.py)

from glm_grpo_ds.runtime import cuda_check

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = str(Path(sys.executable).parent)


@pytest.fixture
def no_gpu_machine(monkeypatch, tmp_path):
    """This process sees no nvidia-smi and no NVIDIA kernel driver, whatever the host has."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(cuda_check, "PROC_VERSION", tmp_path / "no-driver")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="torch can use CUDA here: nothing to refuse")
def test_a_gpu_node_whose_gpus_torch_cannot_use_stops_the_run_with_one_line(tmp_path):
    """`python -m glm_grpo_ds.train` as a launcher starts it, DS_ACCELERATOR unset: exit 2 in seconds,
    one line, no traceback, nothing written."""
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    env.update(PATH=f"{fake_gpu_bin(tmp_path)}:{VENV_BIN}:{os.environ['PATH']}", PYTHONPATH=str(ROOT))
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "glm_grpo_ds.train", "--config", "launch/configs/tiny_cpu.yaml"]
    proc = subprocess.run(
        [*cmd, "--deepspeed", "ds_configs/zero3.json", f"output_dir={out}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    line = lines[0]
    assert line.startswith("glm-grpo train: this node has 1 NVIDIA GPU(s) (NVIDIA H100 80GB HBM3), but torch ")
    build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU-only build, torch.version.cuda is None"
    assert (
        f"torch {torch.__version__} ({build}) cannot use CUDA (driver 535.104.05, which supports CUDA <= 12.2" in line
    )
    assert "pip install torch --index-url https://download.pytorch.org/whl/cu" in line
    assert line.endswith("or to train on the CPU on purpose, set DS_ACCELERATOR=cpu")
    assert not out.exists()


def test_cpu_on_purpose_and_machines_without_gpus_are_not_refused(no_gpu_machine, monkeypatch, tmp_path):
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    assert cuda_check.refusal() is None
    cuda_check.check_rank()  # a laptop: runs on the CPU
    monkeypatch.setenv("DS_ACCELERATOR", "cuda")  # GPUs asked for where there are none: refused
    with pytest.raises(cuda_check.CudaUnusable, match="^DS_ACCELERATOR=cuda asks for GPUs, but nvidia-smi lists none"):
        cuda_check.check_rank()
    monkeypatch.setenv("PATH", str(fake_gpu_bin(tmp_path)))
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")  # a GPU node, CPU ranks on purpose
    cuda_check.check_rank()
    monkeypatch.delenv("DS_ACCELERATOR")
    monkeypatch.setattr(torch.version, "cuda", "13.2")  # newer than the driver's 12.2
    with pytest.raises(cuda_check.CudaUnusable, match="update the NVIDIA driver to one that supports CUDA 13.2"):
        cuda_check.check_rank()


def test_the_refusal_names_what_hides_the_gpus(no_gpu_machine, monkeypatch, tmp_path):
    """A driver new enough for torch's build: the cause is elsewhere (devices, CUDA_VISIBLE_DEVICES);
    a CPU-only wheel: install a CUDA build."""
    monkeypatch.setenv("PATH", str(fake_gpu_bin(tmp_path)))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr(torch.version, "cuda", "12.1")
    line = cuda_check.refusal()
    assert (
        "CUDA_VISIBLE_DEVICES='': no GPU visible" in line and "check CUDA_VISIBLE_DEVICES and the /dev/nvidia*" in line
    )
    monkeypatch.setattr(torch.version, "cuda", None)
    line = cuda_check.refusal()
    assert "(CPU-only build, torch.version.cuda is None)" in line and "install a CUDA build of torch" in line
    assert "XYZ <= 122" in line


def test_bench_refuses_to_time_the_cpu_on_a_gpu_node(no_gpu_machine, monkeypatch, tmp_path, capsys):
    """`glm-grpo profile bench` would otherwise benchmark the CPU and report it as this node's numbers."""
    from glm_grpo_ds.profiling import bench

    monkeypatch.setenv("PATH", str(fake_gpu_bin(tmp_path)))
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    assert bench.main(["--out", str(tmp_path / "bench.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "glm-grpo profile bench: this node has 1 NVIDIA GPU(s) (NVIDIA H100 80GB HBM3)"
    )
    assert not (tmp_path / "bench.json").exists()
