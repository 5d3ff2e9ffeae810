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
and to the teacher-forced pass (:mod:`glm_grpo_ds.logprobs`), so the two see identical inputs.

Usage::

    batch = rollout(ar, processor, ["a red cube", "a sign 'OPEN'"], group_size=4,
                    height=64, width=96, sampling=SamplingConfig(), generator=g)
    batch.prior_token_ids  # [N, (H/16)*(W/16)] for the DiT
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from .config import SamplingConfig
from .policy import ar_parts, resolve_sampling
from .sampling import policy_logits, sample


@dataclass(frozen=True)
class GridSpec:
    """Token grids of one target size: ``large`` = (H/32, W/32), ``preview`` ~ 16x16."""

    large: tuple[int, int]
    preview: tuple[int, int]

    @property
    def num_preview(self) -> int:
        return self.preview[0] * self.preview[1]

    @property
    def num_large(self) -> int:
        return self.large[0] * self.large[1]

    @property
    def num_tokens(self) -> int:
        """Generated tokens per sample: preview grid, then target grid."""
        return self.num_preview + self.num_large


@dataclass
class RolloutBatch:
    """N = num_prompts * G sampled sequences; rows ordered group by group.

    Shapes: ``prompt_ids``/``prompt_mask`` ``[N, L]`` (left padded); ``completion_ids``,
    ``completion_mask``, ``sampler_logps`` ``[N, n]`` with n = preview + target grid tokens;
    ``position_ids`` ``[3, N, L + n]``; ``prompt_index`` ``[N]``.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    sampler_logps: torch.Tensor
    position_ids: torch.Tensor
    prompt_index: torch.Tensor  # index into the prompts list passed to rollout()
    prompts: list[str]  # one per row
    grid: GridSpec

    def __len__(self) -> int:
        return self.completion_ids.shape[0]

    @property
    def prompt_len(self) -> int:
        return self.prompt_ids.shape[1]

    @property
    def input_ids(self) -> torch.Tensor:
        """``[N, L + n]`` prompt + generated ids."""
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, torch.ones_like(self.completion_ids)], dim=1)

    @property
    def sequence_completion_mask(self) -> torch.Tensor:
        """``[N, L + n]``: 1 on generated tokens only."""
        return torch.cat([torch.zeros_like(self.prompt_mask), self.completion_mask.to(self.prompt_mask.dtype)], dim=1)

    @property
    def image_tokens(self) -> torch.Tensor:
        """``[N, h*w]`` target-grid tokens (row-major), the part the DiT renders."""
        return self.completion_ids[:, self.grid.num_preview :]

    @property
    def prior_token_ids(self) -> torch.Tensor:
        """``[N, 4*h*w]`` target grid upsampled x2 (nearest), as ``GlmImagePipeline`` feeds the DiT."""
        return upsample_grid(self.image_tokens, *self.grid.large)

    def select(self, rows: torch.Tensor | slice) -> "RolloutBatch":
        """Rows ``rows`` as a new batch (micro-batches, per-rank shards)."""
        if isinstance(rows, slice):
            rows = torch.arange(len(self))[rows]
        rows = rows.to(torch.long)
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "position_ids":
                out[f.name] = v[:, rows.to(v.device)]
            elif isinstance(v, torch.Tensor):
                out[f.name] = v[rows.to(v.device)]
            elif f.name == "prompts":
                out[f.name] = [v[i] for i in rows.tolist()]
            else:
                out[f.name] = v
        return RolloutBatch(**out)


def upsample_grid(tokens: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """``[N, h*w]`` -> ``[N, (2h)*(2w)]``: each token becomes a 2x2 block (nearest upsampling)."""
    grid = tokens.view(-1, h, w)
    return grid.repeat_interleave(2, dim=1).repeat_interleave(2, dim=2).reshape(tokens.shape[0], -1)


def build_prompt_inputs(processor, prompts: list[str], height: int, width: int, device=None) -> dict:
    """Chat-template, tokenise and left-pad text-to-image prompts for the AR.

    Returns ``input_ids``, ``attention_mask`` ``[P, L]``, ``image_grid_thw`` ``[2P, 3]`` (per prompt:
    target grid, preview grid) and ``images_per_sample`` ``[P]``.
    """
    if height % 32 or width % 32 or height <= 0 or width <= 0:
        raise ValueError(f"height and width must be positive multiples of 32, got {height}x{width}")
    messages = [[{"role": "user", "content": [{"type": "text", "text": p}]}] for p in prompts]
    inputs = processor.apply_chat_template(
        messages,
        tokenize=True,
        return_dict=True,
        return_tensors="pt",
        processor_kwargs={"padding": True, "target_h": height, "target_w": width},
    )
    if processor.tokenizer.padding_side != "left" and len(prompts) > 1:
        raise ValueError("the GLM-Image tokenizer must pad on the left for batched rollouts")
    keys = ("input_ids", "attention_mask", "image_grid_thw", "images_per_sample")
    return {k: inputs[k].to(device) if device is not None else inputs[k] for k in keys}


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


@torch.no_grad()
def sample_grids(
    ar,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    position_ids: torch.Tensor,
    num_tokens: int,
    sampling: SamplingConfig,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """KV-cached decode of ``num_tokens`` tokens; ``position_ids`` ``[3, B, L + num_tokens]``.

    Returns ``(ids [B, n], logps [B, n])``; logps are fp32 log-probs of the drawn tokens under the
    policy distribution (mask + temperature, not truncated).
    """
    from transformers import DynamicCache

    body, lm_head, codebook = ar_parts(ar)
    bsz, plen = prompt_ids.shape
    ids = prompt_ids.new_empty(bsz, num_tokens)
    logps = torch.empty(bsz, num_tokens, dtype=torch.float32, device=prompt_ids.device)
    cache = DynamicCache(config=body.config.text_config)
    mask = prompt_mask
    hidden = body(
        input_ids=prompt_ids,
        attention_mask=mask,
        position_ids=position_ids[:, :, :plen],
        past_key_values=cache,
        use_cache=True,
    ).last_hidden_state[:, -1]
    for k in range(num_tokens):
        logits = policy_logits(lm_head(hidden), codebook, sampling.temperature)
        ids[:, k], logps[:, k] = sample(logits, sampling.top_k, sampling.top_p, generator)
        if k + 1 == num_tokens:
            break
        mask = torch.cat([mask, mask.new_ones(bsz, 1)], dim=1)
        pos = position_ids[:, :, plen + k : plen + k + 1]
        hidden = body(
            input_ids=ids[:, k : k + 1], attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True
        ).last_hidden_state[:, -1]
    return ids, logps


def rollout(
    ar,
    processor,
    prompts: list[str],
    group_size: int,
    height: int,
    width: int,
    sampling: SamplingConfig,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> RolloutBatch:
    """Sample ``group_size`` grids for every prompt (all rows decoded as one batch). Unset
    ``sampling`` knobs (None) are the model's own (:func:`glm_grpo_ds.policy.resolve_sampling`)."""
    sampling = resolve_sampling(sampling, ar)
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    device = torch.device(device) if device is not None else next(ar.parameters()).device
    inputs = build_prompt_inputs(processor, prompts, height, width, device=device)
    grid = grid_spec_from_inputs(inputs)
    rows = _repeat_rows(inputs, group_size)
    prompt_pos = prompt_position_ids(ar, rows)
    positions = torch.cat([prompt_pos, decode_position_ids(prompt_pos, rows["attention_mask"], grid)], dim=2)
    ids, logps = sample_grids(
        ar, rows["input_ids"], rows["attention_mask"], positions, grid.num_tokens, sampling, generator
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
