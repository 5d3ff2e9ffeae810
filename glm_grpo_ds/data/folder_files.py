"""A directory of data files (``data.train_file: /data/prompts/``, a Hub snapshot): the files ``datasets`` would
leave out of it, refused before it is read.

``datasets.load_dataset(dir)`` reads one format per folder, its most common (``a.jsonl`` + ``b0.parquet`` +
``b1.parquet`` read the parquet rows alone), and when some file or folder names name a split (``train``, ``test``,
``dev``, ``eval``, ... set off by ``-``, ``_``, ``.``, a digit or ``/``) only the files that name one (``a.jsonl`` +
``x_test.jsonl`` is split "test" alone, ``a.jsonl`` in none). Either way the others were dropped without a word.
Files of another split are not left out: choosing a split among ``data/train-*`` and ``data/test-*`` is the Hub
layout's point. A README whose ``configs:`` list their ``data_files`` says itself which files are data.
"""

from __future__ import annotations

from pathlib import Path

from .rows import DataError

# the table formats datasets reads a folder of (images and other media beside them are not prompt files)
TABLE_FORMATS = {
    ".parquet": "parquet",
    ".csv": "csv",
    ".tsv": "csv",
    ".json": "json",
    ".jsonl": "json",
    ".ndjson": "json",
    ".txt": "text",
    ".arrow": "arrow",
}
SHOWN = 5  # file names a message lists before "and N more"


def check_folder(folder: Path, source: str, key: str, split_key: str) -> None:
    """Refuse, in one line, a folder of which ``datasets`` would read only some table files."""
    from datasets.data_files import FILES_TO_IGNORE
    from datasets.load import dataset_module_factory

    base = folder.resolve()
    module = dataset_module_factory(str(base)).builder_configs_parameters
    if any("data_files" in config for config in (module.metadata_configs or {}).values()):
        return
    read = {
        Path(f).relative_to(base).as_posix(): split
        for split, fs in module.builder_configs[0].data_files.items()
        for f in fs
    }
    files = sorted(
        p.relative_to(base).as_posix()
        for p in base.rglob("*")
        if _format(p.name)
        and p.name not in FILES_TO_IGNORE
        and p.is_file()
        # datasets skips hidden files and folders (.cache/ of `hf download --local-dir`) and __special__ ones
        and not any(part.startswith((".", "__")) for part in p.relative_to(base).parts)
    )
    left = [f for f in files if f not in read]
    if not left:
        return
    formats = sorted({_format(f) or Path(f).suffix.lstrip(".") for f in read})
    if len({_format(f) for f in files}) > 1 or {_format(f) for f in left} - set(formats):
        raise DataError(
            f"{key} {source} mixes file formats and datasets reads only its {', '.join(formats)} files, leaving out "
            f"{_listed(left)}; keep one format per folder (convert or move the others), or point {key} at one file"
        )
    named = _listed([f"{f} ({split})" for f, split in read.items()])
    raise DataError(
        f"{key} {source}: datasets splits this folder by file names ({named}) and leaves out {_listed(left)}, which "
        f"name no split; name every file by its split (train-0.jsonl, test-0.jsonl; {split_key} picks one) or "
        "rename the others"
    )


def _format(name: str) -> str | None:
    """The table format of a file name (``a.jsonl.gz``: json, as datasets reads it), None for any other file."""
    return next((TABLE_FORMATS[f".{s.lower()}"] for s in name.split(".")[1:] if f".{s.lower()}" in TABLE_FORMATS), None)


def _listed(names: list[str]) -> str:
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more
