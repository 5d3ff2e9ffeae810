"""The seeds' data layout: a ``.txt`` prompt file with a ``target_images/`` folder beside it, one target image
per prompt line, named by the line's number (docs/configuration.md#promptstxt-with-a-target_images-folder).

    /data/prompts.txt            a red cube          <- line 1
                                 a sign "OPEN"       <- line 2
    /data/target_images/1.png    line 1's target     (or 0.png for line 1: numbered from 0)
    /data/target_images/2.jpg    line 2's target

The naming rule:

* an image's name is its prompt's line number, then an image suffix (:data:`IMAGE_SUFFIXES`, any case):
  ``7.png``; zero padding is allowed (``0007.png``, any width, widths may differ);
* lines are numbered from 1 as editors, ``grep -n`` and our messages show them, or from 0 as Python's
  ``enumerate`` gives them: a folder holding an image numbered 0 is numbered from 0, any other from 1. A
  wrong guess cannot pass silently: under the rule below it leaves a line without an image or an image
  without a line, and either is an error that says which numbering was assumed;
* every non-blank line needs exactly one image (a folder of images is all-or-nothing; a prompt file where
  only some rows have a target is a ``.jsonl`` with ``target_image`` keys). Blank lines count in the
  numbering (they keep their number, as in an editor) and must have no image;
* files whose names start with ``.`` are ignored (``.DS_Store``); anything else in the folder (another
  name, a non-image suffix, a sub-folder) is refused, so a misnamed image is never silently left out.

Every problem is one :class:`~glm_grpo_ds.data.rows.DataError` line naming the file and the line: two images for
one line, an image for a line that does not exist or is blank, a line without an image, an unreadable image
(its header is read when the prompt file is, data/lines.py, as for ``.jsonl`` targets). The names are kept as
one byte string and an offsets array (about 8 bytes plus the name's length per row), not as a Python object
per row.
"""

from __future__ import annotations

import os
import re
from array import array
from pathlib import Path

from .rows import DataError

TARGET_DIR = "target_images"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff")
_NAMED = re.compile(r"(\d+)(\.[A-Za-z]+)")
_RULE = f"named by its prompt's line number (7.png, 0007.jpg; suffixes {', '.join(IMAGE_SUFFIXES)})"


def target_folder(prompt_file: Path) -> Path | None:
    """The ``target_images/`` folder beside a ``.txt`` prompt file, None when there is none."""
    folder = prompt_file.parent / TARGET_DIR
    return folder.resolve() if folder.is_dir() else None


class LineTargets:
    """The target image of each row of ``prompt_file`` from ``folder`` (checked when built).

    ``lines``: the 1-based line number of each row (blank lines have none); ``total_lines``: the file's line
    count. ``path(row)``: the row's absolute image path; ``first``: 0 or 1, where the numbering starts."""

    def __init__(self, folder: Path, prompt_file: Path, lines: array, total_lines: int):
        self.folder, self.prompt_file = folder, prompt_file
        names = self._scan()
        self.first = 0 if 0 in names else 1
        numbering = "numbered from 0" if self.first == 0 else "numbered from 1, as no image is named 0"
        has_row = set(lines)
        for number in sorted(names):
            line = number + 1 - self.first
            if line > total_lines:
                raise DataError(
                    f"{folder / names[number]}: names line {line} of {prompt_file} ({numbering}), which has "
                    f"{total_lines} lines; remove the image or add its prompt"
                )
            if line not in has_row:
                raise DataError(
                    f"{folder / names[number]}: names line {line} of {prompt_file} ({numbering}), which is blank; "
                    "remove the image or write that line's prompt"
                )
        missing = [line for line in lines if line - 1 + self.first not in names]
        if missing:
            more = f" (and {len(missing) - 1} more: lines {_listed(missing[1:])})" if len(missing) > 1 else ""
            raise DataError(
                f"{prompt_file}:{missing[0]}: no target image for this line in {folder}/ (looked for "
                f"{missing[0] - 1 + self.first} with any zero padding and an image suffix; {numbering}){more}; every "
                "line needs one in this layout: add it, or move rows without a target to a .jsonl file"
            )
        self.offsets, self.blob = array("q", [0]), bytearray()
        for line in lines:
            self.blob += names[line - 1 + self.first].encode("utf-8")
            self.offsets.append(len(self.blob))

    def _scan(self) -> dict[int, str]:
        """number -> file name of every image in the folder; the naming errors."""
        names: dict[int, str] = {}
        with os.scandir(self.folder) as entries:
            for entry in entries:
                if entry.name.startswith("."):
                    continue
                match = _NAMED.fullmatch(entry.name)
                where = self.folder / entry.name
                if not entry.is_file():
                    raise DataError(f"{where}: a folder inside {TARGET_DIR}/, which holds only images {_RULE}; move it")
                if match is None or match.group(2).lower() not in IMAGE_SUFFIXES:
                    raise DataError(
                        f"{where}: not an image {_RULE}, the layout of {TARGET_DIR}/ beside {self.prompt_file}; "
                        "rename it or move it out"
                    )
                number = int(match.group(1))
                if number in names:
                    first, second = sorted((names[number], entry.name))
                    raise DataError(
                        f"{self.folder / first} and {second} both have number {number}: one image per line; keep one"
                    )
                names[number] = entry.name
        if not names:
            raise DataError(
                f"{self.folder}/ beside {self.prompt_file} holds no images; add one per prompt line, {_RULE}, or "
                "remove the folder (then the prompts have no target images)"
            )
        return names

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def path(self, row: int) -> str:
        name = self.blob[self.offsets[row] : self.offsets[row + 1]].decode("utf-8")
        return str(self.folder / name)


def _listed(lines: list[int], most: int = 5) -> str:
    shown = ", ".join(map(str, lines[:most]))
    return shown + (", ..." if len(lines) > most else "")
