"""Import boundaries: only glm_grpo_ds/ds/ imports DeepSpeed, nothing outside it uses a DeepSpeed
engine's own API (it calls glm_grpo_ds.ds.engine / io), the loss module imports only torch, and the
training path never imports the command-line tools nor the profilers; every folder is one floor of imports, none
upward, no circle; no package file outgrows 400 lines nor a function 80; no test module imports another."""

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
    """The loss (grpo.py, corrections.py, objectives.py), the advantages (advantages.py) and the image statistics
    import torch, the standard library and of the package only the registry helper (runtime/registries.py), which
    itself imports the standard library, and each other's pure-torch modules (the loss takes corrections.py's mask,
    objectives.py's policy terms)."""
    assert _top_level_imports(PACKAGE / "runtime" / "registries.py") <= STDLIB
    for name in ("grpo.py", "corrections.py", "objectives.py", "advantages.py", "monitoring/image_stats.py"):
        tree = ast.parse((PACKAGE / name).read_text())
        outside = {n for n in _top_level_imports(PACKAGE / name) if n not in STDLIB | {"torch"}}
        package = {n for _, n in _imported(tree) if n.startswith("runtime")} - {"runtime"}
        assert outside <= {".runtime", ".corrections", ".objectives"}, (name, outside)
        assert package <= {"runtime.registries", "runtime.registries.Registry"}, (name, package)


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


# the only modules that import the profilers: the command line's verb `profile`, its listing and its table row, each
# only the table of tools (profiling/tools.py: no torch, no model); the tools themselves run when `profile` calls them
PROFILING_IMPORTERS = {"commands/cli.py", "commands/subcommands.py", "commands/profile.py"}


def test_only_the_profile_verb_imports_the_profilers():
    """The training path and the product's commands never import glm_grpo_ds.profiling (the profilers are no part
    of the product); the ``profile`` verb's modules import only its table of tools."""
    profiling = PACKAGE / "profiling"
    offenders = {}
    for path, tree in _modules():
        name = str(path.relative_to(PACKAGE))
        if profiling in path.parents:
            continue
        found = [(line, n) for line, n in _imported(tree) if "profiling" in n.split(".")]
        allowed = {"profiling.tools", "profiling.tools.PROFILE_TOOLS"} if name in PROFILING_IMPORTERS else set()
        bad = [line for line, n in found if n not in allowed]
        if bad:
            offenders[name] = bad
    assert offenders == {}, f"imports of glm_grpo_ds.profiling outside the `profile` verb: {offenders}"
    assert any("profiling" in n.split(".") for _, n in _imported(ast.parse((PACKAGE / "commands/cli.py").read_text())))


# ----------------------------------------------------------------------------- layering of the package
# Each module sits on a floor; it imports modules of its own floor or below, never above (lazy imports inside
# functions count too), and the import graph has no circle. A name maps to the floor of its longest listed
# prefix (a package and every module in it, unless a module is listed by itself).
FLOORS = [
    # 0 ground floor: no glm_grpo_ds import but each other (runtime: the process plumbing - logging, probes,
    # threads, versions, seeds, the registry helper; install: the dependency ranges, the offline wheel bundle)
    "runtime install",
    # 1 pure torch math: the loss, the advantages, the policy distribution, the image statistics and their alarms
    "grpo corrections objectives entropy_control advantages sampling monitoring",
    # 2 configuration, and the only DeepSpeed / torch.distributed toucher
    "config ds",
    # 3 services of a run: prompt data, rewards, what a run shows, its life on disk
    "data rewards observability lifecycle",
    # 4 the model: GLM-Image's layout and prompt layout, loading the AR and its adapters, the random-weights source
    "model",
    # 5 the model's use: rollouts, log-probs, the decoder
    "rollout logprobs decoder",
    # 6 the memory plan (it counts the model the floors below build)
    "memory",
    # 7 one step's parts (experience, update), evaluation, sharing a run (its cards name the model's layout),
    # test instrumentation
    "experience update evaluation sharing testing",
    # 8 the trainer: its entrance hall (startup), its step and loop (train), the job checked before it runs (preflight)
    "startup train preflight",
    # 9 the profilers (`glm-grpo profile TOOL`): benchmarks and timings of the floors below; they import no command
    "profiling",
    # 10 the command line
    "commands __main__",
]
FLOOR = {name: i for i, names in enumerate(FLOORS) for name in names.split()}
ROOT_PACKAGE = PACKAGE.name


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """module -> the package modules it imports (relative imports resolved; ``from pkg import mod`` is mod)."""
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                    base = f"{base}.{node.module}" if node.module else base
                else:
                    base = node.module or ""
                found = [f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base for a in node.names]
            else:
                continue
            for target in found:
                while target and target not in paths:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    targets.add(target)
        graph[name] = targets
    return graph


def _floor(module: str) -> int:
    parts = module.split(".")[1:]
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in FLOOR:
            return FLOOR[".".join(parts[:n])]
    raise AssertionError(f"{module} has no floor: add it (or its package) to FLOORS in tests/unit/test_boundaries.py")


def test_every_module_has_a_floor_and_the_root_package_imports_nothing():
    graph = _import_graph()
    assert graph[ROOT_PACKAGE] == set(), "glm_grpo_ds/__init__.py must import nothing of the package"
    for module in graph:
        if module != ROOT_PACKAGE:
            _floor(module)


def _upward(graph: dict[str, set[str]], floor=_floor) -> list[str]:
    """Every import of a module on a higher floor than the importer's, as a line."""
    return [
        f"{a} (floor {floor(a)}) imports {b} (floor {floor(b)})"
        for a, targets in sorted(graph.items())
        if a != ROOT_PACKAGE
        for b in sorted(targets)
        if b != ROOT_PACKAGE and floor(b) > floor(a)
    ]


def _circles(graph: dict[str, set[str]]) -> list[str]:
    """Every circle a depth-first walk of ``graph`` meets, as ``a -> b -> a``."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    circles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                circles.append(" -> ".join(path[path.index(target) :] + [target]))
            elif target not in state:
                visit(target, path + [target])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return circles


def _folders(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph between the package's folders (a module at the root is its own folder): ``model`` imports
    ``rollout`` when any module of model/ imports any of rollout/. Two folders on one floor may import each other
    module by module without a circle among the modules; a folder circle is still a circle between the rooms."""

    def folder(module: str) -> str:
        return module.split(".")[1] if "." in module else module

    out: dict[str, set[str]] = {}
    for a, targets in graph.items():
        if a == ROOT_PACKAGE:
            continue
        out.setdefault(folder(a), set()).update(folder(b) for b in targets if b != ROOT_PACKAGE)
        out[folder(a)].discard(folder(a))
    return out


def test_no_upward_import():
    upward = _upward(_import_graph())
    assert upward == [], "\n".join(upward)


def test_import_graph_has_no_circle():
    graph = _import_graph()
    assert _circles(graph) == [], _circles(graph)
    assert _circles(_folders(graph)) == [], _circles(_folders(graph))  # nor between folders


def test_the_checks_see_a_circle_a_folder_circle_and_an_upward_arrow():
    """The checks above, fed graphs that break each rule, say so (and the real graph has the arrows they read)."""
    p = ROOT_PACKAGE
    circle = {f"{p}.a": {f"{p}.b"}, f"{p}.b": {f"{p}.c"}, f"{p}.c": {f"{p}.a"}}
    assert _circles(circle) == [f"{p}.a -> {p}.b -> {p}.c -> {p}.a"]
    # model.x -> rollout.y and rollout.z -> model.w: no circle between modules, one between the two folders
    folders = {f"{p}.model.x": {f"{p}.rollout.y"}, f"{p}.rollout.z": {f"{p}.model.w"}, f"{p}.model.w": set()}
    assert _circles(folders) == [] and _circles(_folders(folders)) == ["model -> rollout -> model"]
    upward = {f"{p}.model.policy": {f"{p}.rollout.generate"}, f"{p}.rollout.generate": {f"{p}.model.glm_image"}}
    assert _upward(upward) == [f"{p}.model.policy (floor 4) imports {p}.rollout.generate (floor 5)"]
    graph = _import_graph()
    assert "glm_grpo_ds.model.adapters" in graph["glm_grpo_ds.model.policy"]  # policy imports adapters ...
    assert "glm_grpo_ds.model.policy" not in graph["glm_grpo_ds.model.adapters"]  # ... never the reverse
    assert "glm_grpo_ds.model.prompt_layout" in graph["glm_grpo_ds.rollout.generate"]
    assert "model" in _folders(graph)["rollout"] and "rollout" not in _folders(graph)["model"]
    assert _floor("glm_grpo_ds.memory.startup") > _floor("glm_grpo_ds.model.policy")
    assert (
        _floor("glm_grpo_ds.train")
        > _floor("glm_grpo_ds.rollout.generate")
        > _floor("glm_grpo_ds.model.policy")
        > _floor("glm_grpo_ds.grpo")
        > _floor("glm_grpo_ds.runtime.log")
    )


# ----------------------------------------------------------------------------- room sizes
# A module is read whole by the next engineer and a function on one screen: the package's files stay at or under
# MAX_FILE_LINES lines and its functions at or under MAX_FUNCTION_LINES (docstring included), so a room that grows
# is split by meaning when it reaches the bound rather than noticed a year later.
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 80
# catalogues: lists read an entry at a time, longer on purpose (none today)
CATALOGUES: set[str] = set()


def _long_rooms() -> tuple[list[str], list[str]]:
    files, functions = [], []
    for path, tree in _modules():
        name = str(path.relative_to(PACKAGE))
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_FILE_LINES and name not in CATALOGUES:
            files.append(f"{name}: {lines} lines")
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    functions.append(f"{name}:{node.lineno} {node.name}: {length} lines")
    return files, functions


def test_no_file_or_function_outgrows_its_bound():
    files, functions = _long_rooms()
    assert files == [], f"split these files by meaning (<= {MAX_FILE_LINES} lines): {files}"
    assert functions == [], f"split these functions into named steps (<= {MAX_FUNCTION_LINES} lines): {functions}"
