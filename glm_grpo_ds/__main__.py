"""``python -m glm_grpo_ds ...`` = the ``glm-grpo`` command (glm_grpo_ds/commands/cli.py), its exit included."""

from .commands.cli import console_main

raise SystemExit(console_main())
