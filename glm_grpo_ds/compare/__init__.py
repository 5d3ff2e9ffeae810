"""``glm-grpo evaluate``'s parts: paired sampling of the base and adapters (runner.py), the statistics (stats.py),
what it writes (report.py), the benchmark export layouts (exports.py) and the content fingerprints its resume
check records (fingerprints.py). The command itself: glm_grpo_ds/commands/evaluate.py."""
