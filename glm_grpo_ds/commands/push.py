"""``glm-grpo push``: upload a finished run's weights with their model cards to the Hugging Face Hub.

The final adapter or model, and with ``--checkpoints`` each checkpoint's adapter:

    glm-grpo push OUTPUT_DIR [--repo-id NAMESPACE/NAME] [--private | --no-private] [--revision BRANCH]
                             [--checkpoints | --no-checkpoints]

Without options it does what the run's ``hub`` section asked for (read from ``OUTPUT_DIR/config.json``),
so it retries a run whose upload failed (exit status 4) exactly as the run meant it; the options push a
run trained without ``hub.repo_id``, or elsewhere. ``final_adapter/`` (or ``final_model/``) goes to the
root of the repo, ``final_adapter_ema/`` (lora.ema_decay) to ``ema/``, ``checkpoints/step_N/adapter/`` to
``checkpoints/step_N/``. A weights directory
without a glm-grpo card gets one, written from the run's files (glm_grpo_ds/sharing/model_card.py); an
existing one is kept. The token comes from ``HF_TOKEN`` or ``hf auth login``; uploads go through even
under ``HF_HUB_OFFLINE=1`` (glm_grpo_ds/sharing/hub.py). Exit status: 0 uploaded, 1 an upload failed (the
local files are untouched), 2 bad input (not a finished run, no repo id, a repo that cannot be used).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..config import ConfigError
from ..config.fields import is_repo_id
from ..lifecycle.checkpoint import FINAL_ADAPTER_EMA, OutputDirError
from ..observability.records import read_run_record
from ..sharing.card_parts import CARD, is_ours, is_users
from ..sharing.hub import prepare_repo, short_error, upload
from ..sharing.model_card import CHECKPOINT_PREFIX, EMA_SUBFOLDER, write_run_card
from .cli import parser_for


def _final_weights(out: Path) -> Path:
    for name in ("final_adapter", "final_model"):
        if (out / name).is_dir() and any((out / name).glob("*.safetensors")):
            return out / name
    raise FileNotFoundError(
        f"{out} has no final_adapter/ or final_model/ with weights: the run has not finished (a checkpoint's "
        f"adapter can be uploaded with `hf upload REPO {out}/checkpoints/step_N/adapter`)"
    )


def _checkpoint_adapters(out: Path) -> list[tuple[int, Path]]:
    """(step, adapter dir) of the complete checkpoints holding an adapter, by step."""
    found = []
    for ckpt in (out / "checkpoints").glob("step_*"):
        state = ckpt / "trainer_state.json"
        if ckpt.suffix or not state.is_file() or not (ckpt / "adapter" / "adapter_config.json").is_file():
            continue  # .tmp / .deleting, incomplete, or full fine-tuning (DeepSpeed shards only)
        found.append((int(json.loads(state.read_text(encoding="utf-8"))["step"]), ckpt / "adapter"))
    return sorted(found)


def _ensure_card(out: Path, weights: Path, step: int | None, target: dict, elsewhere: bool) -> None:
    """A card of ours for ``weights``, written when missing, when the upload goes ``elsewhere`` than the run's
    ``hub`` section said (its card would name a local path, another repo or no subfolder / revision), or when the
    card names another repo (written by an earlier push elsewhere); a card the user wrote is kept."""
    card = weights / CARD
    if is_users(card):
        print(f"kept the model card {card}: not one glm-grpo or peft wrote, it is uploaded as it is")
        return
    if elsewhere or not is_ours(card) or f'"{target["repo_id"]}"' not in card.read_text(encoding="utf-8"):
        write_run_card(out, weights, step, hub=target)
        print(f"wrote the model card {weights / CARD}")


def push_run(output_dir, repo_id=None, private=None, revision=None, checkpoints=None) -> int:
    """Upload the run in ``output_dir``; None options come from its config's ``hub`` section. Returns
    the number of failed uploads; raises FileNotFoundError / HubError / ConfigError on bad input."""
    from huggingface_hub import HfApi

    out = Path(output_dir)
    saved = read_run_record(out)  # OutputDirError: not one (a model's config.json, say)
    if saved is None:
        raise FileNotFoundError(f"{out}/config.json not found: {out} is not a glm-grpo run directory")
    hub = saved["train"].get("hub") or {}
    repo_id = repo_id or hub.get("repo_id")
    if not repo_id:
        raise ConfigError(f"{out} was trained without hub.repo_id: pass --repo-id NAMESPACE/NAME")
    if not is_repo_id(repo_id):
        raise ConfigError(f"--repo-id {repo_id!r} is not a Hub repo id: write NAMESPACE/NAME")
    private = hub.get("private", True) if private is None else private
    revision = revision or hub.get("revision")
    checkpoints = hub.get("push_checkpoints", False) if checkpoints is None else checkpoints
    weights = _final_weights(out)
    jobs = [(weights, None, None)]
    if any((out / FINAL_ADAPTER_EMA).glob("*.safetensors")):  # lora.ema_decay's average, beside the adapter
        jobs.append((out / FINAL_ADAPTER_EMA, None, EMA_SUBFOLDER))
    if checkpoints:
        found = _checkpoint_adapters(out)
        jobs += [(adapter, step, f"{CHECKPOINT_PREFIX}/{adapter.parent.name}") for step, adapter in found]
        if not found:  # a full fine-tuning's checkpoints hold DeepSpeed shards only; or none were kept
            print(
                f"glm-grpo push: --checkpoints: no checkpoint in {out / 'checkpoints'} holds an adapter (a full "
                "fine-tuning's hold DeepSpeed's shards only): uploading the final weights alone",
                file=sys.stderr,
            )
    target = dict(hub, repo_id=repo_id, revision=revision, push_checkpoints=checkpoints)
    said = (hub.get("repo_id"), hub.get("revision"), hub.get("push_checkpoints", False))  # the run's own target
    elsewhere = (repo_id, revision, checkpoints) != said
    api = HfApi()
    url = prepare_repo(api, repo_id, private, revision, training=False)  # first: a refused push leaves the cards alone
    for folder, step, _ in jobs:
        _ensure_card(out, folder, step, target, elsewhere)
    failed = 0
    for folder, step, path_in_repo in jobs:
        message = f"glm-grpo {'checkpoint at step ' + str(step) if step else 'final ' + folder.name}"
        try:
            commit = upload(api, repo_id, folder, path_in_repo, revision, message)
        except Exception as err:  # report each failure and go on with the others
            failed += 1
            print(f"glm-grpo push: uploading {folder} to {repo_id} failed ({short_error(err)})", file=sys.stderr)
            continue
        where = f"{url}/tree/{revision or 'main'}/{path_in_repo}" if path_in_repo else url
        print(f"uploaded {folder} to {where}: {commit}")
    return failed


def main(argv: list[str] | None = None) -> int:
    p = parser_for("push")
    p.add_argument("output_dir", help="the run's output_dir (holds config.json and final_adapter/ or final_model/)")
    p.add_argument("--repo-id", help="NAMESPACE/NAME (default: the run's hub.repo_id)")
    p.add_argument(
        "--private",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="create the repo private (default: hub.private)",
    )
    p.add_argument("--revision", help="branch to upload to, created if missing (default: hub.revision, else main)")
    p.add_argument(
        "--checkpoints",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also upload every checkpoint's adapter to checkpoints/step_N/ (default: hub.push_checkpoints)",
    )
    a = p.parse_args(argv)
    try:
        failed = push_run(a.output_dir, a.repo_id, a.private, a.revision, a.checkpoints)
    except (FileNotFoundError, ConfigError, OutputDirError) as err:  # HubError is a ConfigError
        print(f"glm-grpo push: {err}", file=sys.stderr)
        return 2
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
