"""What streaming rewards behind the decode (``decoder.stream_rewards``) gains: decode + reward seconds of
the trainer's own ``experience.decode_and_score``, scored after the decode vs streamed, for two slow rewards.

    python benchmarks/bench_remote.py [--model DIR] [--size 256] [--prompts 1] [--group-size 16] \
        [--decoder-batch 4] [--steps 4] [--delay-s 0.05] [--delay-per-image-s 0.02] [--repeats 3]

The rewards:

- ``remote``: ``glm-grpo reward-server`` in its own process serving testing/reward_servers.py's SlowMean
  (sleeps ``delay_s + delay_per_image_s * N`` per call), reached through the ``remote`` reward;
- ``local``: a reward that sleeps, per image, as long as the decode took per image (measured first, the
  median of ``--repeats``): a reward model as slow as the decode that does not use the CPU (a model on
  another device, a service).

``after``: decode the rank's batch (DiT batches of ``--decoder-batch`` rows of one prompt), then score all
of it; ``streamed``: each DiT batch is scored on a background thread while the next one decodes. Without
``--model`` the tiny GLM-Image is built in a temp dir (random weights; the DiT cost per image is what
matters). Prints the medians of ``--repeats`` runs and how far apart the two modes' rewards are.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/bench_remote.py", description=__doc__.splitlines()[0])
    p.add_argument("--model", help="GLM-Image pipeline directory (default: the tiny one, built in a temp dir)")
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--prompts", type=int, default=1, help="prompts per rank per step")
    p.add_argument("--group-size", type=int, default=16)
    p.add_argument("--decoder-batch", type=int, default=4, help="decoder.batch_size: rows per DiT call")
    p.add_argument("--steps", type=int, default=4, help="decoder inference steps")
    p.add_argument("--delay-s", type=float, default=0.05, help="remote: server seconds per reward call")
    p.add_argument("--delay-per-image-s", type=float, default=0.02, help="remote: server seconds per image")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cpu")
    a = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from glm_grpo_ds.config import DecoderConfig, RewardSpec
    from glm_grpo_ds.decoder import ImageDecoder
    from glm_grpo_ds.experience import ToScore, decode_and_score
    from glm_grpo_ds.observability.meter import Meter
    from glm_grpo_ds.rewards import build_rewards
    from glm_grpo_ds.rewards.registry import RewardSet
    from glm_grpo_ds.testing.reward_servers import server_process
    from glm_grpo_ds.testing.tiny import CODEBOOK_SIZE, build_tiny_pipeline

    tmp = Path(tempfile.mkdtemp(prefix="glm_grpo_bench_remote_"))
    model = a.model or str(build_tiny_pipeline(tmp / "tiny", seed=0))
    device = torch.device(a.device)
    decoder = ImageDecoder(model, DecoderConfig(num_inference_steps=a.steps, batch_size=a.decoder_batch), device)
    n, tokens = a.prompts * a.group_size, (a.size // 16) ** 2
    prior = torch.randint(0, CODEBOOK_SIZE, (n, tokens), generator=torch.Generator().manual_seed(0))
    prompts = [f"prompt {i // a.group_size}" for i in range(n)]
    seeds = [i // a.group_size for i in range(n)]
    samples = [{"index": i // a.group_size} for i in range(n)]
    size = (a.size, a.size)
    todo = ToScore(prior, prompts, size, seeds, samples)

    image_seconds = []
    for _ in range(a.repeats + 1):  # the first is a warm-up
        start = time.perf_counter()
        decoder.decode(prior, prompts, *size, seeds)
        image_seconds.append((time.perf_counter() - start) / n)
    per_image_s = statistics.median(image_seconds[1:])

    def as_slow_as_the_decode(images, prompts, samples):
        time.sleep(per_image_s * len(images))
        return torch.stack([image.mean() for image in images])  # one image at a time: any batching, same values

    def measure(rewards) -> dict:
        results = {}
        for mode, stream in (("after", False), ("streamed", True)):
            runs = []
            for _ in range(a.repeats):
                meter = Meter(device)
                start = time.perf_counter()
                _, values = decode_and_score(decoder, rewards, todo, meter, stream)
                runs.append({**meter.timings, "total": time.perf_counter() - start, "values": values})
            results[mode] = runs
        return results

    plugin = "python:glm_grpo_ds.testing.reward_servers:SlowMean"
    delays = ["--reward-arg", f"delay_s={a.delay_s}", "--reward-arg", f"delay_per_image_s={a.delay_per_image_s}"]
    with server_process(tmp / "server", "--reward", plugin, *delays, "--log-level", "warning") as (url, _):
        remote = build_rewards([RewardSpec(name="remote", args={"url": url})])
        decode_and_score(decoder, remote, todo, Meter(device), True)  # warm-up
        table = {"remote": measure(remote)}
    table["local"] = measure(RewardSet([("local", 1.0, as_slow_as_the_decode)]))

    print(
        f"device={a.device} images={n} ({a.prompts} prompts x {a.group_size}, DiT batches of {a.decoder_batch}) "
        f"size={a.size} decoder_steps={a.steps}; remote server {a.delay_s} s/call + {a.delay_per_image_s} s/image; "
        f"local reward sleeps the decode's {per_image_s:.3f} s/image  (median of {a.repeats})"
    )
    print(f"{'reward':<7} {'mode':<9} {'decode s':>9} {'reward wait s':>14} {'decode+reward s':>16}")
    for reward, results in table.items():
        med = {}
        for mode, runs in results.items():
            med[mode] = {k: statistics.median(r[k] for r in runs) for k in ("decode", "reward", "total")}
            m = med[mode]
            print(f"{reward:<7} {mode:<9} {m['decode']:>9.3f} {m['reward']:>14.3f} {m['total']:>16.3f}")
        # a float sum over an image rounds by its memory alignment: slices of a 4-image and a 16-image tensor
        # may differ in the last bit
        diff = max(
            (x - y).abs().max().item()
            for x, y in zip(results["after"][-1]["values"].values(), results["streamed"][-1]["values"].values())
        )
        gain = 1 - med["streamed"]["total"] / med["after"]["total"]
        print(f"{reward:<7} streaming saves {gain:.1%} of decode+reward; rewards differ by at most {diff:.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
