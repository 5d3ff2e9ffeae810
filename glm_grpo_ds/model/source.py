"""Where the GLM-Image pipeline comes from: ``model.path`` / ``--model`` / ``--base`` -> a local directory.

    model.path=/models/GLM-Image                      a local GlmImagePipeline directory, used as is
    model.path=zai-org/GLM-Image                      a Hugging Face Hub id: downloaded once into the Hugging
    model.path=zai-org/GLM-Image model.revision=SHA   Face cache (HF_HOME / HF_HUB_CACHE), then read from it;
                                                      a revision (commit, branch or tag) pins it (null = main)
    model.path=random:glm-image                       GLM-Image's configs with random weights built in the process
                                                      (glm_grpo_ds/model/random_weights.py): time and memory only

This is the only module of the package that may contact the Hub, and whether it does is the user's
environment's choice: with ``HF_HUB_OFFLINE=1`` a Hub id is read from the cache only (a one-line error
names the id, the revision, the cache and the fix when it is not there); otherwise
``huggingface_hub.snapshot_download`` asks the Hub which commit the revision is and fetches what the cache
lacks. Everything else loads from the local directory returned here (the reward models take local
directories), so nothing else fetches from the Hub. The commands no longer set ``HF_HUB_OFFLINE``
themselves; the tests, the demo and ``launch/gpu_check.sh`` set it.

Training (:func:`resolve_for_training`) resolves on rank 0 first - it may download - while the other
ranks wait in a collective whose timeout is :data:`DOWNLOAD_WAIT_S` rather than the process group's; then
the other ranks resolve from the cache only (``local_files_only``), so every rank reads the commit rank 0
got. Their caches must be the same directory (shared storage), or hold the model already.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..config.fields import is_repo_id
from .glm_image import AR_DIR, PIPELINE_PARTS, check_pipeline_dir
from .random_weights import RandomSpec, is_random, parse, spec_of

EXAMPLE_ID = "zai-org/GLM-Image"
# How long the other ranks wait for rank 0 to download the model (GLM-Image is ~35 GB).
DOWNLOAD_WAIT_S = 6 * 3600
RANDOM_NOTE = (
    "random weights: its time and memory per step are the model's, its images, rewards and learning mean nothing"
)
_SHA = re.compile(r"[0-9a-f]{40}")


class ModelSourceError(FileNotFoundError):
    """``model.path`` / ``--model`` names no usable pipeline; the message names the fix (exit 2)."""


@dataclass(frozen=True)
class ModelSource:
    """A resolved model: the local pipeline directory to load, and where it came from."""

    path: Path  # the local GlmImagePipeline directory (absolute)
    repo_id: str | None = None  # the Hub id, when it came from the Hub
    revision: str | None = None  # the revision asked for (None = main)
    commit: str | None = None  # the commit the cache snapshot holds
    random_weights: str | None = None  # a random: name (its canonical form): configs only, weights built at random

    def record(self) -> dict:
        """What ``config.json`` keeps of it (``model_source``)."""
        record = {"path": str(self.path), "repo_id": self.repo_id, "revision": self.revision, "commit": self.commit}
        return record | ({"random_weights": self.random_weights} if self.random_weights else {})

    def describe(self) -> str:
        if self.random_weights:
            return f"{self.random_weights} ({RANDOM_NOTE}; configs in {self.path})"
        if self.repo_id is None:
            return str(self.path)
        return f"{self.repo_id} @ {self.commit} (revision {self.revision or 'main'}; Hugging Face cache {self.path})"

    def adapter_base(self) -> tuple[str, str | None]:
        """``(base_model_name_or_path, revision)`` an adapter trained on this model records: the Hub id
        and its commit, else the absolute AR directory (so ``peft.AutoPeftModel`` finds it from anywhere)."""
        if self.repo_id is not None:
            return self.repo_id, self.commit
        if self.random_weights:  # nothing to load it from: the name says what it was
            return self.random_weights, None
        return str(self.path / AR_DIR), None


def names_a_local_path(name: str) -> bool:
    """Whether ``name`` is read as a local path: it exists, it is not spelled like a Hub id, or its first part is a
    directory here (``outputs/model`` mistyped is a missing directory, not a Hub repository to download)."""
    local = Path(name).expanduser()
    return local.exists() or not is_repo_id(name) or Path(name.split("/")[0]).is_dir()


def _download_hint(name: str, revision: str | None) -> str:
    cmd = f"hf download {name}" + (f" --revision {revision}" if revision else "")
    return f"`{cmd}` (`huggingface-cli download` with huggingface_hub < 1.0)"


def resolve_model(
    name: str,
    revision: str | None = None,
    *,
    flag: str = "model.path",
    revision_flag: str = "model.revision",
    local_files_only: bool = False,
    cache_dir: str | os.PathLike | None = None,
) -> ModelSource:
    """``name`` (a local directory or a Hub id) -> :class:`ModelSource`, or :class:`ModelSourceError`.

    A path that exists is used as is (a ``revision`` with it is an error). Otherwise a Hub id is looked up
    in the cache and, unless offline or ``local_files_only``, downloaded; anything else gets the "not a
    GLM-Image pipeline directory" error. ``flag`` / ``revision_flag`` name the inputs in error messages;
    ``cache_dir`` overrides the Hugging Face cache (default: HF_HUB_CACHE, else HF_HOME/hub).
    """
    name = str(name or "")
    if not name:
        raise ModelSourceError(f"{flag} is empty: give a GlmImagePipeline directory or a Hub id such as {EXAMPLE_ID}")
    if is_random(name):
        return _random(name, revision, flag, revision_flag)
    local = Path(name).expanduser()
    if names_a_local_path(name):
        if local.exists() and revision:
            raise ModelSourceError(
                f"{revision_flag}={revision} applies to Hugging Face Hub ids, but {flag} {name} is a local "
                f"directory: drop the revision, or give the Hub id"
            )
        spec = spec_of(check_pipeline_dir(local, flag))  # a random: model's configs, given by their directory
        return ModelSource(local.resolve(), random_weights=spec.name if spec else None)
    return _from_hub(name, revision, flag, revision_flag, local_files_only, cache_dir)


def random_spec(name: str, flag: str = "model.path") -> RandomSpec:
    """A ``random:`` name read (glm_grpo_ds/model/random_weights.py ``parse``), a bad one as :class:`ModelSourceError`
    (one line naming ``flag``), as every other model.path error."""
    try:
        return parse(name, flag)
    except ValueError as err:
        raise ModelSourceError(str(err)) from None


def _random(name, revision, flag, revision_flag) -> ModelSource:
    """A ``random:`` name: its configs directory, which the command wrote when it started."""
    spec = random_spec(name, flag)
    if revision:
        raise ModelSourceError(f"{revision_flag}={revision} applies to Hub ids, not to {flag}={name}: drop it")
    path = spec.directory()
    if spec_of(path) is None:
        raise ModelSourceError(
            f"{flag}={name}: its configs directory {path} is not written; a command writes it as it starts "
            "(glm_grpo_ds.testing.random_model.materialize), so call that first"
        )
    return ModelSource(path.resolve(), random_weights=spec.name)


def _from_hub(name, revision, flag, revision_flag, local_files_only, cache) -> ModelSource:
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    rev = revision or "main"
    offline = constants.is_offline_mode()
    cache = str(cache or constants.HF_HUB_CACHE)
    where = f"{flag} {name} (revision {rev})"
    try:
        folder = snapshot_download(
            name, revision=revision, cache_dir=cache, local_files_only=local_files_only or offline
        )
    except LocalEntryNotFoundError as err:  # not (completely) in the cache, and no download possible
        if local_files_only:
            why = "this rank reads the cache only"
        elif offline:
            why = "HF_HUB_OFFLINE=1 forbids downloading it"
        else:
            cause = err.__cause__ or err
            detail = str(cause).splitlines()[0] if str(cause) else ""
            why = f"the Hub did not provide it ({type(cause).__name__}{': ' + detail[:200] if detail else ''})"
        raise ModelSourceError(
            f"{where} is neither a local directory nor complete in the Hugging Face cache {cache}, and {why}; "
            f"download it once with {_download_hint(name, revision)}, or run with network access and HF_HUB_OFFLINE=0"
        ) from None
    except RevisionNotFoundError:
        raise ModelSourceError(
            f"{where}: the Hub repository has no revision {rev}; set {revision_flag} to a commit, branch or tag of it"
        ) from None
    except (RepositoryNotFoundError, GatedRepoError):
        raise ModelSourceError(
            f"{flag} {name} is not a local directory, and the Hub has no repository of that name that this "
            "machine may read (a gated or private one needs `hf auth login` or HF_TOKEN); check the path or the id"
        ) from None
    except HfHubHTTPError as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ModelSourceError(f"{where}: downloading from the Hub failed ({first}); try again") from None
    path = Path(folder).resolve()
    missing = [part for part in PIPELINE_PARTS if not (path / part).exists()]
    if missing:
        raise ModelSourceError(
            f"{where} is not a GLM-Image pipeline (its snapshot {path} lacks {', '.join(missing)}); "
            f"give a GlmImagePipeline repository such as {EXAMPLE_ID}"
        )
    commit = path.name if _SHA.fullmatch(path.name) else None
    return ModelSource(path, repo_id=name, revision=revision, commit=commit)


def cached_model_dir(name: str, revision: str | None = None) -> Path | None:
    """The local directory of ``name`` without any download: the path when it is a directory, the cache's
    snapshot for a cached Hub id, else None (the memory planner then uses built-in sizes)."""
    try:
        return resolve_model(name, revision, local_files_only=True).path
    except FileNotFoundError:  # ModelSourceError, or check_pipeline_dir's for a local path
        return None


def check_local_model(name: str, revision: str | None) -> None:
    """The part of :func:`resolve_for_training` that needs no other rank: a local path (or anything that
    is not a Hub id) is checked now; a Hub id waits for the process group (rank 0 may download it)."""
    if not name or names_a_local_path(str(name)):
        resolve_model(name, revision)


def resolve_for_training(name: str, revision: str | None, rank: int) -> ModelSource:
    """:func:`resolve_model` for every rank of a training job (collective for a Hub id).

    Rank 0 resolves first and may download; the other ranks wait (up to :data:`DOWNLOAD_WAIT_S`), then read
    the cache only. Every rank fails alike when one fails: rank 0 prints the reason, a rank whose own cache
    lacks the model also logs its line.
    """
    if names_a_local_path(str(name)):
        return resolve_model(name, revision)  # local (or bad) path: each rank checks its own filesystem
    from ..ds import dist
    from ..runtime import log

    with dist.patient_group(DOWNLOAD_WAIT_S) as any_rank:
        source, error = None, None
        if rank == 0:
            try:
                source = resolve_model(name, revision)
            except ModelSourceError as err:
                error = err
        if any_rank(error is not None):
            raise error or ModelSourceError(f"model.path {name}: rank 0 could not resolve it (its error comes first)")
        if rank != 0:
            try:
                source = resolve_model(name, revision, local_files_only=True)
            except ModelSourceError as err:
                error = err
                log.error(f"glm-grpo train: rank {rank}: {err}")
        if any_rank(error is not None):  # the failing rank raises its own line (its log has it), the others this
            raise error or ModelSourceError(
                f"model.path {name} (revision {revision or 'main'}): rank 0 has it, but another rank finds no "
                f"complete copy in its Hugging Face cache (each rank's line is in its log): the ranks do not share "
                f"one cache; point HF_HOME (or HF_HUB_CACHE) at shared storage, or run "
                f"{_download_hint(name, revision)} on every node first"
            )
    return source
