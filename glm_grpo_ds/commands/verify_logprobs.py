"""``glm-grpo verify-logprobs``: check that the trainer's log-probs equal the sampler's.

Samples a rollout (G grids for each of P prompts of different lengths, so left padding is
exercised), recomputes the log-probs of the sampled tokens teacher-forced in one forward, and
prints ``max_abs_diff=<float> mean_abs_diff=<float>``. Exits 1 when the max exceeds the tolerance.
Run it on your install, attention kernel and model before spending GPU hours:

    glm-grpo verify-logprobs --model outputs/tiny
    glm-grpo verify-logprobs --model zai-org/GLM-Image --dtype bf16 --attn flash_attention_2 --height 1024 --width 1024
    glm-grpo verify-logprobs --model outputs/tiny --dtype bf16 --top-k 3 --top-p 0.5 --temperature 0.7

``--model`` is a pipeline directory or a Hub id (glm_grpo_ds/model/source.py; ``--revision`` pins it).
Sampling defaults to the model's own settings (see glm_grpo_ds/model/glm_image.py ``resolve_sampling``). The
log-probs compared are under the policy distribution (codebook mask + temperature), also when top-k /
top-p cut the draw (glm_grpo_ds/sampling.py says why); a sampled token with a non-finite teacher-forced
log-prob fails the check.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from ..config import SamplingConfig
from .cli import parser_for

# Prompts of clearly different token lengths, so batched rows are left padded differently.
PROMPTS = [
    "a red cube",
    "a watercolor painting of a lighthouse on a cliff at sunset, with gulls and a sign that says 'KEEP OUT'",
    "two cats",
    "a neon shop sign reading 'OPEN 24 HOURS' above a rainy street at night, cinematic lighting",
]


@dataclass
class VerifyConfig:
    """``glm-grpo verify-logprobs``: sampler vs teacher-forced log-prob parity check."""

    height: int = 64
    width: int = 96
    group_size: int = 3
    num_prompts: int = 2
    dtype: str = "fp32"
    attn: str = "sdpa"
    tolerance: float | None = None  # None = per-dtype default below
    seed: int = 0
    device: str = "auto"  # auto = cuda if available, else cpu

    # Max |sampler - teacher-forced| log-prob accepted by default. fp32 agrees to ~1e-6 on the
    # tiny model; bf16 differs because the KV-cached decode and the full forward round differently.
    DEFAULT_TOLERANCE = {"fp32": 1e-4, "bf16": 5e-2, "fp16": 1e-2}

    def resolved_tolerance(self) -> float:
        return self.tolerance if self.tolerance is not None else self.DEFAULT_TOLERANCE[self.dtype]


def parse_args(argv):
    d = VerifyConfig()
    p = parser_for("verify-logprobs")
    p.add_argument("--model", required=True, help="GLM-Image pipeline: a directory or a Hub id (org/name)")
    p.add_argument("--revision", default=None, help="Hub revision of --model (commit, branch or tag; default main)")
    p.add_argument("--height", type=int, default=d.height, help="image height in pixels")
    p.add_argument("--width", type=int, default=d.width, help="image width in pixels")
    p.add_argument("--group-size", type=int, default=d.group_size, help="samples per prompt")
    p.add_argument("--num-prompts", type=int, default=d.num_prompts, help="prompts sampled")
    p.add_argument(
        "--dtype", choices=sorted(VerifyConfig.DEFAULT_TOLERANCE), default=d.dtype, help="the AR's weights and compute"
    )
    p.add_argument(
        "--attn", choices=["sdpa", "eager", "flash_attention_2"], default=d.attn, help="attention implementation"
    )
    p.add_argument(
        "--tolerance",
        type=float,
        default=d.tolerance,
        help="max accepted |diff| (default per dtype: "
        + ", ".join(f"{k} {v:g}" for k, v in VerifyConfig.DEFAULT_TOLERANCE.items())
        + ")",
    )
    p.add_argument("--temperature", type=float, default=None, help="default: the model's own (generation_config.json)")
    p.add_argument("--top-k", type=int, default=None, help="draw from the top k (0 = off; default: the model's own)")
    p.add_argument(
        "--top-p", type=float, default=None, help="draw from the top-p nucleus (1 = off; default: the model's own)"
    )
    p.add_argument("--seed", type=int, default=d.seed, help="seeds the sampling")
    p.add_argument("--device", default=d.device)
    a = p.parse_args(argv)
    cfg = VerifyConfig(a.height, a.width, a.group_size, a.num_prompts, a.dtype, a.attn, a.tolerance, a.seed, a.device)
    return a.model, a.revision, cfg, SamplingConfig(temperature=a.temperature, top_k=a.top_k, top_p=a.top_p)


def run(
    model: str, revision: str | None, cfg: VerifyConfig, sampling: SamplingConfig
) -> tuple[float, float, int, SamplingConfig]:
    """Return (max, mean) absolute difference between sampler and teacher-forced log-probs, the
    number of sampled tokens whose teacher-forced log-prob is not finite, and the sampling used."""
    import torch

    from ..model.policy import load_for_sampling

    device = torch.device(
        "cuda"
        if cfg.device == "auto" and torch.cuda.is_available()
        else ("cpu" if cfg.device == "auto" else cfg.device)
    )
    loaded = load_for_sampling(model, revision, cfg.dtype, cfg.attn, sampling, device, flags=("--model", "--revision"))
    sampling = loaded.sampling
    batch, recomputed = sampler_and_trainer_logprobs(loaded.model, loaded.processor, cfg, sampling, device)
    diff = (recomputed - batch.sampler_logps).abs()
    return diff.max().item(), diff.mean().item(), int((~torch.isfinite(recomputed)).sum()), sampling


def sampler_and_trainer_logprobs(ar, processor, cfg: VerifyConfig, sampling: SamplingConfig, device):
    """One rollout of ``cfg``'s prompts with ``ar`` (KV-cached, recording the sampler's log-probs) and
    the teacher-forced recomputation of the same tokens: ``(batch, recomputed [N, n])``; the
    sampler's are ``batch.sampler_logps``. Also used by benchmarks/slice_report.py at real width."""
    import torch

    from ..logprobs import completion_logprobs
    from ..rollout import rollout

    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(cfg.num_prompts)]
    generator = torch.Generator(device=device).manual_seed(cfg.seed)
    batch = rollout(ar, processor, prompts, cfg.group_size, cfg.height, cfg.width, sampling, generator, device)
    with torch.no_grad():
        recomputed = completion_logprobs(ar, batch, sampling)
    return batch, recomputed


def main(argv: list[str] | None = None) -> int:
    model, revision, cfg, sampling = parse_args(argv)
    try:
        sampling.validate()
        if cfg.height <= 0 or cfg.width <= 0 or cfg.height % 32 or cfg.width % 32:
            raise ValueError(f"--height/--width must be positive multiples of 32, got {cfg.height}x{cfg.width}")
        max_diff, mean_diff, nonfinite, sampling = run(model, revision, cfg, sampling)
    except (FileNotFoundError, ValueError) as err:
        print(f"glm-grpo verify-logprobs: {err}", file=sys.stderr)
        return 2
    tol = cfg.resolved_tolerance()
    print(f"sampling: temperature {sampling.temperature} top_k {sampling.top_k} top_p {sampling.top_p}")
    # the dtype on the result line too: a file of stdout alone (the FAIL line goes to stderr) names it for check-run
    print(
        f"max_abs_diff={max_diff:.3e} mean_abs_diff={mean_diff:.3e} nonfinite_logprobs={nonfinite} "
        f"({cfg.dtype}, attn={cfg.attn})"
    )
    if nonfinite:
        print(f"FAIL: {nonfinite} sampled tokens have a non-finite teacher-forced log-prob", file=sys.stderr)
        return 1
    if not max_diff <= tol:
        print(
            f"FAIL: max_abs_diff {max_diff:.3e} > tolerance {tol:.1e} ({cfg.dtype}, attn={cfg.attn})", file=sys.stderr
        )
        return 1
    print(f"OK: within tolerance {tol:.1e} ({cfg.dtype}, attn={cfg.attn})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
