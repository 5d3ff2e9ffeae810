"""What a rollout returns: the token grids' sizes (:class:`GridSpec`) and the sampled sequences with their
log-probs (:class:`RolloutBatch`), plus the nearest upsampling that turns a target grid into the DiT's prior
tokens. Written by glm_grpo_ds/rollout/generate.py, read by the trainer (glm_grpo_ds/logprobs.py, update.py).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


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
