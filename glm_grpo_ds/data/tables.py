"""Prompt sets read with the ``datasets`` library: ``.parquet`` / ``.csv`` / ``.json`` files, a directory
written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``, a directory of data files laid out
like a Hub dataset repository, or a Hub dataset id (its cached snapshot, glm_grpo_ds/data/hub.py).

The data stays in Arrow files that are memory-mapped, not loaded (a file or a Hub dataset is first
converted once into the ``datasets`` cache, ``HF_DATASETS_CACHE``; a ``save_to_disk`` directory is
mapped where it is): a rank's memory does not grow with the number of rows. Startup checks every row
in batches of Arrow data (a non-empty prompt; target images that exist and parse), then ``rows[i]``
reads row i when a step samples it.

Columns: ``data.prompt_key`` (required, text), ``data.target_image_key`` (optional: a path relative
to the file's directory / the dataset directory, or a ``datasets.Image`` column, whose bytes reach the
rewards as a :class:`~glm_grpo_ds.data.rows.DatasetImage`), ``data.text_key`` (optional); every
other non-null column is passed to the rewards (``datasets`` features such as images decoded).
Row numbers in messages count from 0, like ``dataset[i]`` and the row indices of metrics.
"""

from __future__ import annotations

import io
import json
import re
from functools import cached_property
from pathlib import Path

from .folder_files import check_folder
from .lines import check_image, check_target
from .rows import DataError, DatasetImage, PromptRow, PromptRows, reserved_clash

FILE_BUILDERS = {".parquet": "parquet", ".csv": "csv", ".json": "json"}
BATCH = 8192  # rows per Arrow batch of the startup check
BLANK_HEAD = 65536  # bytes of a CSV file read for the blank lines before its header


def is_saved_dataset(path: Path) -> bool:
    """A directory written by ``save_to_disk`` (a Dataset or a DatasetDict)."""
    return (path / "dataset_dict.json").is_file() or (path / "state.json").is_file()


def load_table(source: str, local: Path, key: str, keys, split: str, split_key: str, subset, subset_key, quiet: bool):
    """``(dataset, split)``: the ``datasets.Dataset`` of a file / directory ``local`` (``source``: what
    the config said) and the split taken from a DatasetDict (None for one file or one saved Dataset);
    ``subset``: the config of a directory / Hub dataset of several (datasets' ``name``; None: its only one).
    May build the Arrow cache: call it through ds/dist.in_rank_order."""
    import datasets
    import pyarrow as pa

    if quiet:
        datasets.disable_progress_bars()
    # datasets logs a file it cannot read at ERROR, then raises: the line below names the file, the key and the
    # reason once; its own log printed the reason twice before it
    verbosity = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    try:
        if local.is_file():
            # only an empty cell is missing: pandas' defaults also read NA, None, null, nan, N/A as missing, which
            # turned a prompt "NA" into an empty-prompt error and a text "None" into no text
            csv = {"converters": {keys[0]: str, keys[2]: str}, "keep_default_na": False, "na_values": [""]}
            # a blank line is a row with an empty prompt, refused as it is with more columns (pandas skipped it);
            # blank lines before the header are no rows, and the header still comes first
            csv["skip_blank_lines"] = False
            extra = dict(csv, skiprows=_blank_head(local)) if local.suffix == ".csv" else {}
            # one file is one split ("train" to datasets); data.split chooses among a directory's splits
            return datasets.load_dataset(FILE_BUILDERS[local.suffix], data_files=str(local), **extra)["train"], None
        if is_saved_dataset(local):
            loaded = datasets.load_from_disk(str(local))
        else:
            check_folder(local, source, key, split_key)
            loaded = datasets.load_dataset(str(local), name=subset)
    except DataError:  # a ValueError that already says it all (check_folder)
        raise
    except (datasets.exceptions.DatasetGenerationError, pa.ArrowException, ValueError, OSError) as err:
        cause = err.__cause__ or err
        if "corresponds to no data" in str(cause):  # datasets' words for a file without rows
            raise DataError(f'{key} {source} holds no prompts; add rows with a "{keys[0]}" column') from None
        configs = re.search(r"(?:available configs|Available): (\[.*?\])", str(cause))
        if configs:  # several configs, none or an unknown one chosen: datasets' first line names no fix
            which = f"has no subset {subset!r}" if subset else "holds several subsets (configs)"
            raise DataError(f"{key} {source} {which}; set {subset_key} to one of {configs.group(1)}") from None
        reason = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
        kind = type(cause).__name__
        if kind == "CastError":  # its first line, "Couldn't cast", left out its last: "because column names ..."
            differ = ", ".join(sorted(set(cause.table_column_names) ^ set(cause.requested_column_names)))
            why = f"{str(cause).splitlines()[-1].removeprefix('because ')}: {differ} not in every file"
            raise DataError(
                f"{key} {source} cannot be read as a dataset ({kind}: {why}); give its files the same columns"
            ) from None
        if kind == "EmptyDataError":  # pandas' words for a CSV without even a header
            raise DataError(f'{key} {source} is empty; add a header with a "{keys[0]}" column and rows') from None
        if local.is_dir() and kind in ("EmptyDatasetError", "DataFilesNotFoundError"):
            raise DataError(
                f"{key} {source} is a folder without prompt files ({reason}); point {key} at a prompt file (.txt, "
                ".jsonl, .json, .csv, .parquet), a folder laid out like a Hub dataset repo (data/train-*.parquet), or "
                "a dataset saved with save_to_disk (docs/configuration.md#prompt-data)"
            ) from None
        raise DataError(f"{key} {source} cannot be read as a dataset ({kind}: {reason})") from None
    finally:
        datasets.logging.set_verbosity(verbosity)
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise DataError(
                f'{key} {source}: split "{split}" not found; set {split_key} to one of: {", ".join(loaded)}'
            )
        return loaded[split], split
    return loaded, None


def _blank_head(path: Path) -> int:
    """How many blank lines a CSV file starts with."""
    with open(path, "rb") as f:
        lines = f.read(BLANK_HEAD).split(b"\n")
    return next((n for n, line in enumerate(lines) if line.strip()), 0)


class TableRows:
    """Checks a ``datasets.Dataset`` of prompts once, then reads its rows on demand.
    ``name``: the source in messages; ``base``: where relative target paths start."""

    def __init__(self, ds, name: str, base: Path, key: str, keys: tuple[str, str, str], default_keys):
        self.ds, self.name, self.base, self.keys = ds, name, base, keys
        # The memory-mapped Arrow table itself: a Dataset from load_dataset / load_from_disk has no
        # indices mapping (save_to_disk flattens it), so its row i is the dataset's row i, read raw (no
        # image decoding) and ~5x faster than through Dataset.__getitem__.
        self.table = ds.data.table
        if self.table.num_rows != len(ds):
            raise DataError(f"{key} {name}: a dataset with an indices mapping; save it with save_to_disk first")
        self._check_columns(default_keys)
        if len(ds) == 0:
            raise DataError(f'{key} {name} holds no prompts; add rows with a "{keys[0]}" column')
        self._check_rows()

    def _check_columns(self, default_keys) -> None:
        from datasets import Image, Value

        cols, feats = self.ds.column_names, self.ds.features
        listed = f"(columns: {', '.join(cols)})"
        for setting, name, default in zip(("prompt_key", "target_image_key", "text_key"), self.keys, default_keys):
            # the optional columns may be absent under their default names; a name the user chose must exist
            if name not in cols and (setting == "prompt_key" or name != default):
                fix = f"set data.{setting} to the right one"
                raise DataError(f'data.{setting} "{name}" is not a column of {self.name} {listed}; {fix}')
        clash = reserved_clash(cols, self.keys)
        if clash:
            raise DataError(f"{self.name}: column {clash}")
        pk, tk, _ = self.keys
        if type(feats[pk]).__name__ == "Json":  # datasets' type for a column of mixed values: say which is not text
            self._not_text(pk)
        if not (isinstance(feats[pk], Value) and feats[pk].dtype in ("string", "large_string")):
            raise DataError(
                f'data.prompt_key "{pk}" of {self.name} holds {feats[pk]}, not text; pick the prompt column'
            )
        self.target = None
        if tk in cols:
            if isinstance(feats[tk], Image):
                self.target = "image"
            elif isinstance(feats[tk], Value) and feats[tk].dtype in ("string", "large_string"):
                self.target = "path"
            else:
                raise DataError(
                    f'data.target_image_key "{tk}" of {self.name} holds {feats[tk]}; it must be image paths (text) '
                    "or a datasets.Image column"
                )

    def _not_text(self, pk: str) -> None:
        """Refuse the first row whose prompt, in a column of JSON values, is not a string."""
        start = 0
        for batch in self.table.select([pk]).to_batches(max_chunksize=BATCH):
            for j, cell in enumerate(batch.column(pk).to_pylist()):
                value = None if cell is None else json.loads(cell)
                if value is not None and not isinstance(value, str):
                    where = f'{self.name}: row {start + j}: "{pk}"'
                    raise DataError(f"{where} is {json.dumps(value)}, not text; quote it or drop the row")
            start += batch.num_rows

    def _check_rows(self) -> None:
        """Every row, in Arrow batches (memory stays flat): prompts non-empty, target images readable."""
        import pyarrow.compute as pc

        pk, tk, _ = self.keys
        cols = [pk] + ([tk] if self.target else [])
        start = 0
        for batch in self.table.select(cols).to_batches(max_chunksize=BATCH):
            prompts = batch.column(pk)
            empty = pc.or_kleene(pc.is_null(prompts), pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(prompts)), 0))
            if pc.any(empty).as_py():
                row = start + pc.index(empty, True).as_py()
                raise DataError(f'{self.name}: row {row}: empty "{pk}"; give every row a prompt or drop the row')
            if self.target:
                for j, value in enumerate(batch.column(tk).to_pylist()):
                    if value is not None:
                        self._target(start + j, value, check=True)
            start += batch.num_rows

    def _target(self, i: int, value, check: bool):
        """A row's target image: an absolute path (str), a DatasetImage (bytes in the dataset) or None."""
        tk = self.keys[1]
        where = f"{self.name}: row {i}: {tk}"
        if isinstance(value, dict):  # a datasets.Image cell: {"bytes": ..., "path": ...}
            if value.get("bytes"):
                if check:
                    check_image(
                        lambda: io.BytesIO(value["bytes"]), f"{where} (image bytes)", "replace it or drop the row"
                    )
                return DatasetImage(value["bytes"], f"{self.name} row {i}")
            value = value.get("path")
            if not value:
                return None
        if check:
            return str(check_target(self.base, f"{where} {value}", value, str(self.base)))
        return str((self.base / value).resolve())

    @cached_property
    def decoded(self) -> dict:
        """The text and extra columns whose values ``datasets`` decodes (images, JSON, ...) -> their feature."""
        from datasets.features.features import require_decoding

        # text too: a column of strings and lists of them (one per region) is JSON, and reached ocr as JSON text
        return {k: f for k, f in self.ds.features.items() if k not in self.keys[:2] and require_decoding(f)}

    def read(self, i: int) -> PromptRow:
        from datasets.features.features import decode_nested_example as decode

        raw = self.table.slice(i, 1).to_pylist()[0]
        pk, tk, xk = self.keys
        prompt = raw.pop(pk).strip()
        target = raw.pop(tk, None)
        target = None if target is None else self._target(i, target, check=False)
        text = raw.pop(xk, None)
        text = decode(self.decoded[xk], text) if text is not None and xk in self.decoded else text
        extra = {k: v if k not in self.decoded else decode(self.decoded[k], v) for k, v in raw.items() if v is not None}
        return PromptRow(index=i, prompt=prompt, target_image=target, text=text, extra=extra)

    def rows(self) -> PromptRows:
        return PromptRows(self.read, len(self.ds), self.name)
