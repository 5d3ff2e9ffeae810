"""The memory plan of a run before launch: per-GPU bytes (plan) from parameter counts
(sizes), host RAM per node (host), reward models (reward_models). The measured peaks are
glm_grpo_ds/runtime/memory_probe.py."""
