"""``.txt`` and ``.jsonl`` prompt files, read line by line without holding the rows in memory.

One pass at startup checks every line (valid JSON, a non-empty prompt, target images that exist and
parse) and records where each row starts (8 bytes per row); ``rows[i]`` reads and parses line i
again when a step samples it. Lines end at ``\n`` (``\r\n`` too), in a ``.txt`` as in a ``.jsonl`` (JSON Lines'
rule): U+2028, a form feed or a lone ``\r`` inside a prompt is part of it (``str.splitlines`` split at them, so
a ``.txt`` line held several prompts, and line numbers differed from an editor's). Blank lines are skipped. A UTF-8
byte order mark (Windows editors) is skipped. The file must not change during the run (checked at every read).

A ``.txt`` file with a ``target_images/`` folder beside it gets a target image per line from that folder
(the seeds' layout; the naming rule and its checks are data/target_folder.py); the first load of it says so
once in the log.
"""

from __future__ import annotations

import json
import os
from array import array
from pathlib import Path

from ..runtime import log
from .rows import DataError, PromptRow, PromptRows, reserved_clash
from .target_folder import LineTargets, target_folder

BOM = b"\xef\xbb\xbf"  # UTF-8's byte order mark, which Windows editors write first


def check_target(base: Path, where: str, target, relative_to: str) -> Path:
    """The absolute path of a row's target image (relative paths from ``base``), checked now (header
    read: exists, readable, an image) so a bad row fails the run before training instead of at the
    step that samples it. ``where`` starts the message (``file:line: target_image x``)."""
    if not isinstance(target, str) or not target:
        raise DataError(f"{where} must be a non-empty path string")
    path = (base / target).resolve()
    if not path.is_file():
        raise DataError(f"{where} not found at {path}; fix the path (relative to {relative_to}) or add the image")
    check_image(lambda: path, where, "replace the file or drop the row")
    return path


def check_image(source, where: str, fix: str) -> None:
    """Open ``source()`` (a path or a file object) with PIL and read its header, else one DataError line."""
    from PIL import UnidentifiedImageError

    from .image_files import open_image

    try:
        with open_image(source()) as img:
            img.size  # noqa: B018 - the header is read lazily; make sure it parses
    except (OSError, UnidentifiedImageError) as err:
        raise DataError(f"{where} cannot be read as an image ({err}); {fix}") from None


class LineFile:
    """A ``.txt`` (one prompt per line) or ``.jsonl`` (one JSON object per line) prompt file.
    ``keys``: (prompt, target_image, text) key names of the JSON objects (data.*_key); ``default_keys``: their
    defaults (an optional key renamed must be on some line)."""

    def __init__(self, path: Path, key: str, keys: tuple[str, str, str], default_keys: tuple[str, str, str]):
        self.path, self.keys, self.jsonl = path, keys, path.suffix == ".jsonl"
        self.offsets = array("q")  # byte offset of each row's line
        self.lines = array("q")  # the 1-based line number of each row (for a target_images/ folder's names)
        self.seen: set[str] = set()  # the keys of a .jsonl's lines
        stat = path.stat()
        self.stamp = (stat.st_size, stat.st_mtime_ns)
        try:
            total_lines = self._scan()
        except OSError as err:  # unreadable (permissions, an I/O error): one line, before any rank loads a model
            raise DataError(
                f"{key} {path} cannot be read ({err.strerror or err}); check the file and its permissions"
            ) from None
        if not self.offsets:
            hint = "one prompt per line" if not self.jsonl else f'one JSON object per line with a "{keys[0]}" field'
            raise DataError(f"{key} {path} holds no prompts; add {hint}")
        if self.jsonl:
            self._check_keys(default_keys)
        folder = None if self.jsonl else target_folder(path)
        self.targets = None if folder is None else LineTargets(folder, path, self.lines, total_lines)
        if self.targets is not None:
            self._check_targets()
            start = "from 0" if self.targets.first == 0 else "from 1"
            log.info(f"{key} {path}: target images from {folder}/, one per line (line numbers {start})")
        self.lines = None  # only the folder's matching needed them

    def _check_targets(self) -> None:
        """Every target image's header parses, before training (as for a .jsonl's target_image)."""
        for row, line in enumerate(self.lines):
            target = self.targets.path(row)
            check_image(lambda t=target: t, f"{self.path}:{line}: target image {target}", "replace the file")

    def _check_keys(self, default_keys: tuple[str, str, str]) -> None:
        """An optional key renamed must be on some line (a typo scored no text); no other key may be reserved."""
        listed = f"(keys: {', '.join(sorted(self.seen))})"
        for setting, name, default in zip(("target_image_key", "text_key"), self.keys[1:], default_keys[1:]):
            if name != default and name not in self.seen:
                fix = f"set data.{setting} to the right one"
                raise DataError(f'data.{setting} "{name}" is not a key of any line of {self.path} {listed}; {fix}')
        clash = reserved_clash(self.seen, self.keys)
        if clash:
            raise DataError(f"{self.path}: key {clash}")

    def _scan(self) -> int:
        """Check every line, record where each row starts; the file's number of lines."""
        lineno = 0
        with open(self.path, "rb") as f:
            offset = len(BOM) if f.read(len(BOM)) == BOM else 0
            f.seek(offset)
            for raw in f:  # splits at b"\n" only
                lineno += 1
                try:
                    line = raw.decode("utf-8").rstrip("\r\n")
                except UnicodeDecodeError as err:
                    raise DataError(
                        f"{self.path}:{lineno}: not UTF-8 text ({err.reason} at byte {offset + err.start}); "
                        "save the file as UTF-8"
                    ) from None
                if line.strip():
                    if self.jsonl:
                        self.seen.update(self._parse(line, lineno, check=True)[4])
                    self.offsets.append(offset)
                    self.lines.append(lineno)
                offset += len(raw)
        return lineno

    def _parse(self, line: str, lineno: int, check: bool) -> tuple[str, str | None, object, dict, list[str]]:
        """(prompt, absolute target path, text, extra keys, the line's keys) of a JSON line; ``check``: validate it."""
        p, (prompt_key, target_key, text_key) = self.path, self.keys
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"{p}:{lineno}: not valid JSON ({err.msg} at column {err.colno})") from None
        if check and (
            not isinstance(obj, dict) or not isinstance(obj.get(prompt_key), str) or not obj[prompt_key].strip()
        ):
            there = isinstance(obj, dict) and prompt_key in obj
            # the field there with a value that is not text: said as it is
            hint = f" (here it is {json.dumps(obj[prompt_key])})" if there else _key_hint(obj, (target_key, text_key))
            raise DataError(f'{p}:{lineno}: each line needs a non-empty string field "{prompt_key}"{hint}')
        keys = list(obj)
        target = obj.pop(target_key, None)
        if target is not None:
            where = f"{p}:{lineno}: {target_key} {target}"
            target = str(
                check_target(p.parent, where, target, "the .jsonl file") if check else (p.parent / target).resolve()
            )
        text = obj.pop(text_key, None)
        return obj.pop(prompt_key).strip(), target, text, obj, keys

    def read(self, i: int) -> PromptRow:
        stat = os.stat(self.path)
        if (stat.st_size, stat.st_mtime_ns) != self.stamp:
            raise DataError(f"{self.path} changed while the run was reading it; restore it, or restart the run")
        with open(self.path, "rb") as f:
            f.seek(self.offsets[i])
            line = f.readline().decode("utf-8").rstrip("\r\n")
        if not self.jsonl:
            target = None if self.targets is None else self.targets.path(i)
            return PromptRow(index=i, prompt=line.strip(), target_image=target)
        prompt, target, text, extra, _ = self._parse(line, -1, check=False)
        return PromptRow(index=i, prompt=prompt, target_image=target, text=text, extra=extra)

    def rows(self) -> PromptRows:
        return PromptRows(self.read, len(self.offsets), str(self.path))


def _key_hint(obj, others: tuple[str, ...]) -> str:
    """`` (this line has ...: set data.prompt_key=...)`` naming the line's keys and the first holding text that is
    not one of the ``others`` fields (the target image's, the text to render's)."""
    if not isinstance(obj, dict) or not obj:
        return ""
    text = next((k for k, v in obj.items() if isinstance(v, str) and v.strip() and k not in others), None)
    fix = f": set data.prompt_key={text} if it holds the prompts" if text else ""
    return f" (this line has {', '.join(obj)}{fix})"
