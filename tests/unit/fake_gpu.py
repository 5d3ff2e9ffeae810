"""A fake ``nvidia-smi`` for the tests of what a GPU node whose GPUs torch cannot use looks like
(test_cuda_check.py, test_env_command.py, test_launch_scripts.py).

    from fake_gpu import FAKE_SMI, fake_gpu_bin   # a test module in tests/unit/
"""

from pathlib import Path

# One H100 and a driver that supports CUDA up to 12.2 (an R535 driver)
FAKE_SMI = """#!/bin/sh
case "$*" in
  -L) echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-x)" ;;
  *--query-gpu=driver_version*) echo "535.104.05" ;;
  *--query-gpu=memory.total,memory.reserved*)  # FAKE_GPU_RESERVED_MIB=none: a driver without the field
    [ "${FAKE_GPU_RESERVED_MIB:-}" = none ] && exit 6
    echo "${FAKE_GPU_MIB:-81559}, ${FAKE_GPU_RESERVED_MIB:-510}" ;;
  *--query-gpu=memory.total*) echo "${FAKE_GPU_MIB:-81559}" ;;
  "") echo "| NVIDIA-SMI 535.104.05   Driver Version: 535.104.05   CUDA Version: 12.2 |" ;;
  *) exit 1 ;;
esac
"""


def fake_gpu_bin(tmp_path: Path) -> Path:
    """A directory holding the fake ``nvidia-smi``, to put first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "nvidia-smi").write_text(FAKE_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    return bin_dir
