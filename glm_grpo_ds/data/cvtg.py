"""CVTG-2K prompt files (TextCrafter, NJU-PCALab; the ``dnkdnk/CVTG-2K`` dataset): one JSON document
``{"data_list": [entry, ...]}`` per file, ``CVTG/<n>.json`` and ``CVTG-Style/<n>.json`` (n = 2..5 text regions)
with fine-grained entries, ``<n>_combined.json`` without them.

An entry, as TextCrafter's ``eval.py`` reads it: ``prompt`` (the whole description, each text to render in
single quotes: ``... a title that says 'The Mystery' in large italic ...``), ``index``, and in the fine-grained
files ``carrier_list`` (the object carrying each text) and ``sentence_list`` (one clause per text region).
A row's ``text`` becomes the list of the texts to render, one per region, which the OCR rewards score region by
region (glm_grpo_ds/rewards/ocr.py ``text_regions``): the quoted spans of each ``sentence_list`` clause, else
the prompt's quoted spans (in the order they appear). An entry's own ``text`` field, when it has one, wins.
The other fields (``carrier_list``, ``sentence_list``, style attributes) reach the rewards as extras; the
entry's ``index`` does not: a sample's ``index`` is its row number in the file (data/rows.py, as for every source).

Quotes: a single-quoted span must open and close outside a word, so an apostrophe inside it (``'Joe's
Diner'``) or in the surrounding prose (``the chef's hat``) does not split it; double and curly quotes count too.
The file is one JSON document, so it is read whole (CVTG-2K's files hold at most 500 entries, ~200 KB).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from .lines import BOM, check_target
from .rows import DataError, PromptRow, PromptRows

DATA_LIST = "data_list"
SNIFF_BYTES = 65536  # a CVTG-2K file opens with {"data_list": [...; other .json files go to `datasets` unread
QUOTED = re.compile(
    r"(?<!\w)'([^\s'](?:.*?\S)?)'(?!\w)"  # 'single': apostrophes inside allowed, no space just inside
    r'|"([^"]+)"'
    r"|\u201c([^\u201c\u201d]+)\u201d"  # “curly double”
    r"|(?<!\w)\u2018(.+?)\u2019(?!\w)"  # ‘curly single’
)


def quoted_spans(text: str) -> list[str]:
    """The quoted spans of ``text`` in the order they appear, stripped, empty ones dropped."""
    spans = (next(g for g in m.groups() if g is not None).strip() for m in QUOTED.finditer(text))
    return [s for s in spans if s]


def target_texts(entry: dict, prompt: str) -> list[str] | None:
    """The texts to render of a CVTG-2K entry, one per region: each ``sentence_list`` clause's quoted spans,
    else the prompt's; None if there are none."""
    clauses = entry.get("sentence_list")
    if isinstance(clauses, list) and clauses:
        texts = [span for clause in clauses if isinstance(clause, str) for span in quoted_spans(clause)]
        if texts:
            return texts
    return quoted_spans(prompt) or None


def read_cvtg(path: Path, key: str, keys: tuple[str, str, str]) -> PromptRows | None:
    """The rows of a CVTG-2K file, or None when ``path`` is another kind of ``.json`` (read by ``datasets``).
    ``keys``: (prompt, target_image, text) field names (data.*_key)."""
    with open(path, "rb") as f:
        head = f.read(SNIFF_BYTES)
    if not head.removeprefix(BOM).lstrip().startswith(b"{") or f'"{DATA_LIST}"'.encode() not in head:
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8-sig"))  # -sig: a byte order mark is skipped
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None  # JSON lines whose first object has a data_list key, say: datasets reads it (or says why not)
    if not isinstance(doc, dict) or not isinstance(doc.get(DATA_LIST), list):
        return None
    prompt_key, target_key, text_key = keys
    rows = []
    for i, entry in enumerate(doc[DATA_LIST]):
        where = f"{path}: {DATA_LIST}[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get(prompt_key), str) or not entry[prompt_key].strip():
            raise DataError(f'{where} needs a non-empty string field "{prompt_key}"; fix or drop the entry')
        extra = dict(entry)
        prompt = extra.pop(prompt_key).strip()
        target = extra.pop(target_key, None)
        if target is not None:
            target = str(check_target(path.parent, f"{where}: {target_key} {target}", target, "the .json file"))
        text = extra.pop(text_key, None)
        rows.append((prompt, target, text if text is not None else target_texts(entry, prompt), extra))
    if not rows:
        raise DataError(f'{key} {path} holds no prompts; add entries with a "{prompt_key}" to its "{DATA_LIST}"')

    def read(i: int) -> PromptRow:
        prompt, target, text, extra = rows[i]
        return PromptRow(index=i, prompt=prompt, target_image=target, text=text, extra=dict(extra))

    return PromptRows(read, len(rows), str(path))
