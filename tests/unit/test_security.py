"""Loading untrusted files: every torch.load of the package refuses pickled code
(weights_only=True), and remote code runs only when the config says model.trust_remote_code=true.
DeepSpeed's own engine.load_checkpoint internals are outside our control (see README, Security)."""

import ast
from pathlib import Path

from glm_grpo_ds.config import ModelConfig

PACKAGE = Path(__file__).resolve().parents[2] / "glm_grpo_ds"


def _calls(name: str):
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                if called == name:
                    yield path.relative_to(PACKAGE.parent), node


def _keyword(node: ast.Call, name: str):
    return next((k.value for k in node.keywords if k.arg == name), None)


def test_every_torch_load_is_weights_only():
    loads = list(_calls("load"))
    torch_loads = [
        (p, n) for p, n in loads if isinstance(n.func, ast.Attribute) and getattr(n.func.value, "id", "") == "torch"
    ]
    assert torch_loads, "expected torch.load calls (checkpoint RNG state, aesthetic head)"
    for path, node in torch_loads:
        value = _keyword(node, "weights_only")
        assert isinstance(value, ast.Constant) and value.value is True, (
            f"{path}:{node.lineno}: torch.load without weights_only=True"
        )


def test_remote_code_only_from_the_config():
    assert ModelConfig().trust_remote_code is False
    for path, node in _calls("from_pretrained"):
        value = _keyword(node, "trust_remote_code")
        # never a literal True: the value must come from the caller (ultimately model.trust_remote_code)
        assert not (isinstance(value, ast.Constant) and value.value is True), f"{path}:{node.lineno}"
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.keyword) and node.arg == "trust_remote_code":
                assert not (isinstance(node.value, ast.Constant) and node.value.value is True), f"{path}"
        for fn in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]:
            args = fn.args.args[-len(fn.args.defaults) :] if fn.args.defaults else []
            for arg, default in zip(args, fn.args.defaults):
                if arg.arg == "trust_remote_code":
                    assert isinstance(default, ast.Constant) and default.value is False, f"{path}:{fn.name}"


# that training passes the config's value to the policy's and the reference's loads: a run shows it
# (tests/integration/test_trust_remote_code.py)
