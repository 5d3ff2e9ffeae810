"""What reaches a rank's environment through launch/train_multinode.sh in no-ssh mode (one launcher
per node, as every SLURM job runs): the variables of `.deepspeed_env`, which DeepSpeed's own launcher
reads only when it ssh-es into several nodes. A real launcher and one CPU rank, one step; a reward
plugin records the rank's environment when the rank imports it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from launching import CONFIG, FAST, ROOT, common, free_port  # noqa: E402  (tests/integration/launching.py)

pytestmark = [pytest.mark.slow, pytest.mark.distributed]  # a deepspeed launcher and its rank

PLUGIN = """
import os
from pathlib import Path

Path({seen!r}).write_text(os.environ.get("MARKER", "<unset>"))  # at import, on the rank


def mean(images, prompts, samples):
    return images.mean(dim=(1, 2, 3))
"""


def test_deepspeed_env_reaches_a_rank_in_no_ssh_mode(tiny_model_dir, data64, tmp_path):
    data = data64
    work = tmp_path / "work"  # the launch directory, where the launcher looks for .deepspeed_env
    work.mkdir()
    (work / ".deepspeed_env").write_text("# as on a cluster\nMARKER=from-deepspeed-env\n")
    (work / "hostfile").write_text("127.0.0.1 slots=1\n")
    seen = tmp_path / "seen"
    (tmp_path / "plug.py").write_text(PLUGIN.format(seen=str(seen)))
    env = dict(
        os.environ,
        PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        PYTHONPATH=str(ROOT),
        HF_HUB_OFFLINE="1",
        DS_ACCELERATOR="cpu",
        OMP_NUM_THREADS="1",
        NODE_RANK="0",
        NUM_NODES="1",
        HOSTFILE="hostfile",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        CONFIG=str(CONFIG),
        DS_CONFIG=str(ROOT / "ds_configs" / "zero2.json"),
    )
    env.pop("MARKER", None)
    overrides = common(tiny_model_dir, data, tmp_path / "run", "max_steps=1", *FAST)
    proc = subprocess.run(
        [
            "bash",
            str(ROOT / "launch" / "train_multinode.sh"),
            *overrides,
            f"rewards=[{{name: '{tmp_path}/plug.py:mean'}}]",
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert seen.read_text() == "from-deepspeed-env"
    assert "glm-grpo: exported from ./.deepspeed_env: MARKER" in proc.stderr
