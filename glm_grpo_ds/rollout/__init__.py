"""Rollouts: sample G visual-token grids per prompt with the AR policy, recording exact log-probs.

* generate.py: 3D rotary positions, :func:`rollout` (the entry point; the prompt layout is
  glm_grpo_ds/model/prompt_layout.py's);
* decode_loop.py: the static-shaped, KV-cached, compilable token loop; decode_attention.py its attention over
  the static cache; step_graph.py its step as a CUDA graph or a compiled region;
* batch.py: :class:`RolloutBatch` (what the trainer consumes) and :class:`GridSpec`;
* backends.py: the sampling backends (the "samplers": :class:`SamplingBackend` and its in-process engines);
* merged_lora.py / fused_lora.py: sampling with the LoRA adapters merged into the base, or unmerged and fused.

    from glm_grpo_ds.rollout import rollout
    batch = rollout(ar, processor, ["a red cube"], group_size=4, height=256, width=256, sampling=SamplingConfig())
"""

from .batch import GridSpec, RolloutBatch, upsample_grid
from .generate import decode_position_ids, grid_spec_from_inputs, prompt_position_ids, rollout

__all__ = [
    "GridSpec",
    "RolloutBatch",
    "decode_position_ids",
    "grid_spec_from_inputs",
    "prompt_position_ids",
    "rollout",
    "upsample_grid",
]
