"""``glm-grpo evaluate``'s parts: paired sampling of the base and adapters (runner.py), the statistics (stats.py)
and what it writes (report.py). The command itself: glm_grpo_ds/commands/evaluate.py."""
