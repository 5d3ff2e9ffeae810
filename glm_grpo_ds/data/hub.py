"""Hugging Face Hub dataset ids (``data.train_file: org/name``) resolved through the local HF cache
(a multi-rank run prepares it in rank order: ds/dist.in_rank_order).

A Hub id becomes a local snapshot directory with ``huggingface_hub.snapshot_download`` (the whole
dataset repository, downloaded once into ``HF_HUB_CACHE``; ``data.revision`` pins a branch, tag or
commit). Offline (``HF_HUB_OFFLINE=1`` or ``HF_DATASETS_OFFLINE=1``) nothing is contacted: the
cached snapshot is used, and a dataset that is not cached is one line naming the id and the
``hf download`` command that fetches it. The snapshot is then read like a local dataset directory
(glm_grpo_ds/data/tables.py).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .rows import DataError

# org/name or name: letters, digits, "-", "_", "." (the Hub's rule), not a path like ./x or /x
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?$")


def looks_like_hub_id(spec: str) -> bool:
    return bool(_HUB_ID.match(spec)) and "--" not in spec and ".." not in spec


def offline() -> str | None:
    """The environment variable that puts the run offline for datasets, if one does (datasets' rule:
    HF_DATASETS_OFFLINE when set, else HF_HUB_OFFLINE)."""
    true = {"1", "ON", "YES", "TRUE"}
    if os.environ.get("HF_DATASETS_OFFLINE") is not None:
        return "HF_DATASETS_OFFLINE=1" if os.environ["HF_DATASETS_OFFLINE"].upper() in true else None
    return "HF_HUB_OFFLINE=1" if os.environ.get("HF_HUB_OFFLINE", "").upper() in true else None


def hub_snapshot(repo_id: str, revision: str | None, key: str, revision_key: str) -> Path:
    """The local snapshot directory of Hub dataset ``repo_id`` (downloaded unless offline)."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    off = offline()
    at = f" at revision {revision}" if revision else ""
    fetch = f"hf download {repo_id} --repo-type dataset" + (f" --revision {revision}" if revision else "")
    what = f"{key} {repo_id} is neither a file nor a directory, and as a Hub dataset id{at}"
    try:
        return Path(snapshot_download(repo_id, repo_type="dataset", revision=revision, local_files_only=bool(off)))
    except LocalEntryNotFoundError as err:
        if off:
            raise DataError(
                f"{what} it is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and {off} forbids "
                f"downloading it; fetch it once where the Hub is reachable ({fetch}, same HF_HUB_CACHE) or fix the path"
            ) from None
        reason = str(err.__cause__ or err).splitlines()[0]
        raise DataError(f"{what} it cannot be downloaded ({reason}) and is not cached; check the network") from None
    except RevisionNotFoundError:
        raise DataError(f"{key} {repo_id}: revision {revision} does not exist on the Hub; fix {revision_key}") from None
    except RepositoryNotFoundError:
        raise DataError(
            f"{what} it does not exist on the Hub or is private / gated (log in with `hf auth login` and accept its "
            "terms on its page); fix the id or the path"
        ) from None
    except HfHubHTTPError as err:
        raise DataError(f"{key} {repo_id}: the Hub refused the download ({str(err).splitlines()[0]})") from None
