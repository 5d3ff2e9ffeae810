"""Reward registry (built-in names and ``python:`` / file plugins) and the reward set of a run."""

from __future__ import annotations

import difflib
import functools
import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from pathlib import Path
from typing import Callable

import torch

from ..runtime import log, oom, run_log
from ..runtime.capture_gate import CAPTURE_SAFE
from ..runtime.registries import Registry
from .base import RewardError, SampleNeed, reward_values

# name -> a factory ``(**args) -> reward``, or a "module:Class" string inside this package (imported on use, so
# e.g. OCR deps are only needed when asked for). ``REWARDS.register(name, factory)`` makes ``name`` usable in
# configs; a name cannot be registered twice.
REWARDS: Registry[str | Callable] = Registry("reward")
for _name, _target in {
    "pixel_mse": "pixel:PixelMSEReward",
    "lpips": "lpips_reward:LPIPSReward",
    "ssim": "ssim:SSIMReward",
    "ocr": "ocr:OCRReward",
    "ocr_word_accuracy": "ocr:OCRWordAccuracy",
    "ocr_region_ned": "ocr:OCRRegionNED",
    "clip": "clip:CLIPReward",
    "preference": "clip:PreferenceReward",
    "aesthetic": "clip:AestheticReward",
    "vqa": "vqa:VQAReward",
    "colour_layout": "colour_layout:ColourLayoutReward",
    "remote": "remote.client:RemoteReward",
}.items():
    REWARDS.register(_name, _target)
del _name, _target


def builtin_names() -> list[str]:
    return sorted(REWARDS)


def _cannot_import(spec: str, what: str, err: Exception, hint: str = "") -> RewardError:
    """One line naming the module or file that did not import, with a syntax error's file and line."""
    if isinstance(err, SyntaxError) and err.lineno:  # the line to fix, in whichever file holds it
        line = f"{err.filename}:{err.lineno}" if err.filename else f"line {err.lineno}"
        what = line if err.filename == what else f"{what}, {line}"
    return RewardError(f"reward {spec!r}: cannot import {what} ({type(err).__name__}: {err}){hint}")


def _import_module(spec: str, module_name: str):
    """``module_name`` imported; a module in the current directory is found too, as ``python -m`` finds it (the
    ``glm-grpo`` console script has only its own directory on sys.path), after the installed packages so that a
    folder named like a library does not replace it."""
    here = os.getcwd()
    for searched_here in (False, True):
        try:
            return importlib.import_module(module_name)
        except ModuleNotFoundError as err:  # the module itself, or a module it imports
            missing = err.name is not None and (module_name + ".").startswith(err.name + ".")
            if missing and not searched_here and here not in sys.path:
                sys.path.append(here)
                continue
            hint = "; install it, or put its directory on PYTHONPATH" if missing else ""
            raise _cannot_import(spec, module_name, err, hint) from None
        except Exception as err:  # noqa: BLE001 - the user's module: any error importing it is one line naming it
            raise _cannot_import(spec, module_name, err) from None


def _load_plugin(spec: str) -> Callable:
    """``python:pkg.mod:attr`` or ``path/to/file.py:attr``."""
    target = spec[len("python:") :] if spec.startswith("python:") else spec
    module_name, sep, attr = target.rpartition(":")
    if not sep or not attr:
        raise RewardError(f"reward {spec!r}: expected python:package.module:function or path/file.py:function")
    if module_name.endswith(".py"):
        path = Path(module_name)
        if not path.is_file():
            raise RewardError(f"reward {spec!r}: file {path} does not exist")
        # in sys.modules while it runs, under a name of its own: a @dataclass under `from __future__ import
        # annotations` looks its module up there, and two files of one name in two folders stay apart
        unique = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:8]
        name = f"glm_grpo_reward_{path.stem}_{unique}"
        mod_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[name] = module
        try:
            mod_spec.loader.exec_module(module)
        except Exception as err:  # noqa: BLE001 - the user's file: any error importing it is one line naming it
            sys.modules.pop(name, None)
            raise _cannot_import(spec, str(path), err) from None
    else:
        module = _import_module(spec, module_name)
    if not hasattr(module, attr):
        raise RewardError(f"reward {spec!r}: {module_name} has no attribute {attr!r}")
    return getattr(module, attr)


def _is_plugin(name: str) -> bool:
    return name.startswith("python:") or ".py:" in name


def check_reward_name(name: str, where: str = "") -> None:
    """Raise RewardError unless ``name`` is a built-in or a loadable plugin (cheap: no model is built)."""
    if _is_plugin(name):
        _load_plugin(name)
    elif name not in REWARDS:
        close = difflib.get_close_matches(name, list(REWARDS), n=3, cutoff=0.4)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise RewardError(
            f"{where}unknown reward {name!r}{hint} (built-ins: {', '.join(builtin_names())}; or "
            "python:module:function, path/file.py:function)"
        )


def _factory(name: str) -> Callable:
    """The class / function behind a reward name, not yet built (building may load models)."""
    check_reward_name(name)
    if _is_plugin(name):
        return _load_plugin(name)
    target = REWARDS.get(name)
    if isinstance(target, str):
        module_name, attr = target.split(":")
        target = getattr(importlib.import_module(f"{__package__}.{module_name}"), attr)
    return target


def reward_needs(name: str, args: dict | None = None) -> SampleNeed | None:
    """What reward ``name`` needs of a sample (its ``needs`` attribute), without building it. A reward
    whose needs depend on its args has a ``needs_for(args)`` classmethod instead (``remote`` asks its
    server, so this also checks the server answers)."""
    factory = _factory(name)
    if hasattr(factory, "needs_for"):
        return factory.needs_for(dict(args or {}))
    return getattr(factory, "needs", None)


def _plugin_form(name: str, target: Callable, args: dict) -> str:
    """How a plugin takes its ``args``: ``"class"`` (built with them, the instance scores), ``"reward"`` (a function
    ``fn(images, prompts, samples, **args)``: called with them each time), ``"factory"`` (a function ``fn(**args)``
    returning the reward) or ``"plain"`` (a function without args: the reward itself). One-line RewardError when
    ``args`` fit neither a reward's nor a factory's signature."""
    if isinstance(target, type):
        return "class"
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):  # a builtin without a signature: let the call decide
        return "factory" if args else "plain"
    if not args:
        try:
            signature.bind(None, None, None)
        except TypeError:  # every call would raise: undefined at every step until max_consecutive_skips
            raise RewardError(
                f"reward {name}: {getattr(target, '__name__', 'it')}{signature} cannot be called as a reward (images, "
                "prompts, samples); give a factory its args, or make it take those three"
            ) from None
        return "plain"
    # the factory first: a reward's images, prompts and samples have no defaults, so it never fits the args alone,
    # while a factory whose first parameters have defaults would fit (None, None, None, **args)
    for form, bound in (("factory", ()), ("reward", (None, None, None))):
        try:
            signature.bind(*bound, **args)
            return form
        except TypeError:
            continue
    raise RewardError(
        f"reward {name}: args {', '.join(sorted(args))} fit neither {getattr(target, '__name__', 'it')}"
        f"{signature} as a reward (images, prompts, samples, then the args by name) nor as a factory taking only "
        "the args and returning the reward"
    )


def check_reward_args(name: str, args: dict) -> None:
    """Cheap checks of a reward's ``args`` before anything is built: for a built-in each name is one its constructor
    takes, and its ``check_args`` (model files, libraries: rewards/model_files.py) passes; for a plugin the args fit
    its signature (:func:`_plugin_form`). One-line RewardError."""
    if _is_plugin(name):
        target = _factory(name)
        if _plugin_form(name, target, args) != "class":
            return
    else:
        target = _factory(name)
    signature = inspect.signature(target)
    try:
        signature.bind(**args)
    except TypeError:
        takes = ", ".join(p for p in signature.parameters if p != "self") or "none"
        bad = ", ".join(sorted(set(args) - set(signature.parameters))) or "?"
        raise RewardError(f"reward {name}: unknown args {bad}; it takes {takes}") from None
    check = getattr(target, "check_args", None)
    if check is not None:
        check(dict(args))


def build_reward(name: str, args: dict) -> Callable:
    target = _factory(name)
    if _is_plugin(name):
        form = _plugin_form(name, target, args)
        if form == "plain":
            return target
        if form == "reward":
            return functools.wraps(target)(functools.partial(target, **args))
    check_reward_args(name, args)
    try:
        return target(**args)
    except RewardError:  # already one line naming the reward
        raise
    except Exception as err:  # noqa: BLE001 - a plugin's constructor is user code: whatever it raises is one line
        if oom.out_of_memory(err) is not None or not (_is_plugin(name) or isinstance(err, TypeError)):
            raise  # the run's memory (memory/oom.py); a built-in's own errors say what they are
        raise RewardError(_build_failure(name, target, args, err)) from None


def _build_failure(name: str, target: Callable, args: dict, err: Exception) -> str:
    """The line for a reward whose constructor or factory raised: "bad args" only when ``args`` do not fit its
    signature, else what it raised (a TypeError inside the constructor is not the args' fault)."""
    msg = " ".join(str(err).split()) or type(err).__name__
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):  # a builtin without a signature: the args cannot be checked
        signature = None
    if signature is not None:
        try:
            signature.bind(**args)
        except TypeError:
            return f"reward {name}: bad args {args} ({msg})"
    return f"reward {name}: building it with args {args} raised {type(err).__name__}: {msg}"


class RewardSet:
    """The rewards of a run; ``__call__`` returns ``{label: [N] float32}`` (NaN = undefined).

    A reward that raises scores the whole batch NaN (undefined: left out of the advantages) and the
    step goes on; ``failed[label]`` holds how many samples of the last call failed that way (of the
    calls since :meth:`reset` when a step is scored in parts with :meth:`score`). Values
    of +-inf are undefined too (an infinite reward would make every advantage of its group NaN).
    Each kind of problem is warned once per reward, with the exception message; later ones show in
    the metrics only (``reward/<label>_failed``, ``reward/<label>_undefined``). Running out of accelerator memory
    is not a failure of the samples: it ends the run with its own line (glm_grpo_ds/memory/oom.py), as training on
    the other rewards alone would change what the run optimizes.
    """

    def __init__(self, rewards: list[tuple[str, float, Callable]]):
        self.labels = [label for label, _, _ in rewards]
        self.weights = {label: weight for label, weight, _ in rewards}
        self.fns = {label: fn for label, _, fn in rewards}
        self.failed = {label: 0 for label in self.labels}
        self.features = None  # grpo.diversity_features' ImageFeatures (build_rewards), the shaping's image vectors

    def _score(self, label: str, images: torch.Tensor, prompts: list[str], samples: list[dict]) -> torch.Tensor:
        n = images.shape[0]
        try:
            # no_grad: a plugin's own model would build a graph the step's gathers keep alive
            with torch.no_grad(), oom.marking(part=f"reward {label}"):
                raw = self.fns[label](images, prompts, samples)
        except torch.OutOfMemoryError:  # not the samples' failure: the run's memory (memory/oom.py)
            raise
        except Exception as err:  # noqa: BLE001 - reward code is user code: any failure = undefined batch
            self.failed[label] += n
            msg = " ".join(str(err).split()) or type(err).__name__
            log.warning_once(
                f"reward-raised:{label}",
                f"glm-grpo: warning: reward {label} raised {type(err).__name__}: {msg}; its {n} samples are undefined "
                f"(left out of the advantages) and training goes on; further failures are counted in "
                f"reward/{label}_failed, not logged",
                all_ranks=True,
            )
            return torch.full((n,), float("nan"), device=images.device)
        values = reward_values(label, raw, n, images.device)
        bad = torch.isnan(values)
        if bad.any():
            log.warning_once(
                f"reward-nonfinite:{label}",
                f"glm-grpo: warning: reward {label} returned None/NaN/inf for {int(bad.sum())} of {n} samples; they "
                "are undefined (left out of the advantages); further ones are counted in "
                f"reward/{label}_undefined, not logged",
                all_ranks=True,
            )
        return values

    def pair_distance(self) -> Callable | None:
        """The perceptual ``distance(a, b) -> [P]`` of the first reward that has one (lpips), for the image
        statistics' ``lpips_diversity`` (monitoring/image_stats.py); None without such a reward."""
        return next((fn.distance for fn in self.fns.values() if callable(getattr(fn, "distance", None))), None)

    def features_of(self, images: torch.Tensor) -> torch.Tensor | None:
        """``[N, D]`` the diversity shaping's image features (``grpo.diversity_features``), or None when the
        features raised (warned once; the step is not shaped: experience/step_advantages.py). Like a reward, never
        during a CUDA graph's capture on another thread."""
        try:
            with CAPTURE_SAFE.shared(), torch.no_grad(), oom.marking(part="grpo.diversity_features"):
                return self.features(images)
        except torch.OutOfMemoryError:  # not a failure to shape the step: the run's memory (memory/oom.py)
            raise
        except Exception as err:  # noqa: BLE001 - one rank's failure must not leave the others in a collective
            msg = " ".join(str(err).split()) or type(err).__name__
            log.warning_once(
                "features-raised",
                f"glm-grpo: warning: grpo.diversity_features raised {type(err).__name__}: {msg}; the steps where it "
                "does are not shaped",
                all_ranks=True,
            )
            return None

    def reset(self) -> None:
        """Start a step's failure counts (``failed``) at 0."""
        self.failed = {label: 0 for label in self.labels}

    def score(
        self, images: torch.Tensor, prompts: list[str], samples: list[dict], on_scored: Callable | None = None
    ) -> dict[str, torch.Tensor]:
        """Every reward of these samples, adding their failures to ``failed`` (a part of a step).
        ``on_scored(label)``: after each reward (the step status, glm_grpo_ds/observability/step_status.py).
        No reward runs during a CUDA graph's capture on another thread (runtime/capture_gate.py)."""
        values = {}
        for label in self.labels:
            with CAPTURE_SAFE.shared():  # a reward's code may synchronize the device or empty the cache
                values[label] = self._score(label, images, prompts, samples)
            if on_scored is not None:
                on_scored(label)
        return values

    def __call__(
        self, images: torch.Tensor, prompts: list[str], samples: list[dict], on_scored: Callable | None = None
    ) -> dict[str, torch.Tensor]:
        """A whole batch: :meth:`reset`, then :meth:`score`."""
        self.reset()
        return self.score(images, prompts, samples, on_scored)


def check_reward_specs(specs, diversity_features: str | None = None) -> None:
    """Fail fast (before any model is loaded) on a reward that cannot work: its name, its args, the model files
    and libraries it needs; on ``grpo.diversity_features``' backbone (rewards/image_features.py); and on a training
    run's rewards that are all weighted 0 (``evaluate`` measures such rewards: it does not call this)."""
    from .image_features import check_features_source

    if specs and all(s.weight == 0 for s in specs):  # every combination is a weighted sum: every advantage 0
        raise RewardError(
            "rewards: every weight is 0, so every advantage is 0 and the run learns from no reward (loss 0 each "
            "step): give a reward a weight (weight-0 rewards are logged only; glm-grpo evaluate measures rewards alone)"
        )
    check_features_source(diversity_features)
    for i, s in enumerate(specs):
        check_reward_name(s.name, f"rewards[{i}].name: ")
        try:
            check_reward_args(s.name, dict(s.args))
        except RewardError as err:
            raise RewardError(f"rewards[{i}]: {err}") from None
        if hasattr(_factory(s.name), "needs_for"):  # e.g. remote: the server must answer, with the token
            try:
                reward_needs(s.name, s.args)
            except RewardError as err:
                raise RewardError(f"rewards[{i}] {s.name}: {err}") from None


def check_reward_inputs(specs, rows, key: str, path) -> None:
    """Fail fast (before any model is loaded) on a reward that needs a sample field (``needs``) no
    row of prompt file ``path`` (config key ``key``) has: it could never be computed."""
    for i, s in enumerate(specs):
        need = reward_needs(s.name, s.args)
        if need is not None and not any(need.present(row.prompt, row.reward_sample()) for row in rows):
            raise RewardError(
                f"rewards[{i}] {s.name} needs {need.field} but no row of {key} {path} has one, so it could never be "
                f"computed; {need.fix}"
            )


def reward_labels(specs) -> list[str]:
    """The rewards' labels in metrics and reports: each spec's ``label`` (a RewardSpec, or its dict in a run's
    config.json), else its name, with ``#2``, ``#3`` appended to one used again."""
    seen: dict[str, int] = {}
    labels = []
    for spec in specs:
        label = spec.get("label") if isinstance(spec, dict) else spec.label
        name = label or (spec.get("name") if isinstance(spec, dict) else spec.name)
        seen[name] = seen.get(name, 0) + 1
        labels.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return labels


def build_rewards(specs, diversity_features: str | None = None) -> RewardSet:
    """From config ``RewardSpec``s, labelled by :func:`reward_labels`; with ``diversity_features``
    (``grpo.diversity_features``) the set's ``features`` (rewards/image_features.py), built with the rewards."""
    labels = reward_labels(specs)
    built = [(label, s.weight, build_reward(s.name, dict(s.args))) for label, s in zip(labels, specs)]
    rewards = RewardSet(built)
    if diversity_features is not None:
        from .image_features import ImageFeatures

        rewards.features = ImageFeatures(diversity_features)
    run_log.adopt_library_loggers()  # reward libraries that print by themselves (torchmetrics) -> the run's log
    return rewards
