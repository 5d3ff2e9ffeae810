"""What overlapping a remote reward with the decode would gain: decode + reward seconds, sequential vs
overlapped, against an artificially slow reward server.

    python -m glm_grpo_ds.commands.bench_remote [--model DIR] [--size 256] [--prompts 1] [--group-size 16] \
        [--decoder-batch 4] [--steps 4] [--delay-s 0.05] [--delay-per-image-s 0.02] [--repeats 3]

The server is ``glm-grpo reward-server`` in its own process, serving testing/reward_servers.py's
SlowMean (sleeps ``delay_s + delay_per_image_s * N`` per call). ``sequential`` is what the trainer
does (experience.py): decode the rank's batch (DiT batches of ``--decoder-batch`` rows of one prompt),
then one ``remote`` request for all its images. ``overlapped`` sends each DiT batch's images as soon
as they are decoded, on one background thread, while the next DiT batch decodes; it waits for the
last answer at the end (the most an overlap inside one step can hide: all but the last batch's
reward). Without ``--model`` the tiny GLM-Image is built in a temp dir (random weights; the DiT cost
per image is what matters). Prints the medians of ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m glm_grpo_ds.commands.bench_remote", description=__doc__.splitlines()[0])
    p.add_argument("--model", help="GLM-Image pipeline directory (default: the tiny one, built in a temp dir)")
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--prompts", type=int, default=1, help="prompts per rank per step")
    p.add_argument("--group-size", type=int, default=16)
    p.add_argument("--decoder-batch", type=int, default=4, help="decoder.batch_size: rows per DiT call")
    p.add_argument("--steps", type=int, default=4, help="decoder inference steps")
    p.add_argument("--delay-s", type=float, default=0.05, help="server seconds per reward call")
    p.add_argument("--delay-per-image-s", type=float, default=0.02, help="server seconds per image")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cpu")
    a = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from ..config import DecoderConfig
    from ..decoder import ImageDecoder
    from ..rewards import build_reward
    from ..testing.reward_servers import server_process
    from ..testing.tiny import CODEBOOK_SIZE, build_tiny_pipeline

    tmp = Path(tempfile.mkdtemp(prefix="glm_grpo_bench_remote_"))
    model = a.model or str(build_tiny_pipeline(tmp / "tiny", seed=0))
    decoder = ImageDecoder(model, DecoderConfig(num_inference_steps=a.steps, batch_size=a.decoder_batch), a.device)
    n, tokens = a.prompts * a.group_size, (a.size // 16) ** 2
    prior = torch.randint(0, CODEBOOK_SIZE, (n, tokens), generator=torch.Generator().manual_seed(0))
    prompts = [f"prompt {i // a.group_size}" for i in range(n)]
    seeds = [i // a.group_size for i in range(n)]
    samples = [{"index": i // a.group_size} for i in range(n)]
    chunks = [  # the decoder's DiT batches: rows of one prompt, decoder_batch at a time
        list(range(start, min(start + a.decoder_batch, (g + 1) * a.group_size)))
        for g in range(a.prompts)
        for start in range(g * a.group_size, (g + 1) * a.group_size, a.decoder_batch)
    ]
    plugin = "python:glm_grpo_ds.testing.reward_servers:SlowMean"
    delays = ["--reward-arg", f"delay_s={a.delay_s}", "--reward-arg", f"delay_per_image_s={a.delay_per_image_s}"]
    with server_process(tmp / "server", "--reward", plugin, *delays, "--log-level", "warning") as (url, _):
        remote = build_reward("remote", {"url": url})
        pool = ThreadPoolExecutor(1)

        def sequential() -> dict:
            t0 = time.perf_counter()
            images = decoder.decode(prior, prompts, a.size, a.size, seeds)
            t1 = time.perf_counter()
            values = remote(images, prompts, samples)
            t2 = time.perf_counter()
            return {"decode": t1 - t0, "reward": t2 - t1, "total": t2 - t0, "values": values}

        def overlapped() -> dict:
            t0 = time.perf_counter()
            futures = []
            for idx in chunks:
                images = decoder.decode(prior[idx], [prompts[i] for i in idx], a.size, a.size, [seeds[i] for i in idx])
                futures.append(pool.submit(remote, images, [prompts[i] for i in idx], [samples[i] for i in idx]))
            t1 = time.perf_counter()
            values = torch.cat([f.result() for f in futures])
            t2 = time.perf_counter()
            return {"decode": t1 - t0, "reward": t2 - t1, "total": t2 - t0, "values": values}

        sequential(), overlapped()  # warm-up
        runs = {"sequential": [], "overlapped": []}
        for _ in range(a.repeats):
            runs["sequential"].append(sequential())
            runs["overlapped"].append(overlapped())
        pool.shutdown()
    same = torch.equal(runs["sequential"][-1]["values"], runs["overlapped"][-1]["values"])
    print(
        f"device={a.device} images={n} ({a.prompts} prompts x {a.group_size}, DiT batches of {a.decoder_batch}) "
        f"size={a.size} decoder_steps={a.steps} "
        f"server delay={a.delay_s} s/call + {a.delay_per_image_s} s/image  (median of {a.repeats})"
    )
    print(f"{'mode':<11} {'decode s':>9} {'reward wait s':>14} {'decode+reward s':>16}")
    med = {}
    for mode, rs in runs.items():
        med[mode] = {k: statistics.median(r[k] for r in rs) for k in ("decode", "reward", "total")}
        m = med[mode]
        print(f"{mode:<11} {m['decode']:>9.3f} {m['reward']:>14.3f} {m['total']:>16.3f}")
    gain = 1 - med["overlapped"]["total"] / med["sequential"]["total"]
    print(f"overlap saves {gain:.1%} of decode+reward; same rewards: {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
