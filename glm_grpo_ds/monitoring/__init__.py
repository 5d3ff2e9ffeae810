"""What the decoded images look like, in pure torch, below the configuration that names it:

* image_stats.py: per-image statistics and the diversity within each group (``monitor.statistics``);
* alarms.py: rules over those statistics (``monitor.alarms``), parsed when the config loads and checked each step.

The run's records of them (metrics.jsonl, the console) are glm_grpo_ds/observability/'s. Import the modules
themselves (this file imports nothing).
"""
