"""Where ``glm-grpo evaluate``'s settings come from and what it records of them: the config with the command line's
flags and ``key=value`` overrides, or without ``--config`` the settings of the run that wrote the first adapter
(:data:`RUN_KEYS`, :func:`run_overrides`); the prompt rows and each rank's share; the settings the figures depend
on (contents, not only paths: evaluation/fingerprints.py), recorded in evaluate.json and in each rank's progress
store, where a rerun with other settings is refused. The command: glm_grpo_ds/commands/evaluate.py."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path


def _absolute(source: str) -> str:
    """A local path made absolute (evaluate.json names every file the same way); a Hub id as it is."""
    path = Path(source)
    return str(path.resolve()) if path.exists() else source


# the run's held-out prompts: taken when --prompts is not given (a split or a count of the run's own file would not
# fit another)
PROMPT_KEYS = ("eval.file", "eval.split", "eval.revision", "eval.subset", "eval.num_prompts")
# What evaluate takes, without --config, from the run that wrote the adapter: what that run's own evaluation
# sampled, decoded and scored with (an adapter trained at 64x64 is not judged at the default 1024x1024).
RUN_KEYS = (
    "model.path",
    "model.revision",
    "rollout.height",
    "rollout.width",
    "grpo.sampling.temperature",
    "grpo.sampling.top_k",
    "grpo.sampling.top_p",
    "eval.num_inference_steps",
    "eval.guidance_scale",
    "eval.seed",
    "eval.group_size",
    "decoder.dtype",  # the run's evaluation decoded with its DiT: FP8 changes the images, the dtype too
    "decoder.fp8",
    "rewards",
    *PROMPT_KEYS,
)
REWARDS_HINT = "give --rewards NAME [NAME ...] (e.g. --rewards pixel_mse ssim) or --config with a rewards list"


def _given(a, key: str) -> bool:
    """Whether this command line sets ``key`` itself: a ``key=value`` on it or above it (a section), or its flag."""
    if (key.startswith("model.") and a.model) or (key == "rewards" and a.rewards):
        return True
    for item in a.overrides:
        set_key = item.split("=", 1)[0].strip()
        if set_key == key or key.startswith(set_key + ".") or set_key.startswith(key + "."):
            return True
    return False


def _lookup(tree: dict, key: str):
    """``tree``'s value at the dotted ``key``; KeyError when a run of another version has no such key."""
    node = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(key)
        node = node[part]
    return node


def _shown(key: str, value) -> str:
    if key == "rewards":
        return "rewards=[" + ", ".join(str(r.get("name")) if isinstance(r, dict) else str(r) for r in value) + "]"
    return f"{key}={json.dumps(value)}"


def _from_anywhere(run: Path, key: str, value):
    """A run's ``model.path`` (or ``eval.file``) as a path that holds from any directory: the config's, relative to
    where the run was launched (``launch_dir`` in its config.json, before this directory: another ``model/`` here is
    another model), else (the model) the directory the run resolved it to (``model_source``); a Hub id, a ``random:``
    name or an absolute path as it is."""
    from ..observability.records import read_run_record

    if key not in ("model.path", "eval.file") or not isinstance(value, str) or not value or Path(value).is_absolute():
        return value
    record = read_run_record(run, others_ok=True) or {}
    source = record.get("model_source") or {}
    if key == "model.path" and (source.get("repo_id") or source.get("random_weights")):  # the same from anywhere
        return value
    launched = record.get("launch_dir")
    if isinstance(launched, str) and (Path(launched) / value).exists():
        return str(Path(launched) / value)
    resolved = source.get("path") if key == "model.path" else None
    if not isinstance(launched, str) and isinstance(resolved, str) and Path(resolved).is_dir():
        return resolved  # a run from before launch_dir: where it found its model
    return value


def run_overrides(a, adapters: list[str]) -> tuple[list[str], list[str]]:
    """Without ``--config``: ``(overrides, lines)``, the :data:`RUN_KEYS` of the first adapter's run that this
    command line does not set, as ``key=value`` overrides, and the lines saying so (the file, the keys; one more
    per other adapter whose run differs). ``([], [])`` with ``--config`` or without a run config."""
    from ..evaluation.report import run_config

    if a.config is not None:
        return [], []
    runs = [(i, found) for i, path in enumerate(adapters) for found in [run_config(path)] if found is not None]
    if not runs:
        return [], []
    taken = {}
    for i, (run, train) in runs:
        values = {}
        for key in RUN_KEYS:
            if key in PROMPT_KEYS and (a.prompts or _given(a, "eval.file")):  # other prompts: none of the run's
                continue
            try:
                values[key] = _from_anywhere(run, key, _lookup(train, key))
            except KeyError:
                continue
        if not values.get("eval.file"):  # the run evaluated nothing: no held-out prompts of its own
            values = {key: value for key, value in values.items() if key not in PROMPT_KEYS}
        taken[i] = (run, {key: value for key, value in values.items() if not _given(a, key)})
    first, (run, values) = runs[0][0], taken[runs[0][0]]
    if not values:
        return [], []
    overrides = [f"{key}={json.dumps(value)}" for key, value in values.items()]
    lines = [
        f"glm-grpo evaluate: settings of adapter_{first}'s run, from {run / 'config.json'}: "
        + ", ".join(_shown(key, value) for key, value in values.items())
        + " (a flag, --config or key=value given here wins)"
    ]
    for i, (other, other_values) in taken.items():
        differ = [_shown(key, v) for key, v in other_values.items() if key in values and v != values[key]]
        if i != first and differ:
            lines.append(
                f"glm-grpo evaluate: warning: adapter_{i}'s run ({other / 'config.json'}) had {', '.join(differ)}; "
                f"every model is evaluated with adapter_{first}'s (give key=value to choose)"
            )
    return overrides, lines


def load_settings(a, adapters: list[str] = ()):
    """``(config, prompt source, lines)``: the config with ``--model`` / ``--prompts`` / ``--rewards`` applied (and,
    without ``--config``, the settings of ``adapters``' run: :func:`run_overrides`, with its lines to print)."""
    from ..config import load_config

    from_run, lines = run_overrides(a, list(adapters))
    if a.config is None and not _given(a, "rewards") and not any(o.startswith("rewards=") for o in from_run):
        raise ValueError(f"no rewards to score the images with: {REWARDS_HINT}")
    run_prompts = next((json.loads(o.split("=", 1)[1]) for o in from_run if o.startswith("eval.file=")), None)
    if a.config is None and not a.prompts and not _given(a, "eval.file") and run_prompts is None:
        raise ValueError(
            "no prompts to evaluate on: give --prompts FILE (the adapter's run had no eval.file, or give --config "
            "RUN_CONFIG)"
        )
    overrides = [*from_run, *a.overrides]
    if a.model:
        overrides.append(f"model.path={a.model}")
    if a.rewards:
        overrides.append("rewards=[" + ", ".join(f"{{name: {name}}}" for name in a.rewards) + "]")
    given_file = next((o.split("=", 1)[1] for o in a.overrides if o.split("=", 1)[0].strip() == "eval.file"), None)
    if a.config is None:  # the config needs a training file, never read here: the prompts' (a key=value's as given)
        source = json.dumps(a.prompts) if a.prompts else given_file or json.dumps(run_prompts)
        overrides.insert(0, f"data.train_file={source}")
    cfg = load_config(a.config, overrides)
    prompts = a.prompts or cfg.eval.file
    if not prompts:
        raise ValueError("give --prompts FILE (or a --config with eval.file)")
    prompts = _absolute(prompts)
    # unset: the run's own evaluation's (its prompts, K and seed: evaluation/seeds.py)
    if a.samples_per_prompt is None:
        a.samples_per_prompt = cfg.eval.group_size
    if a.num_prompts is None:
        a.num_prompts = cfg.eval.num_prompts
    if a.thumbnail is None:
        a.thumbnail = cfg.logging.gallery_thumbnail
    if a.thumbnail < 16:
        raise ValueError(f"--thumbnail must be >= 16 pixels, got {a.thumbnail}")
    for flag, value in (("--samples-per-prompt", a.samples_per_prompt), ("--batch-prompts", a.batch_prompts)):
        if value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    if a.num_prompts < 0:  # rows[:-1] would drop the last prompt without a word
        raise ValueError(f"--num-prompts must be >= 0 (0 = all), got {a.num_prompts}")
    return cfg, prompts, lines


PROGRESS = "progress"  # OUT/progress/rank_<r>/: settings.json and each finished (model, batch of prompts)


def progress_store(store: Path, settings: dict, fresh: bool) -> Path:
    """``OUT/progress/rank_<r>``, emptied when ``fresh``; an interrupted run with the same settings resumes from
    it, one with other settings is refused (one line naming --fresh and --out)."""
    recorded = store / "settings.json"
    if fresh and store.exists():
        shutil.rmtree(store)
    if recorded.is_file():
        before, now = json.loads(recorded.read_text()), json.loads(json.dumps(settings))
        differ = sorted(key for key in before.keys() | now.keys() if before.get(key) != now.get(key))
        if differ:
            raise ValueError(
                f"{store} holds an evaluation with other settings ({', '.join(differ)}); give another --out, "
                "or --fresh to discard it"
            )
    store.mkdir(parents=True, exist_ok=True)
    recorded.write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
    return store


def read_rows(a, cfg, prompt_source, rank: int, world: int, local_rank: int) -> tuple[list, list, str]:
    """``(rows, this rank's share, the source's name)``: the held-out prompts, read as training reads eval.file
    (eval.split / eval.revision / eval.subset, whether they come from --prompts or the config; a Hub dataset is
    downloaded, or its Arrow cache built, by rank 0 first), the first ``--num-prompts``, in contiguous shares per
    rank."""
    from ..data import load_prompts

    ev = cfg.eval
    key = "--prompts" if a.prompts else "eval.file"
    where = dict(section="eval", subset=ev.subset)
    rows = load_prompts(prompt_source, key, cfg.data, ev.split, ev.revision, rank, local_rank, **where)
    rows = rows[: a.num_prompts] if a.num_prompts else rows
    name = rows.where  # the source, with the split taken from a DatasetDict
    rows = list(rows)
    share = -(-len(rows) // world)  # the last ranks' shares may be shorter or empty
    return rows, rows[rank * share : (rank + 1) * share], name


def run_settings(a, cfg, loaded, adapters, rows, prompts_name, decode, seed, world) -> dict:
    """What the evaluation's figures depend on, recorded in evaluate.json and checked on resume. Contents, not only
    paths (evaluation/fingerprints.py): a rerun after the prompts or an adapter changed is refused instead of mixing
    stored batches of the old ones with new ones."""
    from ..evaluation import seeds
    from ..evaluation.fingerprints import adapter_sha256, rows_sha256

    s = loaded.sampling
    return {
        "model": str(loaded.model_dir),
        "adapters": adapters,
        "adapters_sha256": [adapter_sha256(path) for path in adapters],
        "prompts": prompts_name,
        "prompts_revision": cfg.eval.revision,
        "prompts_sha256": rows_sha256(rows),
        "num_prompts": len(rows),
        "samples_per_prompt": a.samples_per_prompt,
        "seed": seed,
        "seeds": seeds.SCHEME,
        "image": [cfg.rollout.height, cfg.rollout.width],
        "decode": decode.record(),
        # the DiT that decoded: each changes the images (attention and compile by float rounding only)
        "decoder": {key: getattr(cfg.decoder, key) for key in ("dtype", "fp8", "attention", "compile")},
        "sampling": {"temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p},
        # an empty label left out: the settings an evaluation's progress store was recorded with before it existed
        "rewards": [{k: v for k, v in dataclasses.asdict(spec).items() if k != "label" or v} for spec in cfg.rewards],
        "batch_prompts": a.batch_prompts,
        "thumbnail": a.thumbnail,
        "dtype": str(loaded.dtype),
        "attention": loaded.attn,  # auto resolved: another node's kernel rounds the AR's logits otherwise
        "export": a.export,
        "world_size": world,
    }
