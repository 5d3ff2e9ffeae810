"""Per-rank CPU threads (glm_grpo_ds/runtime/threads.py): torch's pool and the OCR reward's onnxruntime sessions
get this rank's share of the node's cores, not one thread per core in every rank."""

import os

import pytest
import torch

from glm_grpo_ds.runtime.threads import cores_per_local_rank, launcher_nodes, limit_torch_threads


@pytest.fixture
def node(monkeypatch):
    """A node whose launcher started LOCAL_WORLD_SIZE ranks on the cores of this process's affinity."""

    def set_node(cores: int, ranks: int, omp: str | None = None):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(ranks))
        monkeypatch.delenv("LOCAL_SIZE", raising=False)
        if omp is None:
            monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        else:
            monkeypatch.setenv("OMP_NUM_THREADS", omp)

    return set_node


def test_cores_per_local_rank(node):
    node(128, 8)
    assert cores_per_local_rank() == 16
    node(64, 8)  # a SLURM allocation's cores (--cpus-per-task), not the machine's
    assert cores_per_local_rank() == 8
    node(4, 8)
    assert cores_per_local_rank() == 1
    node(128, 8, omp="3")  # set by the user or deepspeed --bind_cores_to_rank: wins
    assert cores_per_local_rank() == 3


def test_torch_threads_are_the_rank_share(node):
    before = torch.get_num_threads()
    node(2, 2)
    try:
        assert limit_torch_threads() == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_ocr_sessions_get_the_rank_share_of_cores(node):
    pytest.importorskip("rapidocr_onnxruntime")
    from glm_grpo_ds.rewards.ocr import OCRReward

    node(2, 2)  # 2 ranks on this machine's 2 cores: 1 thread each
    engine = OCRReward().engine
    for ort in (engine.text_det.infer, engine.text_cls.infer, engine.text_rec.session):  # rapidocr's wrappers
        opts = ort.session.get_session_options()
        assert (opts.intra_op_num_threads, opts.inter_op_num_threads) == (1, 1)


@pytest.mark.parametrize(
    "env, nodes",
    [({"CROSS_SIZE": "2"}, 2), ({"CROSS_SIZE": "1", "WORLD_SIZE": "16"}, 1), ({"WORLD_SIZE": "16"}, 1)]
    + [({"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"}, 2), ({"GROUP_WORLD_SIZE": "4", "WORLD_SIZE": "32"}, 4), ({}, 1)],
)
def test_the_nodes_of_a_job_are_its_launchers(monkeypatch, env, nodes):
    """DeepSpeed's CROSS_SIZE, torchrun's GROUP_WORLD_SIZE, else the world over the node's ranks: the startup summary's
    node count and whether a node can fail the input checks alone (startup.py) read it alike."""
    for key in ("CROSS_SIZE", "GROUP_WORLD_SIZE", "WORLD_SIZE", "LOCAL_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert launcher_nodes() == nodes
