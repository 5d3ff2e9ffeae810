"""Writing a file so that a reader finds the old contents or the new, never a part: the text goes to a temporary
file beside it, which replaces the file in one rename (``os.replace``, atomic on one filesystem). A run killed, a
signal or a full disk while writing leaves the earlier file whole (and at worst a ``.tmp`` beside it)."""

from __future__ import annotations

import os
from pathlib import Path


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Replace ``path``'s contents with ``text`` (UTF-8) in one rename."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
