"""``glm-grpo decode-agreement``: does a cheap training decode rank a group's samples like the full one?

GRPO only uses each group's rewards relative to each other (the advantages), so the decode that feeds
training rewards (``decoder.num_inference_steps`` / ``decoder.guidance_scale``) may be far cheaper than
the decode users look at, as long as it ranks a group's samples the same way. This command samples the
config's groups with the base AR (or ``--adapter``), decodes the same token grids with the same noise
both ways, scores both with the config's rewards and prints, per reward and for the weighted total:

- ``spearman``: the within-group Spearman rank correlation of the two decodes' rewards, mean over
  groups (a group whose rewards are constant under either decode has no ranking and is left out);
- ``best_same``: the fraction of groups whose best sample (highest reward, first on ties) is the same;
- the time ratio of each candidate decode to the reference decode.

Run it before a long job, on the job's config, and choose the cheapest candidate that keeps both near 1::

    glm-grpo decode-agreement --config launch/configs/glm_image_lora.yaml \\
        --candidate 8:1.0 --candidate 8:1.5:3 --candidate 30:1.5 --num-prompts 16 --out agreement.json
    glm-grpo decode-agreement --config launch/configs/tiny_cpu.yaml model.path=outputs/tiny   # the tiny model

Candidates are ``STEPS:GUIDANCE``, or ``STEPS:GUIDANCE:N`` for guidance on the first N steps only
(``decoder.guidance_steps``), either with ``+fp8`` for the DiT's block linears in float8 (``decoder.fp8``;
default: the config's training decode); the reference is
``--reference STEPS:GUIDANCE``, else ``eval.*``, else the pipeline's own (50 steps, guidance 1.5 for
GLM-Image). ``key=value`` arguments override the config as for ``glm-grpo train``. One process, no
DeepSpeed: the AR, the decoder and the rewards must fit one device. The decoder loads once, without FP8: the
reference and the other candidates decode first, then its linears are converted for the ``+fp8`` ones. A GPU that
runs out of memory ends it with one line (:func:`oom_line`) and exit 8.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import torch

from .cli import parser_for

if TYPE_CHECKING:
    from ..decoder import DecodeSettings

GROUP_NOTE = "groups ranked: groups whose rewards vary under both decodes (others have no ranking to agree on)"


def group_rank_agreement(reference: torch.Tensor, candidate: torch.Tensor, group_size: int) -> dict:
    """Within-group agreement of two rewards of the same ``[P * G]`` samples (group by group): the mean
    Spearman correlation over groups where both vary and are defined, and the fraction of those groups whose
    best sample (argmax, first on ties) is the same. NaN when no group qualifies. Also the largest difference of
    a sample's two rewards (0: the candidate's decode moved no reward at all)."""
    from scipy.stats import spearmanr

    ref = reference.reshape(-1, group_size).double()
    cand = candidate.reshape(-1, group_size).double()
    rhos, same = [], []
    for r, c in zip(ref, cand):
        if torch.isnan(r).any() or torch.isnan(c).any() or r.min() == r.max() or c.min() == c.max():
            continue
        rhos.append(float(spearmanr(r.numpy(), c.numpy()).statistic))
        same.append(int(r.argmax()) == int(c.argmax()))
    return {
        "spearman": sum(rhos) / len(rhos) if rhos else math.nan,
        "best_same": sum(same) / len(same) if same else math.nan,
        "groups_ranked": len(rhos),
        "groups": ref.shape[0],
        "max_reward_diff": float((ref - cand).abs().nan_to_num(0.0).max()),
    }


class Candidate(NamedTuple):
    """A decode to rate: its denoising settings, and whether the DiT's block linears run in FP8."""

    settings: DecodeSettings
    fp8: bool = False

    def record(self) -> dict:
        return {**self.settings.record(), **({"fp8": True} if self.fp8 else {})}


def parse_candidate(text: str) -> Candidate:
    """``STEPS:GUIDANCE[:N][+fp8]`` -> :class:`Candidate`, or ValueError naming ``--candidate``."""
    base, plus, option = text.partition("+")
    if plus and option != "fp8":
        raise ValueError(f"--candidate {text!r}: the only option after '+' is fp8 (e.g. 8:1.5+fp8)")
    return Candidate(parse_settings(base, "--candidate"), fp8=bool(plus))


def parse_settings(text: str, flag: str):
    """``STEPS:GUIDANCE[:GUIDED_STEPS]`` -> DecodeSettings, or ValueError naming ``flag``."""
    from ..config.checks import decode_problems
    from ..decoder import DecodeSettings

    try:
        steps, guidance, *guided = text.split(":")
        if len(guided) > 1:
            raise ValueError
        settings = DecodeSettings(int(steps), float(guidance), int(guided[0]) if guided else None)
    except ValueError:
        raise ValueError(
            f"{flag} {text!r} must be STEPS:GUIDANCE or STEPS:GUIDANCE:GUIDED_STEPS, e.g. 8:1.0 or 8:1.5:3"
        ) from None
    steps, guidance, guided_steps = settings
    problems = decode_problems(steps, guidance, f"{flag} {text}: ", guided_steps)
    if problems:
        raise ValueError(problems[0])
    return settings


def parse_args(argv: list[str]) -> argparse.Namespace:
    from ..config.arguments import parse_with_overrides

    p = parser_for("decode-agreement")
    p.add_argument("--config", required=True, help="the training config (YAML) whose decode, rewards and data to use")
    p.add_argument(
        "--candidate",
        action="append",
        default=[],
        metavar="STEPS:GUIDANCE[:N][+fp8]",
        help="a cheap decode to rate, guided on its first N steps when N is given, with the DiT's block linears in "
        "FP8 with +fp8 (repeatable; default: the config's decoder.num_inference_steps:guidance_scale"
        "[:guidance_steps][+fp8])",
    )
    p.add_argument(
        "--reference",
        default=None,
        metavar="STEPS:GUIDANCE",
        help="the full decode (default: eval.num_inference_steps / eval.guidance_scale, null = the pipeline's own)",
    )
    p.add_argument(
        "--num-prompts", type=int, default=8, help="groups to sample: the first N prompts of data.train_file"
    )
    p.add_argument("--adapter", default=None, help="a LoRA adapter (final_adapter/ of a run) to sample with")
    p.add_argument("--device", default="auto", help="auto = cuda when available, else cpu")
    p.add_argument("--out", default=None, help="also write the result as JSON to this file")
    p.add_argument("overrides", nargs="*", help="config overrides, key=value (as for glm-grpo train)")
    return parse_with_overrides(p, argv)


def sample_groups(cfg, rows, adapter, device: torch.device):
    """(the rollout batch, the model's directory): one group of ``cfg.grpo.group_size`` per prompt row, sampled
    by the policy (with ``adapter``'s LoRA layers on top, unmerged), whose memory is freed on return."""
    from ..model.adapters import find_adapter
    from ..model.policy import load_for_sampling
    from ..rollout.backends import ModelSampler
    from ..runtime import oom
    from ..runtime.seeding import derive_seed

    m = cfg.model
    adapters = [] if adapter is None else [str(find_adapter(adapter))]
    loaded = load_for_sampling(
        m.path, m.revision, m.dtype, m.attn_implementation, cfg.grpo.sampling, device, adapters, m.trust_remote_code
    )
    sampler = ModelSampler(loaded.model, loaded.processor, cfg.rollout, loaded.sampling, device)
    with oom.marking(phase="rollout"):  # the command's line names it (oom_line)
        got = sampler.sample([r.prompt for r in rows], [derive_seed(cfg.seed, "decode-agreement")], cfg.grpo.group_size)
    return got.batch, loaded.model_dir


def measure(cfg, candidates, reference, num_prompts: int, adapter, device: torch.device) -> dict:
    """Sample, decode each way, score: the result :func:`main` prints (see the module docstring)."""
    from ..advantages import weighted_total
    from ..data import load_prompts
    from ..decoder import ImageDecoder
    from ..decoder.fp8 import is_fp8, to_fp8
    from ..experience import ToScore, decode_and_score
    from ..observability.meter import Meter
    from ..rewards import build_rewards
    from ..runtime.seeding import derive_seed

    rows = load_prompts(cfg.data.train_file, "data.train_file", cfg.data)[:num_prompts]
    reward_fn = build_rewards(cfg.rewards)
    g = cfg.grpo.group_size
    batch, model_dir = sample_groups(cfg, rows, adapter, device)  # the AR's memory freed before the decoder loads
    decoder = ImageDecoder(model_dir, replace(cfg.decoder, fp8=False), device)  # FP8 only for its candidates
    sample_rows = [rows[i] for i in batch.prompt_index.tolist()]
    seeds = [derive_seed(cfg.decoder.seed, "decode-agreement", row.index) % 2**31 for row in sample_rows]
    targets = [row.reward_sample() for row in sample_rows]
    size = (cfg.rollout.height, cfg.rollout.width)

    def scored(settings):
        # the experience path's decode and score; not streamed, so the seconds are the decode's alone
        meter = Meter(device)
        todo = ToScore(batch.prior_token_ids, batch.prompts, size, seeds, targets, settings)
        _, per_reward = decode_and_score(decoder, reward_fn, todo, meter)
        per_reward = {label: values.float().cpu() for label, values in per_reward.items()}
        if len(per_reward) > 1:
            per_reward["total"] = weighted_total(per_reward, reward_fn.weights, g)
        return per_reward, meter.timings["decode"]

    every = [reference, *(c.settings for c in candidates)]
    warm_up = partial(warm_up_shapes, decoder, batch.prior_token_ids, batch.prompts, size, seeds, every)
    warm_up()
    ref_rewards, ref_seconds = scored(reference)
    result = {
        "reference": {**reference.record(), "seconds": ref_seconds},
        "groups": len(rows),
        "group_size": g,
        "image": [cfg.rollout.height, cfg.rollout.width],
        "candidates": [],
    }
    rated = {}
    # the full-precision candidates first, then the DiT's linears converted once for the FP8 ones
    for i in sorted(range(len(candidates)), key=lambda i: candidates[i].fp8):
        if candidates[i].fp8 and not is_fp8(decoder.pipe.transformer):
            to_fp8(decoder.pipe.transformer)
            warm_up()  # untimed: the FP8 kernels' first call (and, compiled, the blocks' recompile)
        rewards, seconds = scored(candidates[i].settings)
        rated[i] = {
            **candidates[i].record(),
            "seconds": seconds,
            "time_ratio": seconds / ref_seconds,
            "saves_time": seconds < ref_seconds,
            "rewards": {label: group_rank_agreement(ref_rewards[label], rewards[label], g) for label in rewards},
        }
    result["candidates"] = [rated[i] for i in range(len(candidates))]
    return result


def warm_up_shapes(decoder, prior_token_ids, prompts, size, seeds, every) -> None:
    """Untimed: decode the whole batch once with one step of each kind the timed decodes run (unguided, guided:
    ``every``, their DecodeSettings), so each DiT batch shape they meet (the batch's split, each prompt's glyph
    length, with and without the unconditional pass) has had its first call (allocations, kernel selection; with
    decoder.compile, its recompile), and none of it lands in the reference's seconds, timed first."""
    from ..decoder import DecodeSettings

    guided = [s.guidance_scale for s in every if s.guided_steps]
    # two steps guided on the first: both shapes in one decode; no guided setting: one unguided step
    settings = DecodeSettings(2, max(guided), 1) if guided else DecodeSettings(1, 1.0)
    decoder.decode(prior_token_ids, prompts, *size, seeds, settings)


def decode_name(steps: int, guidance: float, guidance_steps: int | None = None, fp8: bool = False) -> str:
    """``8 steps, guidance 1`` (``1 step, ...``; ``8 steps, guidance 1.5 x3``: guided on the first 3; ``... fp8``:
    the DiT's block linears in FP8)."""
    from ..decoder.settings import guided_steps

    guided = guided_steps(steps, guidance, guidance_steps)
    name = f"{steps} step{'s' * (steps != 1)}, guidance {guidance:g}" + (f" x{guided}" if 0 < guided < steps else "")
    return name + " fp8" * fp8


def report(result: dict) -> str:
    """The result as lines of text; a candidate whose decode took at least the reference's time is named after
    the table (it saves nothing, whatever its agreement)."""
    ref = result["reference"]
    ref_name = decode_name(ref["num_inference_steps"], ref["guidance_scale"], ref.get("guidance_steps"))
    w = max([20, *(len(label) for c in result["candidates"] for label in c["rewards"])])  # python:... names are long
    lines = [
        f"{result['groups']} groups of {result['group_size']}, {result['image'][0]}x{result['image'][1]}; reference: "
        f"{ref_name}, {ref['seconds']:.2f} s",
        f"{'candidate':<28} {'time':>6} {'reward':<{w}} {'spearman':>8} {'best_same':>9} {'groups ranked':>13}",
    ]
    slower = []
    for c in result["candidates"]:
        name = decode_name(c["num_inference_steps"], c["guidance_scale"], c.get("guidance_steps"), c.get("fp8", False))
        if c["time_ratio"] >= 1:
            slower.append(f"{name} ({c['time_ratio']:.2f}x)")
        for i, (label, a) in enumerate(c["rewards"].items()):
            head = (name, f"{c['time_ratio']:.2f}x") if i == 0 else ("", "")
            lines.append(
                f"{head[0]:<28} {head[1]:>6} {label:<{w}} {a['spearman']:>8.3f} {a['best_same']:>9.2f} "
                f"{a['groups_ranked']:>6}/{a['groups']}"
            )
    lines.append(
        "time: the candidate's decode time / the reference's; xN: guided on the first N steps; fp8: the DiT's "
        "block linears in FP8; " + GROUP_NOTE
    )
    if slower:
        lines.append(f"not cheaper than the reference (saves no time): {'; '.join(slower)}")
    return "\n".join(lines)


def oom_line(err: BaseException, a, cfg) -> str:
    """The command's one line when the GPU ran out of memory (memory/oom.py ``command_line``): where, torch's figures
    and the change that makes that phase smaller."""
    from ..memory.oom import command_line, fewer_dit_images

    def change(phase: str | None) -> str | None:
        if phase == "decode":
            return fewer_dit_images(cfg.decoder.batch_size)
        if phase in ("rollout", "reward") and a.num_prompts > 1:
            return (
                f"--num-prompts {a.num_prompts // 2} samples and scores half as many groups at once (now "
                f"{a.num_prompts} of {cfg.grpo.group_size} samples), and measures the agreement on fewer groups"
            )
        return None

    return command_line("decode-agreement", err, change, "nothing was written")


def main(argv: list[str] | None = None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    from ..config import ConfigError, load_config
    from ..decoder import DecodeSettings, resolve_settings
    from ..decoder.compute import check_device
    from ..memory.oom import EXIT_OOM
    from ..model.glm_image import resolve_dtype
    from ..runtime.oom import out_of_memory

    try:
        cfg = load_config(a.config, a.overrides)  # validated
        if a.num_prompts < 1:
            raise ValueError(f"--num-prompts must be >= 1, got {a.num_prompts}")
        d = cfg.decoder
        candidates = [parse_candidate(c) for c in a.candidate] or [
            Candidate(DecodeSettings(d.num_inference_steps, d.guidance_scale, d.guidance_steps), d.fp8)
        ]
        reference = (
            parse_settings(a.reference, "--reference")
            if a.reference
            else resolve_settings(cfg.eval.num_inference_steps, cfg.eval.guidance_scale)
        )
        auto = "cuda" if torch.cuda.is_available() else "cpu"
        device = torch.device(auto if a.device == "auto" else a.device)
        # before anything loads: the DiT's kernel, and FP8 where a candidate asks for it
        fp8 = any(c.fp8 for c in candidates)
        check_device(replace(d, fp8=fp8), device, resolve_dtype(d.dtype, on_gpu=device.type == "cuda"))
        result = measure(cfg, candidates, reference, a.num_prompts, a.adapter, device)
    except (ConfigError, FileNotFoundError, ValueError) as err:
        print(f"glm-grpo decode-agreement: {err}", file=sys.stderr)
        return 2
    except RuntimeError as err:
        starved = out_of_memory(err)
        if starved is None:
            raise
        print(oom_line(starved, a, cfg), file=sys.stderr)  # cfg: loaded before anything that allocates
        return EXIT_OOM
    print(report(result))
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
