"""Two real gloo ranks for the unit tests of collectives: each runs ``target(rank, port, *args, results)`` in a
spawned process (a fresh interpreter: no thread or lock of the pytest worker is forked) and puts what it saw on the
``results`` queue; the caller gets every result put.

    from gloo_ranks import two_gloo_ranks   # a test module (tests/ is on the path: tests/conftest.py)
    got = two_gloo_ranks(_my_rank, tmp_path)            # _my_rank(rank, port, tmp_path, results): module level
    init_gloo(rank, port, 2, timeout_s=1)                # in a rank: a group whose collectives give up after 1 s
"""

import datetime

import torch
import torch.multiprocessing as mp

from glm_grpo_ds.runtime.ports import free_port


def two_gloo_ranks(target, *args, per_rank: int = 1, timeout_s: float = 120) -> list:
    """Start ``target`` as ranks 0 and 1 on one free port; the ``2 * per_rank`` results they put, in arrival order.
    ``target`` must be importable (a module-level function of a test module)."""
    port = free_port()  # below the ephemeral range: no gloo connection takes it meanwhile
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=(rank, port, *args, results)) for rank in (0, 1)]
    for p in procs:
        p.start()
    try:
        return [results.get(timeout=timeout_s) for _ in range(2 * per_rank)]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()


def init_gloo(rank: int, port: int, world: int, timeout_s: float | None = None) -> None:
    """The world group on ``port``; with ``timeout_s``, its collectives give up after that long. The timeout is set
    once the ranks have met: init_process_group's is also how long they wait for each other to arrive, and freshly
    spawned ranks import torch seconds apart on a loaded machine."""
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    if timeout_s is not None:
        timeout = datetime.timedelta(seconds=timeout_s)
        set_timeout = getattr(torch.distributed, "set_timeout", None)  # torch >= 2.12; before, the private one
        set_timeout(timeout) if set_timeout else torch.distributed.distributed_c10d._set_pg_timeout(timeout)
