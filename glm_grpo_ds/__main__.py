"""``python -m glm_grpo_ds ...`` = the ``glm-grpo`` command (glm_grpo_ds/commands/cli.py)."""

from .commands.cli import main

raise SystemExit(main())
