"""Two real gloo ranks for the unit tests of collectives: each runs ``target(rank, port, *args, results)`` in a
spawned process (a fresh interpreter: no thread or lock of the pytest worker is forked) and puts what it saw on the
``results`` queue; the caller gets every result put.

    from gloo_ranks import two_gloo_ranks   # a test module (tests/ is on the path: tests/conftest.py)
    got = two_gloo_ranks(_my_rank, tmp_path)            # _my_rank(rank, port, tmp_path, results): module level
"""

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
