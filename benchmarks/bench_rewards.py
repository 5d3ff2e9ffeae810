"""Throughput of every built-in reward on this machine, as a table of images/s.

    python benchmarks/bench_rewards.py [--size 256] [--batch 8] [--iters 3] [--device cpu]

Offline: LPIPS runs with a random backbone and the CLIP family with a random ViT-B/32-sized CLIP
written to a temp dir - the same compute as real weights, so the speeds are representative; OCR
scores images with rendered text.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/bench_rewards.py", description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--device", default="cpu")
    a = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from PIL import Image, ImageDraw, ImageFont

    from glm_grpo_ds.rewards import build_reward
    from glm_grpo_ds.testing.tiny_clip import write_aesthetic_head, write_tiny_clip

    device = torch.device(a.device)
    tmp = tempfile.mkdtemp(prefix="glm_grpo_bench_")
    clip_dir = write_tiny_clip(os.path.join(tmp, "clip"), size="base")
    head = write_aesthetic_head(os.path.join(tmp, "head.pth"), dim=512)
    img = Image.new("RGB", (a.size, a.size), "white")
    ImageDraw.Draw(img).text(
        (8, a.size // 3), "HELLO 2026", fill="black", font=ImageFont.load_default(size=a.size // 8)
    )
    img.save(os.path.join(tmp, "target.png"))
    x = (
        torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8).view(a.size, a.size, 3).permute(2, 0, 1).float()
        / 255
    )
    images = (x.unsqueeze(0) + 0.05 * torch.randn(a.batch, 3, a.size, a.size)).clamp(0, 1).to(device)
    prompts = ["a sign that says 'HELLO 2026'"] * a.batch
    samples = [{"target_image": os.path.join(tmp, "target.png")}] * a.batch
    rewards = {
        "pixel_mse": {},
        "ssim": {},
        "lpips": {"pretrained_backbone": False},
        "ocr": {},
        "clip": {"model": str(clip_dir)},
        "preference": {"model": str(clip_dir)},
        "aesthetic": {"clip_model": str(clip_dir), "head": str(head)},
    }
    print(f"device={device} torch_threads={torch.get_num_threads()} images={a.batch}x{a.size}x{a.size}")
    print(f"{'reward':<12} {'images/s':>10}")
    for name, args in rewards.items():
        try:
            fn = build_reward(name, args)
        except ValueError as err:
            print(f"{name:<12} {'skipped':>10}  ({err})")
            continue
        fn(images, prompts, samples)  # warm-up (model load, first call)
        start = time.perf_counter()
        for _ in range(a.iters):
            fn(images, prompts, samples)
        rate = a.iters * a.batch / (time.perf_counter() - start)
        print(f"{name:<12} {rate:>10.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
