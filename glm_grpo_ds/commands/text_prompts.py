"""``glm-grpo text-prompts OUT.jsonl [--num 32] [--seed 0]``: write the generated text-rendering prompts
(glm_grpo_ds/data/text_prompts.py builds them) to a jsonl file."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..data.text_prompts import text_prompts
from .cli import parser_for


def main(argv: list[str] | None = None) -> int:
    p = parser_for("text-prompts")
    p.add_argument("out", help="the .jsonl file to write")
    p.add_argument("--num", type=int, default=32, help="prompts to write")
    p.add_argument("--seed", type=int, default=0, help="the same seed writes the same prompts")
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        rows = text_prompts(a.num, a.seed)
    except ValueError as err:
        print(f"glm-grpo text-prompts: {err}", file=sys.stderr)
        return 2
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    print(f"wrote {len(rows)} prompts to {out}")
    return 0
