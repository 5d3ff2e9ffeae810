"""What ``from_pretrained(..., output_loading_info=True)`` did not read from a checkpoint's files, as one phrase.

transformers and diffusers fill a weight missing from the files (a partial download or copy, another model's or
version's checkpoint) with fresh random values and say so only in their own log, which a run keeps out of the
console: a training, an evaluation or a merge would run for days on partly random weights. The loaders
(model/policy.py, decoder/image_decoder.py, rewards/clip.py) refuse such a checkpoint with this phrase.
"""

from __future__ import annotations


def unread_weights(info: dict) -> str | None:
    """The weights ``info`` (a loading-info dict of transformers or diffusers) says were missing from the files or of
    another shape, e.g. ``"2 weights are not in its files (a.weight, b.bias)"``; None when every weight was read.
    Weights in the files that the model does not use (``unexpected_keys``) change nothing and are not counted."""
    missing = sorted(info.get("missing_keys") or ())
    mismatched = sorted(k[0] if isinstance(k, tuple) else k for k in info.get("mismatched_keys") or ())
    parts = []
    for keys, what in ((missing, "not in its files"), (mismatched, "of another shape in its files")):
        if keys:
            shown = ", ".join(keys[:3]) + (f", ... ({len(keys) - 3} more)" if len(keys) > 3 else "")
            parts.append(f"{len(keys)} weight{'s are' if len(keys) > 1 else ' is'} {what} ({shown})")
    return "; ".join(parts) or None


def refusal(where, problem: str) -> str:
    """The one line naming the checkpoint ``where`` and what to do."""
    return (
        f"{where}: {problem}: from_pretrained would fill them with random values; the files are incomplete (copy or "
        "download them again) or another model's"
    )
