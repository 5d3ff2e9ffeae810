"""Model cards and uploads to the Hugging Face Hub of a training run (``hub.*`` in the config), on
global rank 0 (docs/sharing.md).

* Startup (``Publisher.__init__``, before any model loads), with ``hub.repo_id`` set: rank 0 checks
  that a token exists (``HF_TOKEN`` or ``hf auth login``; never the config file), creates the repo
  (``HfApi.create_repo(private=hub.private, exist_ok=True)``), refuses an existing public repo while
  ``hub.private`` is true, and creates the branch ``hub.revision``. A problem is one line and exit
  status 2 on every rank (agreed by a collective), seconds after launch instead of after training.
* Each checkpoint (``Publisher.checkpoint``): a model card replaces peft's blank README.md in
  ``checkpoints/step_N/adapter/``; with ``hub.push_checkpoints`` that adapter is uploaded to
  ``checkpoints/step_N/`` in the repo on rank 0's worker thread (glm_grpo_ds/lifecycle/background.py) while
  training goes on: no rank waits for it in a collective. The next checkpoint's upload waits for it;
  the end of the run (:meth:`Publisher.finish`) and a preempted run (:meth:`Publisher.wait`) too.
* The end: the model card (and reward curve) of ``final_adapter/`` or ``final_model/``, with or
  without ``hub.repo_id`` (``Publisher.final``, in the trainer's ``save_final``); then, once the process
  group is gone (``Publisher.finish``, the last call of ``train.main``), that directory is uploaded to
  the root of the repo (``HfApi.upload_folder``): the other ranks have exited, none waits for it. With
  ``lora.ema_decay``, ``final_adapter_ema/`` has its card too and goes to ``ema/`` in the repo.

The local files are always written first. A failed upload is one warning line naming the repo and the
retry command (``glm-grpo push OUTPUT_DIR``, glm_grpo_ds/commands/push.py); training goes on, and at the
end the run says so in one line and exits with status 4 (:data:`EXIT_PUSH_FAILED`), so a job script can
tell "trained, saved, not uploaded" from success (0) and from a failed run.

``HF_HUB_OFFLINE=1``, which the trainer and the launch scripts set so that loading never downloads,
blocks every request of huggingface_hub, uploads included: the requests this module makes for the upload
you configured are let through (:func:`hub_requests`); nothing is ever downloaded. ``HF_ENDPOINT`` points
them at another Hub (the tests use a local stand-in, glm_grpo_ds/testing/fake_hub.py).
"""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path

from ..config import ConfigError
from ..ds import dist
from ..lifecycle.background import Background
from ..runtime import log
from .model_card import CHECKPOINT_PREFIX, EMA_SUBFOLDER, write_run_card

# Exit status of a run that trained and saved everything but could not upload it (2 = bad input).
EXIT_PUSH_FAILED = 4


class HubError(ConfigError):
    """The Hub repo of ``hub.repo_id`` cannot be used; the message says why and what to do."""


@contextlib.contextmanager
def hub_requests():
    """Let huggingface_hub's requests through while inside, even under ``HF_HUB_OFFLINE=1`` (read by
    its request hook at each request, from ``huggingface_hub.constants``)."""
    from huggingface_hub import constants

    before = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = False
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = before


def short_error(err: BaseException) -> str:
    """``Type: first line`` of an error: huggingface_hub's HTTP errors carry blank lines and the server's text."""
    lines = [line for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def prepare_repo(api, repo_id: str, private: bool, revision: str | None, training: bool = True) -> str:
    """Create ``repo_id`` if missing and the branch ``revision``; the repo's URL. Raises HubError. ``training``: the
    lines offer to train without uploading (``glm-grpo push`` has nothing to offer instead)."""
    from huggingface_hub import get_token

    fix = "or set hub.repo_id=null to train without uploading" if training else "then push again"
    if api.token is None and get_token() is None:
        raise HubError(
            f"hub.repo_id={repo_id} needs a Hugging Face token with write access: set HF_TOKEN or run "
            f"`hf auth login` (the token is never read from the config), {fix}"
        )
    try:
        with hub_requests():
            url = api.create_repo(repo_id, private=private, exist_ok=True)
            info = api.model_info(repo_id)
            if revision:
                api.create_branch(repo_id, branch=revision, exist_ok=True)
    except Exception as err:  # HTTP errors, refused names, and the HTTP client's connection errors alike
        raise HubError(
            f"hub.repo_id={repo_id}: cannot create or reach the repo on {api.endpoint} ({short_error(err)}); check the "
            f"token's write access to {repo_id.split('/')[0]} and the network (HF_ENDPOINT), {fix}"
        ) from None
    if private and info.private is False:
        raise HubError(
            f"hub.repo_id={repo_id} exists and is public but hub.private is true: make it private on the Hub, "
            "pick another repo, or set hub.private=false to publish there"
        )
    return str(url)


def upload(api, repo_id: str, folder: Path, path_in_repo: str | None, revision: str | None, message: str) -> str:
    """Upload ``folder`` as one commit; the commit URL. Raises whatever huggingface_hub raises."""
    with hub_requests():
        info = api.upload_folder(
            repo_id=repo_id,
            folder_path=str(folder),
            path_in_repo=path_in_repo,
            revision=revision,
            commit_message=message,
        )
    return str(info.commit_url)


UPLOAD_WAIT_MAX_S = 600.0  # a checkpoint upload's wait for the previous one, at most (lifecycle/background.py)


class Publisher:
    """The run's model cards and uploads (see the module docstring). Every rank constructs it and
    calls its methods; rank 0 does the work."""

    def __init__(self, cfg, out: Path, rank: int, background: Background | None = None):
        self.hub, self.out, self.is_main = cfg.hub, Path(out), rank == 0
        # how long a checkpoint's upload waits for the previous one, the other ranks waiting in a collective meanwhile
        self.upload_wait_s = min(UPLOAD_WAIT_MAX_S, cfg.dist_timeout_minutes * 60 / 4)
        self.background = background or Background()  # checkpoint uploads (and the trainer's pruning)
        self.failed: list[str] = []
        self.api, self.final_weights, self.final_ema = None, None, None
        if self.hub.repo_id is None:
            return
        problem = None
        if self.is_main:
            from huggingface_hub import HfApi

            self.api = HfApi()
            try:
                url = prepare_repo(self.api, self.hub.repo_id, self.hub.private, self.hub.revision)
                log.info(f"glm-grpo: the final weights will be uploaded to {url}" + self._at())
            except HubError as err:
                problem = err
        # every rank stops alike (none waits in a later collective); rank 0 holds the reason
        if dist.any_rank(float(problem is not None)):
            raise problem or HubError(f"hub.repo_id={self.hub.repo_id}: rank 0 could not prepare the repo")

    def _at(self) -> str:
        return f" (branch {self.hub.revision})" if self.hub.revision else ""

    def checkpoint(self, path: Path, step: int) -> Path:
        """After checkpoint ``step`` was saved at ``path``: its adapter's card, and its upload with
        ``hub.push_checkpoints``. Returns ``path``."""
        adapter = path / "adapter"
        if self.is_main and adapter.is_dir():
            self._card(adapter, step)
            if self.hub.repo_id and self.hub.push_checkpoints:
                where, message = f"{CHECKPOINT_PREFIX}/{path.name}", f"glm-grpo checkpoint at step {step}"
                busy = functools.partial(self._skipped, path)
                upload = functools.partial(self._push, adapter, where, message)
                self.background.submit("upload", upload, self.upload_wait_s, busy)
        return path

    def _skipped(self, path: Path) -> None:
        """Checkpoint ``path``'s upload skipped (the previous one still running): a warning now, and at the end the
        run's exit status 4 with the retry, as for an upload that failed: the job asked for it and it did not happen."""
        log.warning(
            f"glm-grpo: warning: an earlier checkpoint's upload to {self.hub.repo_id} is still running: "
            f"{path.name} is not uploaded now (`glm-grpo push {self.out} --checkpoints` uploads it later)"
        )
        self.failed.append(f"{path.name} (skipped)")

    def wait(self) -> None:
        """Until rank 0's pending checkpoint upload (and pruning) is done."""
        self.background.wait()

    def final(self, weights: Path, ema: Path | None = None) -> None:
        """After the final weights were saved in ``weights`` (and lora.ema_decay's average in ``ema``): their cards
        (uploaded by :meth:`finish`, the average to ema/)."""
        if self.is_main:
            self._card(weights)
            self.final_weights = weights
            if ema is not None:
                self._card(ema)
                self.final_ema = ema

    def _card(self, weights: Path, step: int | None = None) -> None:
        """Rank 0 writes ``weights``' model card; one it cannot write (a records file edited by hand, a full disk) is
        a warning: raised, it ended rank 0 alone and the others waited in the next collective for its timeout."""
        try:
            write_run_card(self.out, weights, step)
        except (OSError, ValueError, KeyError, TypeError) as err:
            log.warning(
                f"glm-grpo: warning: the model card of {weights} could not be written ({type(err).__name__}: {err}); "
                f"the weights are saved; `glm-grpo push {self.out}` writes it again"
            )

    def finish(self) -> int:
        """The run's exit status, after the process group is gone (a long upload keeps no rank waiting in
        a collective, whose timeout would kill the job mid-upload): rank 0 uploads the final weights;
        :data:`EXIT_PUSH_FAILED` if this or a checkpoint upload failed, else 0."""
        if not self.is_main:
            return 0
        try:
            self.wait()  # the last checkpoint's upload and pruning
            if self.hub.repo_id and self.final_weights is not None:
                self._push(self.final_weights, None, f"glm-grpo final {self.final_weights.name}")
            if self.hub.repo_id and self.final_ema is not None:  # after the root's: ema/ is its own folder
                self._push(self.final_ema, EMA_SUBFOLDER, f"glm-grpo final {self.final_ema.name}")
        except KeyboardInterrupt:  # outside the training's signal handling: one line, not a traceback
            log.fatal(self.interrupted_line())
            return 130
        if not self.failed:
            return 0
        log.fatal(
            f"glm-grpo train: training finished and everything is saved in {self.out}, but {len(self.failed)} "
            f"upload(s) to the Hub repo {self.hub.repo_id} failed ({', '.join(self.failed)}); retry with "
            f"`glm-grpo push {self.out}`"
        )
        return EXIT_PUSH_FAILED

    def interrupted_line(self) -> str:
        """What a Ctrl-C while rank 0 waits for its uploads (or its pruning) says: what is saved, how to upload it."""
        if not self.hub.repo_id:  # it was pruning old checkpoints (remove_stale finishes it next time)
            return f"glm-grpo train: interrupted by SIGINT while pruning; everything is saved in {self.out}"
        return (
            f"glm-grpo train: upload to {self.hub.repo_id} interrupted by SIGINT; everything is saved in "
            f"{self.out}; upload it with `glm-grpo push {self.out}`"
        )

    def _push(self, folder: Path, path_in_repo: str | None, message: str) -> None:
        where = f"{self.hub.repo_id}{'/' + path_in_repo if path_in_repo else ''}{self._at()}"
        try:
            url = upload(self.api, self.hub.repo_id, folder, path_in_repo, self.hub.revision, message)
        except Exception as err:  # whatever the cause (network, auth, server), the run and its files go on
            self.failed.append(path_in_repo or folder.name)
            log.warning(
                f"glm-grpo: warning: uploading {folder} to the Hub repo {where} failed ({short_error(err)}); the local "
                f"files are complete; retry with `glm-grpo push {self.out}`"
            )
            return
        log.info(f"glm-grpo: uploaded {folder} to {where}: {url}")
