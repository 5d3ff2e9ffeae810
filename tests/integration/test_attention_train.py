"""`glm-grpo train` with model.attn_implementation=flash_attention_2 and a flash-attn whose import fails
(a real package on PYTHONPATH raising what an ABI mismatch raises): one line, exit 2, before any model
loads. (attn_implementation=auto only considers flash-attn on a GPU; tests/unit/test_attention.py
covers its fallback.)"""

import os
import subprocess

import pytest
from launching import ENV, FAST, ROOT, common, train_cmd  # noqa: E402  (tests/integration/launching.py)

pytestmark = [pytest.mark.slow]  # a training process (it stops before loading the models)


def test_explicit_flash_attention_with_a_broken_install_is_one_line_exit_2(tiny_model_dir, tmp_path):
    fake = tmp_path / "site" / "flash_attn"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        'raise ImportError("flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so: undefined symbol: _ZN3c10")\n'
    )
    (tmp_path / "p.txt").write_text("a red cube\n")
    env = dict(ENV, PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), str(ROOT)]))
    reward = "rewards=[{name: 'python:glm_grpo_ds.testing.tiny_data:mean_brightness'}]"
    args = common(tiny_model_dir, tmp_path / "p.txt", tmp_path / "out", "max_steps=1", reward, *FAST)
    proc = subprocess.run(
        train_cmd() + args + ["model.attn_implementation=flash_attention_2"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    ours = [line for line in proc.stderr.splitlines() if line.startswith("glm-grpo train:")]
    assert len(ours) == 1, proc.stderr[-3000:]
    assert ours[0].startswith(
        "glm-grpo train: model.attn_implementation=flash_attention_2 but flash-attn cannot be imported "
        "(ImportError: flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so: undefined symbol: _ZN3c10); "
    ), ours[0]
    assert "reinstall flash-attn built for this torch" in ours[0] and "model.attn_implementation=sdpa" in ours[0]
