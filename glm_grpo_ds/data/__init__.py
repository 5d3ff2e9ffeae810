"""Prompt sets (``data.train_file``, ``eval.file``) and their deterministic split across ranks.

Sources (:func:`load_prompts`; docs/configuration.md#data):

* ``.txt``: one prompt per line (blank lines skipped); with a ``target_images/`` folder beside it, a target image
  per line named by the line's number (the seeds' layout, glm_grpo_ds/data/target_folder.py);
* ``.jsonl``: one JSON object per line with ``prompt`` (required), ``target_image`` (optional, a path
  relative to the file) and ``text`` (optional text to render, or a list of them, one per text region:
  LongText-Bench's ``text_prompts.jsonl`` as it is); other keys are passed to rewards (glm_grpo_ds/data/lines.py);
* a CVTG-2K file (``.json``, one ``{"data_list": [...]}`` document): each entry's ``prompt``, and its texts to
  render (the quoted spans of its ``sentence_list`` clauses, else of the prompt) as the row's ``text`` list
  (glm_grpo_ds/data/cvtg.py);
* ``.parquet``, ``.csv``, other ``.json``, a ``save_to_disk`` directory (``data.split`` picks a
  DatasetDict's split), a directory of data files, or a Hugging Face Hub dataset id (``org/name``,
  ``data.revision``), read with ``datasets`` (data/tables.py, data/hub.py).

``data.prompt_key`` / ``target_image_key`` / ``text_key`` name the columns (JSON keys); a target image
may be a path or an image stored in the dataset. Either way the rows stay on disk (a CVTG-2K file, one JSON
document of at most a few hundred entries, is the exception): ``load_prompts``
checks every row once and returns :class:`PromptRows`, which reads a row when it is indexed, and
:class:`PromptOrder` (data/prompt_order.py) draws row numbers, so a rank's memory stays flat as the
prompt set grows (``python benchmarks/bench_data.py`` measures it).
"""

from __future__ import annotations

from pathlib import Path

from ..config.run_sections import DataConfig
from ..ds.dist import in_rank_order
from ..runtime import run_log
from .cvtg import read_cvtg
from .hub import hub_snapshot, looks_like_hub_id
from .lines import LineFile
from .prompt_order import PromptOrder
from .rows import DataError, DatasetImage, PromptRow, PromptRows
from .tables import FILE_BUILDERS, TableRows, is_saved_dataset, load_table

__all__ = ["DataError", "DatasetImage", "PromptRow", "PromptRows", "PromptOrder", "check_source", "load_prompts"]

LINE_SUFFIXES = (".txt", ".jsonl")
FROM_DATA = "from data"  # split / revision / subset default: the data section's (eval passes its own, None included)
SUFFIXES = ", ".join((*LINE_SUFFIXES, *FILE_BUILDERS))


def load_prompts(
    path: str | Path,
    key: str = "data.train_file",
    data=None,
    split: str = FROM_DATA,
    revision: str | None = FROM_DATA,
    rank: int = 0,
    local_rank: int = 0,
    section: str | None = None,
    subset: str | None = FROM_DATA,
) -> PromptRows:
    """The checked rows of prompt source ``path``; ``key`` names its config key in messages.

    ``data``: the ``DataConfig`` whose column keys apply (default: the defaults); ``split`` /
    ``revision``: a DatasetDict's split and a Hub revision (default: ``data.split`` / ``data.revision``;
    eval passes ``eval.split`` / ``eval.revision``). ``rank`` / ``local_rank``: in a multi-rank run a
    dataset that needs downloading or an Arrow cache is prepared by rank 0 first (ds/dist.in_rank_order).
    ``section``: the config section whose ``split`` / ``revision`` / ``subset`` messages name (default: ``key``'s,
    for a ``key`` that is a flag such as ``--prompts``: give it). ``subset``: the config of a dataset of several
    (datasets' ``name``; default ``data.subset``, eval passes ``eval.subset``)."""
    data = _data_config(data)
    section = section or key.split(".")[0]
    split = data.split if split == FROM_DATA else split
    revision = data.revision if revision == FROM_DATA else revision
    subset = data.subset if subset == FROM_DATA else subset
    keys = (data.prompt_key, data.target_image_key, data.text_key)
    check_source(path, key, data, revision, section, subset)
    spec = str(path)
    p = Path(spec)
    local = p.is_file() or p.is_dir()
    if p.suffix in LINE_SUFFIXES and not p.is_dir():
        return LineFile(p, key, keys, _default_keys()).rows()
    if p.is_file() and p.suffix == ".json":
        cvtg = read_cvtg(p, key, keys)  # None: another kind of JSON file, read with datasets below
        if cvtg is not None:
            return cvtg

    def prepare():
        where = p if local else hub_snapshot(spec, revision, key, f"{section}.revision")
        quiet = rank != 0 or not run_log.verbose()  # datasets' bars ("Generating train split"): debug only
        chosen = (split, f"{section}.split", subset, f"{section}.subset")
        return where, *load_table(spec, where, key, keys, *chosen, quiet=quiet)

    where, ds, chosen = in_rank_order(prepare, rank, local_rank, f"{key} {spec}", DataError)
    name = f"{spec} (split {chosen})" if chosen else spec
    base = (where.parent if where.is_file() else where).resolve()
    return TableRows(ds, name, base, key, keys, _default_keys()).rows()


def check_source(
    path: str | Path,
    key: str = "data.train_file",
    data=None,
    revision: str | None = FROM_DATA,
    section: str | None = None,
    subset: str | None = FROM_DATA,
) -> None:
    """The checks of :func:`load_prompts` that read nothing and need no other rank: the source exists
    locally or looks like a Hub dataset id, has a known suffix, and a revision and a subset only where they
    mean something. The trainer runs them before the process group starts (which may first build DeepSpeed's
    CPU op, ~40 s), so a mistyped path fails in seconds."""
    data = _data_config(data)
    revision = data.revision if revision == FROM_DATA else revision
    subset = data.subset if subset == FROM_DATA else subset
    section = section or key.split(".")[0]
    spec = str(path)
    p = Path(spec)
    local = p.is_file() or p.is_dir()
    if revision and local:
        raise DataError(f"{section}.revision {revision} is set but {key} {p} is a local path; remove the revision")
    if subset and (p.is_file() or (p.is_dir() and is_saved_dataset(p))):
        raise DataError(
            f"{section}.subset {subset} is set but {key} {p} is {'one file' if p.is_file() else 'a saved dataset'}, "
            "which has no subsets; remove the subset"
        )
    if p.suffix in LINE_SUFFIXES and not p.is_dir():
        if not p.is_file():
            raise DataError(f"{key} {p} does not exist")
        return
    if p.is_file() and p.suffix not in FILE_BUILDERS:
        raise DataError(f"{key} {p} must end in {SUFFIXES}, or be a dataset directory or a Hub dataset id")
    if not local and (p.suffix in FILE_BUILDERS or not looks_like_hub_id(spec)):
        raise DataError(f"{key} {p} does not exist")


def _data_config(data):
    return DataConfig() if data is None else data


def _default_keys() -> tuple[str, str, str]:
    d = DataConfig()
    return d.prompt_key, d.target_image_key, d.text_key
