"""model.trust_remote_code reaches every load of the AR in training: a full fine-tuning run with a KL term loads the
policy and the frozen reference, and each ``from_pretrained`` call is given the config's value (recorded by a
``sitecustomize`` the run's interpreter imports first). The AST checks of tests/unit/test_security.py keep any
literal ``True`` out of the package; this shows the value set by the user is the one passed."""

import json
import os

from launching import ENV, FAST, ROOT, common, run_train  # noqa: E402  (tests/integration/launching.py)

RECORDER = """
import json, os
from transformers import GlmImageForConditionalGeneration

_load = GlmImageForConditionalGeneration.from_pretrained.__func__


def _recorded(cls, *args, **kwargs):
    with open(os.environ["TRUST_LOG"], "a") as log:
        log.write(json.dumps(kwargs.get("trust_remote_code")) + "\\n")
    return _load(cls, *args, **kwargs)


GlmImageForConditionalGeneration.from_pretrained = classmethod(_recorded)
"""


def test_the_configs_trust_remote_code_is_passed_to_the_policy_and_the_reference(tiny_model_dir, data64, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(RECORDER)
    log = tmp_path / "trust.jsonl"
    env = dict(ENV, PYTHONPATH=f"{site}{os.pathsep}{ROOT}", TRUST_LOG=str(log))  # another env: a new interpreter
    overrides = common(tiny_model_dir, data64, tmp_path / "run", "max_steps=1", *FAST)
    proc = run_train(*overrides, "lora=null", "grpo.beta=0.04", "model.trust_remote_code=true", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [json.loads(line) for line in log.read_text().splitlines()] == [True, True]  # the policy, the reference
