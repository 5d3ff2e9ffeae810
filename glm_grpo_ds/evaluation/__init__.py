"""Evaluation, in one home: the in-training evaluation (in_training.py: held-out prompts every ``eval.steps``,
galleries gathered to rank 0), ``glm-grpo evaluate``'s paired sampling of the base and adapters (paired.py), the
statistics (stats.py), what it writes (report.py), the benchmark export layouts (exports.py) and the content
fingerprints its resume check records (fingerprints.py). Both sample through the one experience path
(glm_grpo_ds/experience/) with one seed scheme (seeds.py), so the final in-run evaluation and ``glm-grpo
evaluate`` of that adapter with the same seed, prompts and sample count draw the same samples. The command
itself: glm_grpo_ds/commands/evaluate.py. Import the modules themselves (this file imports nothing)."""
