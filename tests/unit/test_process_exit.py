"""The process entry points freeze the garbage collector's objects before exiting (runtime/process_exit.py):
`glm-grpo` (the console script's target) and `python -m glm_grpo_ds.train`, and only they."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# atexit handlers run after SystemExit leaves the entry point: they see what it left frozen
PROBE = """import atexit, gc, sys
atexit.register(lambda: print("frozen", gc.get_freeze_count()))
sys.argv = ["glm-grpo", "--version"]
from glm_grpo_ds.commands.cli import {entry}
raise SystemExit({entry}())
"""


def _frozen_at_exit(entry: str) -> int:
    proc = subprocess.run([sys.executable, "-c", PROBE.format(entry=entry)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.split("frozen")[1])


def test_the_console_script_freezes_before_exit_and_main_does_not():
    assert _frozen_at_exit("console_main") > 1000
    assert _frozen_at_exit("main") == 0  # main() is what tests and other code call in-process


def test_the_installed_console_script_and_train_module_use_the_freezing_entry():
    from importlib.metadata import entry_points

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "glm-grpo"]
    assert script.value == "glm_grpo_ds.commands.cli:console_main"
    assert "raise SystemExit(process_exit.frozen(main()))" in (ROOT / "glm_grpo_ds/train.py").read_text()
