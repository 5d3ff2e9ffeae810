"""The GRPO trainer under real DeepSpeed: 2 CPU ranks over gloo, real peft, real bitsandbytes,
the tiny GLM-Image pipeline. Each test launches `deepspeed --num_gpus N` on tests/integration/ds_worker.py
or on the trainer module itself."""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "integration" / "ds_worker.py"
CONFIG = ROOT / "launch" / "configs" / "tiny_cpu.yaml"
ENV = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", DS_ACCELERATOR="cpu")  # a one-process CPU run
# the quickest meaningful step of the tiny model (other test files add their own options)
FAST = [
    "rollout.height=64",
    "rollout.width=64",
    "grpo.group_size=4",
    "batch.micro_batch_size=4",
    "optimizer.name=adamw",
    "logging.progress_bar=false",
    "logging.plot=false",
]

pytestmark = [pytest.mark.slow, pytest.mark.distributed]  # 2-rank DeepSpeed jobs


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_cmd(nprocs: int, args: list[str]) -> tuple[list[str], dict, int]:
    """(command, environment, master port) of a `deepspeed --num_gpus N` CPU run."""
    launcher = shutil.which("deepspeed", path=str(Path(sys.executable).parent)) or "deepspeed"
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT), DS_ACCELERATOR="cpu")
    port = _port()
    return [launcher, "--num_gpus", str(nprocs), "--master_port", str(port)] + args, env, port


def launch(nprocs: int, args: list[str], timeout: int = 600, check: bool = True) -> subprocess.CompletedProcess:
    cmd, env, port = launch_cmd(nprocs, args)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-60:])
        pytest.fail(f"deepspeed run failed ({proc.returncode}):\n{tail}")
    # DeepSpeed's CPU all-reduce leaves a 64 MiB /dev/shm file per rank unless engine unlinks it.
    leaked = list(Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{port}_*"))
    assert not leaked, f"shared-memory buffers left behind: {leaked}"
    return proc


@pytest.fixture(scope="module")
def tiny_data(tiny_model_dir, tmp_path_factory):
    from glm_grpo_ds.config import DecoderConfig
    from glm_grpo_ds.testing.tiny_data import write_tiny_dataset

    out = tmp_path_factory.mktemp("tiny_data")
    return write_tiny_dataset(tiny_model_dir, out, 256, 256, DecoderConfig(num_inference_steps=2))


def common(tiny_model_dir, tiny_data, out_dir, *extra):
    return [f"model.path={tiny_model_dir}", f"data.train_file={tiny_data}", f"output_dir={out_dir}", *extra]


def worker(nprocs, scenario, out, ds_config, overrides, extra=()):
    launch(
        nprocs,
        [
            str(WORKER),
            scenario,
            str(out),
            "--deepspeed",
            f"ds_configs/{ds_config}",
            "--config",
            str(CONFIG),
            *extra,
            *overrides,
        ],
    )
    return torch.load(out / "result.pt", weights_only=False)


@pytest.mark.parametrize("ds_config", ["zero2.json", "zero3.json"])
def test_lora_8bit_checkpointing_trains_only_the_adapter(ds_config, tiny_model_dir, tiny_data, tmp_path):
    run_dir = tmp_path / "run"
    overrides = common(
        tiny_model_dir,
        tiny_data,
        run_dir,
        "max_steps=2",
        "rollout.height=64",
        "rollout.width=64",
        "optimizer.name=adamw_8bit",
        "model.gradient_checkpointing=true",
        "grpo.beta=0.04",
    )
    r = worker(2, "train", tmp_path / "w", ds_config, overrides)
    assert r["is_lora"]
    changed = [n for n in r["trainable_before"] if not torch.equal(r["trainable_before"][n], r["trainable_after"][n])]
    assert changed and all("lora_" in n for n in r["trainable_before"])
    assert any("lora_B" in n for n in changed)
    for name, before in r["base_before"].items():
        assert before.numel() > 0, f"{name} was not gathered"
        assert torch.equal(before, r["base_after"][name]), f"base parameter {name} changed"
    assert torch.equal(r["ref_before"], r["ref_after"])  # adapters disabled == untouched base model

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        for key in (
            "loss",
            "reward_mean",
            "reward_std",
            "kl",
            "reward/pixel_mse",
            "clip_frac_low",
            "clip_frac_high",
            "ratio_mean",
            "grad_norm",
            "lr",
            "time/rollout",
            "time/decode",
            "time/reward",
            "time/update",
            "rollout_tokens_per_s",
            "peak_rss_mb",
        ):
            assert key in row and row[key] is not None, key
        assert torch.isfinite(torch.tensor(row["loss"]))
        # one update per rollout: the ratio is exactly 1 and nothing is clipped
        assert row["ratio_min"] == row["ratio_max"] == 1.0
        assert row["clip_frac_low"] == row["clip_frac_high"] == 0.0
    adapter = run_dir / "final_adapter"
    assert (adapter / "adapter_config.json").is_file()
    from safetensors.torch import load_file

    weights = load_file(adapter / "adapter_model.safetensors")
    assert weights and all(t.numel() > 0 for t in weights.values())  # never empty under ZeRO-3
    assert (run_dir / "reward_curve.png").stat().st_size > 1000


def test_full_finetuning_with_frozen_reference_engine_zero3(tiny_model_dir, tiny_data, tmp_path):
    run_dir = tmp_path / "run"
    overrides = common(
        tiny_model_dir,
        tiny_data,
        run_dir,
        "lora=null",
        "max_steps=2",
        "rollout.height=64",
        "rollout.width=64",
        "grpo.beta=0.1",
        "optimizer.name=adamw",
        "optimizer.lr=1e-3",
    )
    r = worker(2, "train", tmp_path / "w", "zero3.json", overrides)
    assert not r["is_lora"]
    assert any(not torch.equal(r["trainable_before"][n], r["trainable_after"][n]) for n in r["trainable_before"])
    assert any(n.startswith("lm_head") for n in r["trainable_before"])
    for name, before in r["base_before"].items():  # vision tower and VQ model stay frozen
        assert torch.equal(before, r["base_after"][name]), name
    assert torch.equal(r["ref_before"], r["ref_after"])  # the reference engine never moves
    assert (run_dir / "final_model" / "config.json").is_file()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["kl"] > 0  # after one update the policy differs from the reference


def _rel_close(a: torch.Tensor, b: torch.Tensor, rel: float) -> bool:
    return (a - b).norm().item() <= rel * max(a.norm().item(), b.norm().item(), 1e-30)


@pytest.mark.parametrize("lora,ds_config", [("lora", "zero3.json"), ("full", "zero3.json"), ("lora", "zero2.json")])
def test_gradients_do_not_depend_on_micro_batch_size(lora, ds_config, tiny_model_dir, tiny_data, tmp_path):
    overrides = common(
        tiny_model_dir,
        tiny_data,
        tmp_path / "run",
        "rollout.height=64",
        "rollout.width=64",
        "batch.prompts_per_rank=1",
        "grpo.group_size=8",
        "grpo.beta=0.04",
        "optimizer.name=adamw",
    )
    if lora == "full":
        overrides.append("lora=null")
    r = worker(2, "grads", tmp_path / "w", ds_config, overrides, extra=["--micro-batch-sizes", "1,2,8"])
    ref = r[8]
    nonzero = [n for n, g in ref["grads"].items() if g is not None and g.abs().sum() > 0]
    assert nonzero
    for m in (1, 2):
        # with ratio 1 the surrogate is -mean(A) ~ 0 (advantages are zero-mean): compare absolutely
        assert r[m]["loss"] == pytest.approx(ref["loss"], rel=1e-5, abs=1e-6)
        for n in nonzero:
            assert _rel_close(r[m]["grads"][n], ref["grads"][n], 1e-5), (m, n)
        first = r[m]["iterations"][0]
        assert (
            first["ratio_min"] == first["ratio_max"] == 1.0 and first["clip_frac_low"] == first["clip_frac_high"] == 0.0
        )


def test_same_rollouts_same_loss_and_gradients_on_one_and_two_ranks(tiny_model_dir, tiny_data, tmp_path):
    base = common(
        tiny_model_dir,
        tiny_data,
        tmp_path / "run",
        "rollout.height=64",
        "rollout.width=64",
        "grpo.group_size=4",
        "batch.micro_batch_size=2",
        "grpo.beta=0.04",
        "grpo.advantage_scale=batch",
        "optimizer.name=adamw",
    )
    one = worker(1, "dp", tmp_path / "w1", "zero3.json", base + ["batch.prompts_per_rank=2"])
    two = worker(2, "dp", tmp_path / "w2", "zero3.json", base + ["batch.prompts_per_rank=1"])
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-5, abs=1e-6)
    nonzero = [n for n, g in one["grads"].items() if g is not None and g.abs().sum() > 0]
    assert nonzero
    for n in nonzero:
        assert _rel_close(two["grads"][n], one["grads"][n], 1e-5), n


def test_sharded_rollout_equals_gathered_rollout_zero3(tiny_model_dir, tiny_data, tmp_path):
    overrides = common(
        tiny_model_dir,
        tiny_data,
        tmp_path / "run",
        "rollout.height=64",
        "rollout.width=64",
        "grpo.group_size=2",
        "batch.micro_batch_size=2",
    )
    r = worker(2, "sharded", tmp_path / "w", "zero3.json", overrides)
    assert torch.equal(r["gathered"][0], r["sharded"][0]) and torch.equal(r["gathered"][0], r["again"][0])
    torch.testing.assert_close(r["gathered"][1], r["sharded"][1], rtol=0, atol=1e-5)


def test_num_iterations_two_first_ratio_is_one(tiny_model_dir, tiny_data, tmp_path):
    overrides = common(
        tiny_model_dir,
        tiny_data,
        tmp_path / "run",
        "rollout.height=64",
        "rollout.width=64",
        "grpo.num_iterations=2",
        "optimizer.name=adamw",
        "optimizer.lr=1e-2",
    )
    r = worker(2, "grads", tmp_path / "w", "zero3.json", overrides, extra=["--micro-batch-sizes", "4"])
    first, second = r[4]["iterations"]
    assert first["ratio_min"] == first["ratio_max"] == 1.0
    assert second["ratio_max"] != 1.0 or second["ratio_min"] != 1.0  # the update moved the policy
