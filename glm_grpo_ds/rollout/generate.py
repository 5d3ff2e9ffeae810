"""Rollout: sample G visual-token grids per prompt with the AR policy and record exact log-probs.

For each prompt the AR writes exactly the preview grid (~16x16) and then the target grid
(H/32 x W/32) - no end token is sampled: the grids have a fixed size, so the sequence is complete
when they are full. Every step draws from the policy distribution (codebook mask, temperature once;
:func:`glm_grpo_ds.sampling.policy_logits`) cut to the optional top-k / top-p support, and records the
log-prob of the drawn token under the policy distribution - the one the trainer recomputes (see
glm_grpo_ds/sampling.py for why the ratio is not taken under the truncated one).

Positions. GLM-Image gives generated image tokens 3D rotary positions (t, h, w) that transformers
only produces through a decode-time cache inside ``GlmImageModel``; a plain forward over prompt +
generated ids would give them text positions. We therefore build the position ids of the whole
sequence explicitly (:func:`decode_position_ids`) and pass them both to the KV-cached decode loop
(glm_grpo_ds/rollout/decode_loop.py) and to the teacher-forced pass (:mod:`glm_grpo_ds.logprobs`),
so the two see identical inputs.

Usage::

    batch = rollout(ar, processor, ["a red cube", "a sign 'OPEN'"], group_size=4,
                    height=64, width=96, sampling=SamplingConfig(), generator=g)
    batch.prior_token_ids  # [N, (H/16)*(W/16)] for the DiT
"""

from __future__ import annotations

import torch

from ..config import SamplingConfig
from ..model.glm_image import ar_parts, resolve_sampling
from ..model.prompt_layout import build_prompt_inputs
from .batch import GridSpec, RolloutBatch
from .decode_loop import LoopOptions, decode_tokens


def grid_spec_from_inputs(inputs: dict) -> GridSpec:
    grids = inputs["image_grid_thw"].view(-1, 2, 3)
    if not (grids == grids[:1]).all():
        raise ValueError("all prompts of a rollout must share one target size")
    (_, lh, lw), (_, ph, pw) = grids[0].tolist()
    return GridSpec(large=(lh, lw), preview=(ph, pw))


def decode_position_ids(prompt_positions: torch.Tensor, prompt_mask: torch.Tensor, grid: GridSpec) -> torch.Tensor:
    """3D rotary positions ``[3, B, n]`` of the generated tokens (preview grid, then target grid).

    Each grid starts at ``s`` = one past the last position used so far; its token at (row, col)
    gets (t, h, w) = (s, s + row, s + col); the next grid starts at ``s + max(rows, cols)``.
    This mirrors ``GlmImageModel.get_rope_index``'s decode cache (a test checks that it does).
    """
    valid = prompt_mask.bool().unsqueeze(0)  # [1, B, L]
    start = torch.where(valid, prompt_positions, torch.zeros_like(prompt_positions)).amax(dim=(0, 2)) + 1  # [B]
    parts = []
    for rows, cols in (grid.preview, grid.large):
        r = torch.arange(rows, device=start.device).repeat_interleave(cols)
        c = torch.arange(cols, device=start.device).repeat(rows)
        s = start.unsqueeze(1)  # [B, 1]
        parts.append(torch.stack([s.expand(-1, rows * cols), s + r, s + c]))  # [3, B, rows*cols]
        start = start + max(rows, cols)
    return torch.cat(parts, dim=2)


def prompt_position_ids(ar, inputs: dict) -> torch.Tensor:
    """``[3, B, L]`` positions of the prompt tokens, from GLM-Image's own ``get_rope_index``."""
    body, _, _ = ar_parts(ar)
    positions, _ = body.get_rope_index(
        inputs["input_ids"],
        image_grid_thw=inputs["image_grid_thw"],
        images_per_sample=inputs["images_per_sample"],
        attention_mask=inputs["attention_mask"],
    )
    return positions


def _repeat_rows(inputs: dict, group_size: int) -> dict:
    """Each prompt G times, consecutively (rows ordered group by group)."""
    grids = inputs["image_grid_thw"].view(-1, 2, 3).repeat_interleave(group_size, dim=0).reshape(-1, 3)
    return {
        "input_ids": inputs["input_ids"].repeat_interleave(group_size, dim=0),
        "attention_mask": inputs["attention_mask"].repeat_interleave(group_size, dim=0),
        "image_grid_thw": grids,
        "images_per_sample": inputs["images_per_sample"].repeat_interleave(group_size, dim=0),
    }


def prepare_rows(ar, processor, prompts: list[str], group_size: int, height: int, width: int, device):
    """The decode loop's inputs: ``(rows, positions, grid)`` = each prompt's chat-templated input G times
    (:func:`build_prompt_inputs` keys, ``[P*G, L]``), the 3D positions of prompt + generated tokens
    ``[3, P*G, L + n]`` and the grids' :class:`GridSpec`."""
    inputs = build_prompt_inputs(processor, prompts, height, width, device=device)
    grid = grid_spec_from_inputs(inputs)
    rows = _repeat_rows(inputs, group_size)
    # a row's positions are its own alone: found once per prompt (transformers' get_rope_index loops over rows, with
    # host syncs in each), then repeated like the rows
    prompt_pos = prompt_position_ids(ar, inputs).repeat_interleave(group_size, dim=1)
    positions = torch.cat([prompt_pos, decode_position_ids(prompt_pos, rows["attention_mask"], grid)], dim=2)
    return rows, positions, grid


def rollout(
    ar,
    processor,
    prompts: list[str],
    group_size: int,
    height: int,
    width: int,
    sampling: SamplingConfig,
    generator: torch.Generator | list[torch.Generator] | None = None,
    device: torch.device | str | None = None,
    loop: LoopOptions | None = None,
    on_tokens=None,
) -> RolloutBatch:
    """Sample ``group_size`` grids for every prompt (all rows decoded as one batch). Unset
    ``sampling`` knobs (None) are the model's own (:func:`glm_grpo_ds.model.glm_image.resolve_sampling`).

    ``generator``: one for all rows, or a list of one per prompt (each prompt's draws come from its own
    stream, as if it were sampled alone). ``loop``: how the token loop runs
    (:class:`~glm_grpo_ds.rollout.decode_loop.LoopOptions`: compiled, its scope, a CUDA graph; None = eager);
    ``on_tokens(done, total)``: progress (glm_grpo_ds/rollout/decode_loop.py)."""
    sampling = resolve_sampling(sampling, ar)
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    generators = generator if isinstance(generator, list) else [generator]
    if len(generators) not in (1, len(prompts)):
        raise ValueError(f"give one generator or one per prompt ({len(prompts)}), got {len(generators)}")
    device = torch.device(device) if device is not None else next(ar.parameters()).device
    rows, positions, grid = prepare_rows(ar, processor, prompts, group_size, height, width, device)
    options = loop if loop is not None else LoopOptions()
    ids, logps = decode_tokens(
        ar,
        rows["input_ids"],
        rows["attention_mask"],
        positions,
        grid.num_tokens,
        sampling,
        generators,
        options,
        on_tokens,
    )

    prompt_index = torch.arange(len(prompts), device=device).repeat_interleave(group_size)
    return RolloutBatch(
        prompt_ids=rows["input_ids"],
        prompt_mask=rows["attention_mask"],
        completion_ids=ids,
        completion_mask=torch.ones_like(logps),
        sampler_logps=logps,
        position_ids=positions,
        prompt_index=prompt_index,
        prompts=[prompts[i] for i in prompt_index.tolist()],
        grid=grid,
    )
