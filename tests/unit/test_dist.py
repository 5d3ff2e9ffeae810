"""Collectives: one module calls torch.distributed and puts every tensor on the process group's
communication device; the step's statistics take two collectives; collectives can be forced on at
world size 1 (so a single GPU with NCCL runs every one of them)."""

import ast
import math
import os
from pathlib import Path

import pytest
import torch
from gloo_ranks import two_gloo_ranks  # noqa: E402  (tests/gloo_ranks.py)

from glm_grpo_ds.ds import dist
from glm_grpo_ds.observability.metrics import step_record
from glm_grpo_ds.runtime.ports import free_port

PACKAGE = Path(__file__).resolve().parents[2] / "glm_grpo_ds"


def _uses_torch_distributed(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr == "distributed"
            and isinstance(node.value, ast.Name)
            and node.value.id == "torch"
        ):
            lines.append(node.lineno)
        elif isinstance(node, ast.Import) and any(a.name.startswith("torch.distributed") for a in node.names):
            lines.append(node.lineno)
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module
            and (
                node.module.startswith("torch.distributed")
                or (node.module == "torch" and any(a.name == "distributed" for a in node.names))
            )
        ):
            lines.append(node.lineno)
    return lines


def test_only_dist_py_calls_torch_distributed():
    offenders = {}
    for path in PACKAGE.rglob("*.py"):
        if path == PACKAGE / "ds" / "dist.py":
            continue
        lines = _uses_torch_distributed(ast.parse(path.read_text(encoding="utf-8")))
        if lines:
            offenders[str(path.relative_to(PACKAGE))] = lines
    assert offenders == {}, f"torch.distributed outside glm_grpo_ds/ds/dist.py: {offenders}"
    assert _uses_torch_distributed(ast.parse((PACKAGE / "ds" / "dist.py").read_text()))  # the check sees real uses


def test_tensors_go_to_the_communication_device_not_their_own():
    try:
        dist.setup(comm_device="meta")  # a device no tensor of the caller lives on
        moved = dist.to_comm(torch.ones(3))
        assert moved.device.type == "meta" and moved.shape == (3,)
        scalar = torch.tensor(1.0)  # the CPU scalar NCCL used to reject
        assert dist.to_comm(scalar).device.type == "meta"
    finally:
        dist.setup()
    assert dist.comm_device() == torch.device("cpu")  # no process group: CPU


@pytest.fixture
def one_rank_gloo():
    port = free_port()  # below the ephemeral range: no gloo connection takes it meanwhile
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.setup()
        torch.distributed.destroy_process_group()


def _count_collectives(monkeypatch):
    calls = []
    for name in ("all_reduce", "all_gather", "gather"):
        real = getattr(torch.distributed, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            tensor = args[0] if _name != "all_gather" else args[1]
            calls.append((_name, tensor.device.type))
            return _real(*args, **kwargs)

        monkeypatch.setattr(torch.distributed, name, spy)
    return calls


def test_forced_collectives_run_at_world_size_one_and_stats_take_two(one_rank_gloo, monkeypatch):
    calls = _count_collectives(monkeypatch)
    dist.setup(comm_device="cpu", force=False)
    assert dist.reduce_stats({"a": 1.0}, {"b": 2.0}) == ({"a": 1.0}, {"b": 2.0}) and calls == []  # skipped at world 1

    dist.setup(comm_device="cpu", force=True)
    sums, maxima = dist.reduce_stats({"loss": 0.5, "tokens": 7.0, "failed": 3.0}, {"skipped": 0.0, "-ratio_min": -0.9})
    assert sums == {"loss": 0.5, "tokens": 7.0, "failed": 3.0} and maxima == {"skipped": 0.0, "-ratio_min": -0.9}
    assert [c[0] for c in calls] == ["all_reduce", "all_reduce"]  # one for all sums, one for all maxima
    assert dist.any_rank(1) == 1.0
    x = torch.arange(6.0).view(3, 2)
    assert torch.equal(dist.all_gather(x), x) and torch.equal(dist.gather_to_main(x), x)
    assert torch.equal(dist.all_reduce_sum(x), x) and torch.equal(dist.all_reduce_max(x), x)
    assert [c[0] for c in calls[2:]] == ["all_reduce", "all_gather", "gather", "all_reduce", "all_reduce"]
    assert all(device == "cpu" for _, device in calls)


def test_step_record_by_hand():
    stats = {
        "loss": 0.25,
        "kl": 0.01,
        "clip_frac_low": 0.0,
        "clip_frac_high": 0.5,
        "ratio_mean": 1.0,
        "ratio_min": 0.8,
        "ratio_max": 1.3,
        "skipped": 0,
        "entropy": 2.5,
        "mismatch/logp_abs_mean": 1e-3,
        "mismatch/logp_abs_max": 0.02,
        "mismatch/kl_k3": 1e-6,
        "mismatch/frac_beyond": 0.0,
    }
    rewards = torch.tensor([0.0, 1.0, float("nan"), 3.0])
    rec = step_record(
        5,
        stats,
        rewards,
        {"r": rewards},
        {"r": 1},
        {"rollout": 2.0, "decode": 1.0, "reward": 0.5, "update": 4.0},
        {"memory/rollout_peak_mb": 10.0, "memory/update_peak_mb": 20.0},
        generated_tokens=800,
        num_iterations=2,
        device=torch.device("cpu"),
    )
    assert rec["step"] == 5 and rec["skipped"] == 0 and rec["loss"] == 0.25 and rec["clip_frac_high"] == 0.5
    assert rec["ratio_min"] == 0.8 and rec["ratio_max"] == 1.3 and rec["reward_mean"] == pytest.approx(4 / 3)
    assert rec["first_iteration_ratio_min"] == 0.8  # no per-iteration list: the overall extremes
    two = dict(stats, iterations=[{"ratio_min": 1.0, "ratio_max": 1.0}, {"ratio_min": 0.8, "ratio_max": 1.3}])
    rec2 = step_record(5, two, rewards, {}, {}, {"rollout": 1.0, "update": 1.0}, {}, 1, 2, torch.device("cpu"))
    assert (rec2["first_iteration_ratio_min"], rec2["first_iteration_ratio_max"], rec2["ratio_max"]) == (1.0, 1.0, 1.3)
    assert rec["rollout_tokens_per_s"] == 400 and rec["update_tokens_per_s"] == 400 and rec["time/update"] == 4.0
    assert rec["reward/r_undefined"] == 1 and rec["reward/r_failed"] == 1 and rec["peak_rss_mb"] > 0
    assert (rec["memory/rollout_peak_mb"], rec["memory/update_peak_mb"]) == (10.0, 20.0)  # max over the 1 rank
    assert (rec["entropy"], rec["mismatch/logp_abs_mean"], rec["mismatch/logp_abs_max"]) == (2.5, 1e-3, 0.02)
    assert not any(key.startswith(("correction/", "top_entropy/")) for key in rec)  # options off: no such metric
    options = {
        "correction/weight_mean": 1.01, "correction/weight_min": 0.5, "correction/weight_max": 2.5,
        "correction/outside_fraction": 0.1, "top_entropy/threshold": 3.2, "top_entropy/kept_fraction": 0.2,
    }  # fmt: skip
    rec3 = step_record(5, dict(stats, **options), rewards, {}, {}, {"rollout": 1.0, "update": 1.0}, {}, 1, 1,
                       torch.device("cpu"))  # fmt: skip
    assert {key: rec3[key] for key in options} == options  # one rank: the means, the min and the max are its own
    nan_stats = dict(stats, loss=float("nan"))
    assert (
        step_record(1, nan_stats, rewards, {}, {}, {"rollout": 1.0, "update": 1.0}, {}, 1, 1, torch.device("cpu"))[
            "loss"
        ]
        is None
    )


def _timed_rank(rank, port, results):
    """One of two gloo ranks whose reward took 0.5 s on rank 0 and 3 s on rank 1."""
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        stats = dict(loss=0.0, kl=0.0, clip_frac_low=0.0, clip_frac_high=0.0, ratio_mean=1.0, ratio_min=1.0)
        stats.update(ratio_max=1.0, skipped=0, entropy=1.0, **{"mismatch/logp_abs_max": 0.0})
        stats.update({"mismatch/logp_abs_mean": 0.0, "mismatch/kl_k3": 0.0, "mismatch/frac_beyond": 0.0})
        timings = {"rollout": 2.0 + rank, "reward": 0.5 if rank == 0 else 3.0, "update": 1.0}
        rewards = torch.zeros(4)
        rec = step_record(1, stats, rewards, {}, {}, timings, {}, 800, 1, torch.device("cpu"))
        results.put((rank, rec["time/rollout"], rec["time/reward"], rec["time/update"], rec["rollout_tokens_per_s"]))
    finally:
        torch.distributed.destroy_process_group()


def test_each_phases_time_is_its_slowest_ranks():
    """time/* were rank 0's alone although the docstring promised every rank the same record: a reward slow on
    rank 1 (3 s) showed as rank 0's 0.5 s, and the rollout's tokens/s was rank 0's."""
    got = sorted(two_gloo_ranks(_timed_rank))
    assert got == [(0, 3.0, 3.0, 1.0, 800 / 3.0), (1, 3.0, 3.0, 1.0, 800 / 3.0)]


def _late_rank(rank, port, results):
    """One of two gloo ranks with a 1 s timeout set as the trainer sets it; rank 1 comes 4 s late to a collective on
    DeepSpeed's clone of the world group (what its engine reduces and gathers on)."""
    import datetime
    import os
    import time

    import deepspeed
    from deepspeed.utils import groups

    from glm_grpo_ds.ds.process_group import this_environments_ninja

    env = dict(RANK=rank, LOCAL_RANK=rank, WORLD_SIZE=2, MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    env["DS_ACCELERATOR"] = "cpu"
    os.environ.update({k: str(v) for k, v in env.items()})
    timeout = datetime.timedelta(seconds=1)
    dist.every_group_waits(timeout)
    with this_environments_ninja():  # the CPU op make setup built, loaded, not rebuilt by another ninja (~40 s)
        # the world group's own timeout long: it is also how long the freshly spawned ranks wait for each other to
        # arrive; what is tested is the default every_group_waits gives the groups DeepSpeed makes afterwards
        deepspeed.init_distributed(dist_backend="gloo", verbose=False, timeout=datetime.timedelta(seconds=120))
    try:
        group = groups._clone_world_group()
        if rank == 1:
            time.sleep(4)
        began = time.monotonic()
        try:
            torch.distributed.all_reduce(torch.ones(1), group=group)
            results.put((rank, None, time.monotonic() - began))
        except RuntimeError:
            results.put((rank, "timed out", time.monotonic() - began))
    finally:
        torch.distributed.destroy_process_group()


def test_deepspeeds_own_groups_time_out_after_dist_timeout_minutes():
    """dist_timeout_minutes holds on the groups DeepSpeed creates itself, not only the world group: they took torch's
    default (NCCL 10 min, gloo 30), so a reduction in the update aborted at 10 minutes whatever the setting said."""
    got = {rank: (err, waited) for rank, err, waited in two_gloo_ranks(_late_rank)}
    assert got[0][0] == "timed out" and got[0][1] < 3.5, got  # rank 1 came 4 s late: rank 0 gave up first


def _nan_rank(rank, port, nan_on, results):
    """One of two gloo ranks; rank ``rank`` holds a NaN ratio maximum and minimum (-x), the other 1.0."""
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        value = math.nan if rank == nan_on else 1.0
        _, top = dist.reduce_stats({"a": 1.0}, {"ratio_max": value, "-ratio_min": -value, "time": 2.0 + rank})
        results.put((nan_on, rank, top["ratio_max"], top["-ratio_min"], top["time"]))
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.parametrize("nan_on", [0, 1])
def test_a_maximum_nan_on_any_rank_is_infinite_on_every_rank(nan_on):
    """A reduction's max keeps or drops a NaN by the ranks' order (gloo's std::max): the NaN ratio of one rank
    read as the other's 1.0. Now +inf on every rank (the step record's null, as a NaN's), the rest unchanged."""
    got = sorted(two_gloo_ranks(_nan_rank, nan_on))
    assert got == [(nan_on, 0, math.inf, math.inf, 3.0), (nan_on, 1, math.inf, math.inf, 3.0)]


def _lost_peer_rank(rank, port, results):
    """Rank 1 ends its process while rank 0 waits for it in a collective; rank 0 reports what it raised, and how
    other errors read."""
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    if rank == 1:
        os._exit(8)  # as a rank that met its own error and exited
    try:
        dist.all_reduce_sum(torch.ones(3))
        results.put(("real", "no error"))
    except RuntimeError as err:
        results.put(("real", dist.peer_lost(err)))
    chained = RuntimeError("the step failed")
    chained.__cause__ = RuntimeError("[pair.cc:561] Connection closed by peer [127.0.0.1]:23448")
    unrelated = RuntimeError("mat1 and mat2 shapes cannot be multiplied")
    results.put(("others", (dist.peer_lost(chained), dist.peer_lost(unrelated))))


def test_a_collective_that_lost_its_peer_is_told_from_other_errors():
    """A rank whose collective failed because another rank's process ended waits before its own exit
    (glm_grpo_ds/train.py), so that the launcher reports the failed rank's status, not this one's 1."""
    got = dict(two_gloo_ranks(_lost_peer_rank))
    assert got == {"real": True, "others": (True, False)}, got  # gloo's own error, from a real lost peer
