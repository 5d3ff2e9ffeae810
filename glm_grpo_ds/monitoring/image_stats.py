"""What the decoded images look like, beyond their reward: cheap per-image statistics and the diversity within
each group, computed on the images a step (or an evaluation) decoded anyway. Imports only torch.

A reward can climb while the images collapse (an OCR reward with no KL blanked the scenes around the text:
dark-pixel fraction 0.45 -> 0.93, colour entropy -54 %, edge density -60 %; Tencent-Hunyuan/UniRL #407), or the
G samples of a prompt become copies of each other. These numbers are what the alarms (monitoring/alarms.py)
watch. Every statistic is a mean over images (per image: over its pixels); docs/monitoring.md says what each
means and what it costs::

    per_image = image_statistics(images)            # {name: [N]}, images [N, 3, H, W] in [0, 1]
    per_group = group_diversity(images, group_size)  # {name: [N / G]}, the G images of a group in a row

Luma is Rec. 601 (0.299 R + 0.587 G + 0.114 B). The statistics are computed on the image as decoded, except
the group distances, which compare copies box-downsampled to at most :data:`DIVERSITY_SIDE` pixels a side (what
two images look like, not their pixel noise, and 64x cheaper at 1024 x 1024).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

DARK_LUMA = 0.1  # a pixel darker than this is "dark" (~26 / 255)
BRIGHT_LUMA = 0.9  # brighter than this is "bright" (~230 / 255)
COLOUR_BINS = 8  # colour entropy: 8 levels per channel, 512 colours, so at most 9 bits
EDGE_THRESHOLD = 0.1  # an edge pixel: Sobel gradient of luma above this (a full 0 -> 1 step reads 1)
HIGH_FREQUENCY = 0.25  # high-frequency share: spectral energy above this fraction of the sampling rate
DIVERSITY_SIDE = 128
LPIPS_SIDE = 256  # lpips_diversity compares copies at most this big: 28 pairs of G = 8 at 1024^2 would cost 16x
NEAR_DUPLICATE = 0.02  # two images whose RMS pixel distance (downsampled, in [0, 1]) is below this are copies

# name -> what it measures, in the order they are logged (the names monitor.statistics takes)
PER_IMAGE = {
    "brightness": "mean luma, 0 (black) to 1 (white)",
    "dark_fraction": f"share of pixels with luma below {DARK_LUMA}",
    "bright_fraction": f"share of pixels with luma above {BRIGHT_LUMA}",
    "saturation": "mean HSV saturation, (max - min) / max of R, G, B; 0 = grey",
    "colour_entropy": f"entropy in bits of the colour histogram ({COLOUR_BINS} levels a channel; 0 = one colour, "
    f"max {3 * math.log2(COLOUR_BINS):.0f})",
    "edge_density": f"share of pixels whose Sobel gradient of luma exceeds {EDGE_THRESHOLD}",
    "high_frequency": f"share of the luma's spectral energy (mean removed) above {HIGH_FREQUENCY} of the sampling "
    "rate; 0 = smooth, white noise ~0.8",
}
PER_GROUP = {
    "diversity": "mean RMS pixel distance between the G images of a prompt, pairwise (0 = identical copies)",
    "near_duplicates": f"share of a group's image pairs closer than {NEAR_DUPLICATE} RMS: copies of each other",
    "lpips_diversity": "mean LPIPS distance between the G images of a prompt, pairwise, with the network of the "
    "run's lpips reward (computed only when one is configured)",
}
NEEDS_DISTANCE = ("lpips_diversity",)  # group statistics computed only with a perceptual distance function
STATISTICS = {**PER_IMAGE, **PER_GROUP}


def luma(images: torch.Tensor) -> torch.Tensor:
    """``[N, H, W]`` Rec. 601 luma of ``[N, 3, H, W]`` RGB images in [0, 1]."""
    weights = torch.tensor([0.299, 0.587, 0.114], dtype=images.dtype, device=images.device)
    return torch.einsum("nchw,c->nhw", images, weights)


def image_statistics(images: torch.Tensor, names=None) -> dict[str, torch.Tensor]:
    """``{name: [N] float32}`` of :data:`PER_IMAGE` (or the ``names`` among them) for ``[N, 3, H, W]`` in [0, 1]."""
    images = images.detach().float().clamp(0, 1)
    names = list(PER_IMAGE) if names is None else [n for n in names if n in PER_IMAGE]
    y = luma(images)
    compute = {
        "brightness": lambda: y.mean(dim=(1, 2)),
        "dark_fraction": lambda: (y < DARK_LUMA).float().mean(dim=(1, 2)),
        "bright_fraction": lambda: (y > BRIGHT_LUMA).float().mean(dim=(1, 2)),
        "saturation": lambda: _saturation(images),
        "colour_entropy": lambda: _colour_entropy(images),
        "edge_density": lambda: (_sobel_magnitude(y) > EDGE_THRESHOLD).float().mean(dim=(1, 2)),
        "high_frequency": lambda: _high_frequency_share(y),
    }
    return {name: compute[name]() for name in names}


def _saturation(images: torch.Tensor) -> torch.Tensor:
    top = images.amax(dim=1)
    spread = top - images.amin(dim=1)
    return torch.where(top > 0, spread / top.clamp_min(1e-12), torch.zeros_like(top)).mean(dim=(1, 2))


def _colour_entropy(images: torch.Tensor) -> torch.Tensor:
    levels = (images * COLOUR_BINS).long().clamp_(0, COLOUR_BINS - 1)  # [N, 3, H, W]
    colour = (levels[:, 0] * COLOUR_BINS + levels[:, 1]) * COLOUR_BINS + levels[:, 2]
    n = images.shape[0]
    bins = COLOUR_BINS**3
    flat = colour.reshape(n, -1) + torch.arange(n, device=images.device).unsqueeze(1) * bins
    counts = torch.bincount(flat.reshape(-1), minlength=n * bins).reshape(n, bins).float()
    p = counts / counts.sum(dim=1, keepdim=True)
    return (p * torch.log2(p.clamp_min(1e-30))).sum(dim=1).abs()  # abs: one colour is 0, not -0


def _sobel_magnitude(y: torch.Tensor) -> torch.Tensor:
    """``[N, H, W]`` Sobel gradient magnitude, scaled so a full 0 -> 1 step edge reads 1 (kernels / 4),
    replicate padding (the border is not an edge)."""
    kx = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]], dtype=y.dtype, device=y.device) / 4
    kernels = torch.stack([kx, kx.T]).unsqueeze(1)  # [2, 1, 3, 3]
    padded = F.pad(y.unsqueeze(1), (1, 1, 1, 1), mode="replicate")
    g = F.conv2d(padded, kernels)
    return g.pow(2).sum(dim=1).sqrt()


def _high_frequency_share(y: torch.Tensor) -> torch.Tensor:
    """Share of the spectral energy of ``y - mean`` at radial frequencies above :data:`HIGH_FREQUENCY` cycles
    per pixel (the Nyquist limit is 0.5); 0 for a flat image."""
    h, w = y.shape[-2:]
    power = torch.fft.fft2(y - y.mean(dim=(1, 2), keepdim=True)).abs().pow(2)
    fy = torch.fft.fftfreq(h, device=y.device).unsqueeze(1)
    fx = torch.fft.fftfreq(w, device=y.device).unsqueeze(0)
    high = (fy.pow(2) + fx.pow(2)).sqrt() > HIGH_FREQUENCY
    total = power.sum(dim=(1, 2))
    share = (power * high).sum(dim=(1, 2)) / total.clamp_min(1e-30)
    return torch.where(total > 0, share, torch.zeros_like(share))


def computable(names, distance=None) -> list[str]:
    """``names`` without the statistics that need a ``distance`` when there is none."""
    return [n for n in names if distance is not None or n not in NEEDS_DISTANCE]


def group_diversity(images: torch.Tensor, group_size: int, names=None, distance=None) -> dict[str, torch.Tensor]:
    """``{name: [N / G] float32}`` of :data:`PER_GROUP` (or the ``names`` among them): ``images`` ``[N, 3, H, W]``
    hold N / G groups of ``group_size`` consecutive samples. A group of one has no pairs: NaN. ``distance(a, b)``:
    ``[P]`` perceptual distances of ``P`` image pairs (the lpips reward's ``distance``), for ``lpips_diversity``,
    which is left out without it; it sees copies at most :data:`LPIPS_SIDE` pixels a side."""
    names = list(PER_GROUP) if names is None else [n for n in names if n in PER_GROUP]
    names = computable(names, distance)
    if not names:
        return {}
    n, _, h, w = images.shape
    groups = n // group_size
    flat = _downsampled(images, DIVERSITY_SIDE).reshape(groups, group_size, -1)
    pairs = torch.triu_indices(group_size, group_size, offset=1, device=images.device)
    # RMS distance of every pair, from the differences themselves (a Gram-matrix shortcut would read ~1e-4 for
    # two identical images through cancellation); G = 8 at 128 x 128: 28 pairs of 49k values a group
    distances = (flat[:, pairs[0]] - flat[:, pairs[1]]).pow(2).mean(dim=-1).sqrt()  # [groups, G (G - 1) / 2]
    if distances.shape[1] == 0:
        nan = torch.full((groups,), float("nan"), device=images.device)
        return {name: nan.clone() for name in names}
    values = {
        "diversity": lambda: distances.mean(dim=1),
        "near_duplicates": lambda: (distances < NEAR_DUPLICATE).float().mean(dim=1),
        "lpips_diversity": lambda: _pair_distances(images, group_size, pairs, distance),
    }
    return {name: values[name]() for name in names}


def _downsampled(images: torch.Tensor, side: int) -> torch.Tensor:
    """``images`` box-filtered to at most ``side`` pixels a side (the mean of each block: what the eye sees from
    afar), as float in [0, 1]."""
    small = images.detach().float().clamp(0, 1)
    h, w = small.shape[-2:]
    if max(h, w) > side:
        scale = side / max(h, w)
        small = F.adaptive_avg_pool2d(small, (max(1, round(h * scale)), max(1, round(w * scale))))
    return small


def _pair_distances(images: torch.Tensor, group_size: int, pairs: torch.Tensor, distance) -> torch.Tensor:
    """``[groups]``: the mean of ``distance`` over every pair of each group's images (at most :data:`LPIPS_SIDE`
    pixels a side), in one call."""
    small = _downsampled(images, LPIPS_SIDE)
    grouped = small.reshape(-1, group_size, *small.shape[1:])
    a = grouped[:, pairs[0]].reshape(-1, *small.shape[1:])
    b = grouped[:, pairs[1]].reshape(-1, *small.shape[1:])
    with torch.no_grad():
        d = distance(a, b).float().reshape(grouped.shape[0], -1)
    return d.mean(dim=1)


def sample_table(images: torch.Tensor, group_size: int, names: list[str], distance=None) -> torch.Tensor:
    """``[N, len(names)]`` float32: each sample's statistics in ``names`` order, a group statistic repeated for
    each sample of its group (so one gather carries them all, and a mean over samples is the mean over groups).
    ``names`` must be :func:`computable` with ``distance``."""
    if not names:
        return torch.empty(images.shape[0], 0, device=images.device)
    per_image = image_statistics(images, names)
    per_group = {
        k: v.repeat_interleave(group_size) for k, v in group_diversity(images, group_size, names, distance).items()
    }
    values = {**per_image, **per_group}
    return torch.stack([values[name].float() for name in names], dim=1)


def summarize(names: list[str], table: torch.Tensor, prefix: str = "images/") -> dict[str, float]:
    """``{prefix + name: mean, prefix + name + "_spread": std}`` over the rows of :func:`sample_table`'s
    (gathered) table, NaN rows (a group of one has no distances) left out, None when none is left; population
    std (a spread, not an estimate)."""
    out = {}
    for j, name in enumerate(names):
        column = table[:, j]
        column = column[~torch.isnan(column)]
        present = column.numel() > 0
        out[prefix + name] = column.mean().item() if present else None
        out[prefix + name + "_spread"] = column.std(correction=0).item() if present else None
    return out
