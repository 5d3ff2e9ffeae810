"""Import boundaries: only glm_grpo_ds/ds/ imports DeepSpeed, nothing outside it uses a DeepSpeed
engine's own API (it calls glm_grpo_ds.ds.engine / io), the loss module imports only torch, and the
training path never imports the command-line tools."""

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "glm_grpo_ds"
DS = PACKAGE / "ds"
ENGINE_NAMES = {"engine", "ref_engine"}
# test instrumentation that measures what DeepSpeed allocates reads the engine's internals on purpose
INSTRUMENTATION = {PACKAGE / "testing" / "model_state.py"}


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, ast.parse(path.read_text(encoding="utf-8"))


def _imported(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) of every import, relative ones resolved against the package root by name only."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            out.append((node.lineno, base))
            out += [(node.lineno, f"{base}.{a.name}" if base else a.name) for a in node.names]
    return out


def _deepspeed_imports(tree: ast.AST) -> list[int]:
    return [
        line
        for line, name in _imported(tree)
        if name == "deepspeed"
        or name.startswith("deepspeed.")
        or name.endswith("integrations.deepspeed")
        or name.endswith("HfDeepSpeedConfig")
    ]


def _engine_api_uses(tree: ast.AST) -> list[int]:
    """Attribute access on a value named like a DeepSpeed engine (``engine.x``, ``self.engine.x``)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            value = node.value
            if (isinstance(value, ast.Name) and value.id in ENGINE_NAMES) or (
                isinstance(value, ast.Attribute) and value.attr in ENGINE_NAMES
            ):
                lines.append(node.lineno)
    return lines


def test_only_ds_package_imports_deepspeed():
    offenders = {
        str(p.relative_to(PACKAGE)): lines
        for p, tree in _modules()
        if DS not in p.parents and (lines := _deepspeed_imports(tree))
    }
    assert offenders == {}, f"deepspeed imported outside glm_grpo_ds/ds/: {offenders}"
    # the check sees the real imports inside ds/
    assert _deepspeed_imports(ast.parse((DS / "engine.py").read_text()))


def test_engine_api_is_used_only_inside_ds_package():
    offenders = {
        str(p.relative_to(PACKAGE)): lines
        for p, tree in _modules()
        if DS not in p.parents and p not in INSTRUMENTATION and (lines := _engine_api_uses(tree))
    }
    assert offenders == {}, (
        f"DeepSpeed engine API used outside glm_grpo_ds/ds/ (call glm_grpo_ds.ds.engine): {offenders}"
    )
    assert _engine_api_uses(ast.parse((DS / "engine.py").read_text()))


STDLIB = set(sys.stdlib_module_names) | {"__future__"}


def _top_level_imports(path: Path) -> set[str]:
    """First component of every absolute import; a relative one as ``.name`` (the sibling module)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add("." * node.level + (node.module or "").split(".")[0] if node.level else node.module.split(".")[0])
    return names


def test_math_modules_import_only_torch():
    """The loss (grpo.py) and the advantages (advantages.py) import torch, the standard library and the registry
    helper, which itself imports the standard library only."""
    assert _top_level_imports(PACKAGE / "registries.py") <= STDLIB
    for name in ("grpo.py", "advantages.py"):
        names = _top_level_imports(PACKAGE / name)
        assert names <= STDLIB | {"torch", ".registries"}, (name, names - STDLIB)


def test_training_path_does_not_import_commands():
    commands = PACKAGE / "commands"
    offenders = {}
    for path, tree in _modules():
        if commands in path.parents or path.name == "__main__.py":
            continue
        bad = [line for line, name in _imported(tree) if "commands" in name.split(".")]
        if bad:
            offenders[str(path.relative_to(PACKAGE))] = bad
    assert offenders == {}, f"the training path imports glm_grpo_ds.commands: {offenders}"
