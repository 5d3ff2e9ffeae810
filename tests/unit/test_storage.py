"""output_dir must be one storage for every rank (glm_grpo_ds/lifecycle/storage.py): the decision taken alike on
every rank from what each one sees (a pure function, on hand-made reports), and the real collectives on
two gloo processes whose output_dirs are two different directories (two "nodes" without shared storage)."""

import json
import os
import re

import pytest
import torch
from gloo_ranks import two_gloo_ranks  # noqa: E402  (tests/gloo_ranks.py)

from glm_grpo_ds.data import DataError
from glm_grpo_ds.lifecycle import checkpoint, storage
from glm_grpo_ds.lifecycle.checkpoint import CheckpointError, OutputDirError

OUT = storage.Path("run")


def report(host="a", error=None, latest=None, resume=None, resume_error=None):
    return {"host": host, "error": error, "latest": latest, "resume": resume, "resume_error": resume_error}


def test_ranks_are_named_by_host_and_spans():
    hosts = ["a"] * 8 + ["b"] * 8
    assert storage.describe_ranks([1], hosts) == "rank 1 on a"
    assert storage.describe_ranks(list(range(8, 16)), hosts) == "ranks 8-15 on b"
    assert storage.describe_ranks([1, 3, 4, 9, 10, 11], hosts) == "ranks 1, 3-4 on a and 9-11 on b"


def test_ranks_that_see_different_latest_pointers_stop_the_run_naming_what_each_saw():
    reports = [report("a", latest="step_000002")] * 2 + [report("b")] * 2
    with pytest.raises(OutputDirError) as err:
        storage.agree(reports, OUT)
    assert str(err.value) == (
        "ranks disagree on run/checkpoints/latest: ranks 0-1 on a see step_000002, ranks 2-3 on b see nothing; "
        + storage.SHARED_FIX
    )
    # rank 0 seeing nothing is reported first all the same (its view leads)
    with pytest.raises(OutputDirError, match=r"latest: rank 0 on b sees nothing, rank 1 on a sees step_000002; "):
        storage.agree([report("b"), report("a", latest="step_000002")], OUT)


def test_everyone_uses_rank_0s_checkpoint_or_all_start_fresh():
    ckpt = "run/checkpoints/step_000002"
    same = [report(h, latest="step_000002", resume=ckpt) for h in "ab"]
    assert storage.agree(same, OUT) == storage.Path(ckpt)
    assert storage.agree([report(h) for h in "ab"], OUT) is None  # nothing anywhere: all fresh
    # resume_from=latest without one: rank 0's error, raised alike on every rank
    with pytest.raises(CheckpointError, match="no latest here"):
        storage.agree([report(h, resume_error="no latest here") for h in "ab"], OUT)
    # a resume_from path that one node cannot read
    blind = [report("a", resume="/ckpt/step_1"), report("b", resume_error="/ckpt/step_1 is not a complete checkpoint")]
    with pytest.raises(CheckpointError, match=r"^rank 1 on b cannot read checkpoint /ckpt/step_1 that rank 0 resu"):
        storage.agree(blind, OUT)


def test_an_output_dir_error_is_raised_alike_and_names_the_ranks_unless_all_had_it():
    msg = "output_dir run cannot be created (Permission denied); pick another output_dir= or fix its permissions"
    with pytest.raises(OutputDirError) as err:
        storage.agree([report("a", error=msg), report("b", error=msg)], OUT)
    assert str(err.value) == msg  # every rank: the message as before
    with pytest.raises(OutputDirError) as err:
        storage.agree([report("a", latest="step_000001"), report("b", error=msg)], OUT)
    assert str(err.value) == f"rank 1 on b: {msg}"  # before the latest check: rank 1 could not even look


def test_one_process_checks_its_output_dir_and_resolves_auto(tmp_path):
    out = tmp_path / "run"
    assert storage.open_output_dir(out, "auto", 0) == (out, None)  # no process group: world size 1
    step = out / checkpoint.CHECKPOINTS / "step_000001"
    (step / "ds").mkdir(parents=True)
    (step / "trainer_state.json").write_text(json.dumps({"step": 1}))
    (step.parent / checkpoint.LATEST).write_text(step.name)
    assert storage.open_output_dir(out, "auto", 0) == (out, step)
    latest = step.parent / checkpoint.LATEST  # a file
    with pytest.raises(OutputDirError) as err:
        storage.open_output_dir(latest / "sub", None, 0)
    fix = "is a file, not a directory; pick another output_dir= or move the file away"
    assert str(err.value) == f"output_dir {latest / 'sub'}: {latest} {fix}"  # not "fix its permissions"
    with pytest.raises(OutputDirError) as err:
        storage.open_output_dir(latest, None, 0)
    assert str(err.value) == f"output_dir {latest} {fix}"
    assert not list(out.glob(storage.PROBE_PREFIX + "*"))


def _rank(rank, port, scenarios, results):
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        for cwds, output_dir, resume_from in scenarios:
            os.chdir(cwds[rank])
            try:
                storage.open_output_dir(output_dir, resume_from, rank)
                results.put((rank, None))
            except (OutputDirError, CheckpointError) as err:
                results.put((rank, str(err)))
    finally:
        torch.distributed.destroy_process_group()


def _two_ranks(scenarios):
    """open_output_dir on two real gloo ranks, for each scenario ``(cwds, output_dir, resume_from)`` with
    rank r in working directory ``cwds[r]`` (a relative output_dir launched from two directories is two
    disks); per scenario, each rank's error or None."""
    got = two_gloo_ranks(_rank, scenarios, per_rank=len(scenarios))
    return [[err for rank, err in got if rank == r] for r in (0, 1)]  # [rank][scenario]


def test_two_ranks_on_two_disks_are_refused_and_on_one_disk_pass(tmp_path):
    node0, node1 = tmp_path / "node0", tmp_path / "node1"
    (node0 / "resumed" / "checkpoints").mkdir(parents=True)
    (node0 / "resumed" / "checkpoints" / "latest").write_text("step_000002")  # seen by rank 0's "node" only
    node1.mkdir()
    two_disks, one_disk = [node0, node1], [node0, node0]
    rank0, rank1 = _two_ranks([(two_disks, "run", None), (one_disk, "run", None), (two_disks, "resumed", "auto")])
    assert rank0 == rank1  # every rank stops with the same line, or none does
    separate, shared, resumed = rank0
    assert separate.startswith("output_dir run is not the same storage on every node: rank 1 on ")
    assert separate.endswith(storage.SHARED_FIX)
    assert shared is None
    assert [p.name for p in (node0 / "run").iterdir()] == []  # the token is removed
    assert resumed.startswith("ranks disagree on resumed/checkpoints/latest: rank 0 on ")
    assert " sees step_000002, rank 1 on " in resumed and " sees nothing; " in resumed


class _Engine:
    """Stands in for the DeepSpeed engine in checkpoint.save: like DeepSpeed, it creates the directory of
    the shard it writes (the real engine takes ~1 min to start on this machine)."""

    def save_checkpoint(self, directory, tag, save_latest, exclude_frozen_parameters):
        shard = storage.Path(directory) / tag / "mp_rank_00_model_states.pt"
        shard.parent.mkdir(parents=True, exist_ok=True)
        shard.write_bytes(b"shard")


def test_a_rank_other_than_0_creates_the_checkpoint_directories_it_writes(tmp_path):
    # no process group: the barriers are no-ops, and rank 1 finds no directory rank 0 made for it
    checkpoint.save(_Engine(), tmp_path, 3, {"step": 3}, rank=1, is_lora=False, total_limit=0)
    tmp = tmp_path / checkpoint.CHECKPOINTS / "step_000003.tmp"
    assert (tmp / "rng" / "rank_1.pt").is_file() and (tmp / "ds" / "mp_rank_00_model_states.pt").is_file()
    assert not (tmp_path / checkpoint.CHECKPOINTS / checkpoint.LATEST).exists()  # rank 0 completes a checkpoint


def test_ranks_that_read_different_prompt_sets_are_named_in_one_line():
    prints = [{"source": "/data/p.jsonl", "rows": 1000, "sha256": "a" * 64}] * 8
    prints += [{"source": "/data/p.jsonl", "rows": 998, "sha256": "b" * 64}] * 8
    hosts = ["node-a"] * 8 + ["node-b"] * 8
    assert storage.data_disagreement(prints[:8], hosts, "data.train_file") is None
    assert storage.data_disagreement(prints, hosts, "data.train_file") == (
        "data.train_file /data/p.jsonl is not the same prompt set on every rank: ranks 8-15 on node-b read 998 "
        "prompts (sha256 bbbbbbbbbbbb), rank 0 on node-a 1000 (sha256 aaaaaaaaaaaa); put it on storage every node "
        "reads alike, or the same copy on each"
    )


def _data_rank(rank, port, results):
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        storage.check_same_data({"source": "p.txt", "rows": 4 + rank, "sha256": str(rank)}, "data.train_file")
        results.put((rank, None))
    except DataError as err:
        results.put((rank, str(err)))
    finally:
        torch.distributed.destroy_process_group()


def test_two_ranks_with_different_copies_of_the_prompts_both_stop():
    """Each rank computes every rank's prompts from its own copy: two copies that differ (a node-local file) would
    repeat and skip prompts in silence; both ranks stop with the same line before any model loads."""
    got = dict(two_gloo_ranks(_data_rank))
    assert got[0] == got[1] and got[0].startswith("data.train_file p.txt is not the same prompt set on every rank")


def _inputs_rank(rank, port, results):
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        for failing in (None, 1):
            mine = DataError("data.train_file /scratch/p.jsonl not found") if rank == failing else None
            try:
                storage.agree_on_inputs(mine)
                results.put((rank, failing, None))
            except (DataError, storage.OtherRankFailed) as err:
                results.put((rank, failing, f"{type(err).__name__}: {err}"))
    finally:
        torch.distributed.destroy_process_group()


def test_a_node_that_failed_its_input_checks_alone_stops_every_node_at_once():
    """On several nodes a node may fail the pre-group checks alone (a path on node 0 only): its ranks join the group
    and every rank learns it at once; rank 0 names that rank and its line, instead of waiting for it at the
    rendezvous until the timeout. Nothing failed: nothing raised."""
    got = {(rank, failing): err for rank, failing, err in two_gloo_ranks(_inputs_rank, per_rank=2)}
    assert got[(0, None)] is None and got[(1, None)] is None
    assert got[(1, 1)] == "DataError: data.train_file /scratch/p.jsonl not found"
    assert re.fullmatch(
        r"OtherRankFailed: rank 1 on \S+ failed the input checks: data.train_file /scratch/p.jsonl not found",
        got[(0, 1)],
    ), got
