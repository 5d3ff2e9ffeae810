"""The memory plan of a run before launch: per-GPU bytes (plan: one function per component in components and
transients, from the run resolved in basis, composed per phase by phases) from parameter counts (sizes), host RAM
per node (host), reward models (reward_models); the plan of the run being started and the placement it gives
rollout.merge_lora's base copy (startup); the planned time per step (step_time); every figure measured on a GPU
that they rest on (gpu_figures). A run measures its own peaks with glm_grpo_ds/runtime/memory_probe.py."""
