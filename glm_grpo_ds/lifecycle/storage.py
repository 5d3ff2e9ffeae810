"""One ``output_dir`` for every rank: checked at startup, before any model loads (:func:`open_output_dir`).

Every rank writes into ``output_dir`` (its checkpoint shards and RNG state, its log) and reads it back on
resume, so it must be the same storage on every node: NFS, Lustre, GPFS and the like. A node-local disk
(``/tmp``, local scratch, or a relative ``output_dir`` launched from different directories) is not
supported: the first checkpoint would fail on the nodes that cannot see rank 0's directories, and a
requeued job would resume on some nodes and start fresh on others. It is refused at startup instead, with
one line that names the ranks and hosts concerned, on every rank (exit 2), never a hang:

1. every rank checks ``output_dir`` (:func:`checkpoint.check_output_dir`) and reads ``checkpoints/latest``
   and what ``resume_from`` resolves to on its own disk; one ``all_gather_object`` shares the reports and
   every rank takes the same decision from them (:func:`agree`): a failed check, ranks that see different
   ``latest`` pointers, or a resume checkpoint some rank cannot read stop the run; otherwise every rank
   resumes from what rank 0 resolved (or starts fresh, all alike);
2. rank 0 writes a file with a random name and content into ``output_dir``, every rank checks it reads
   it (:func:`check_shared`); rank 0 removes it afterwards.

A local check that fails is reported, not raised, until every rank has joined the collective: a rank
raising alone would leave the others waiting in it. Step 1 comes first so that a ``latest`` present on
one node only is reported as such. At world size 1 there is nothing to share and step 2 is skipped.
"""

from __future__ import annotations

import secrets
import socket
import time
from pathlib import Path

from ..config import ConfigError
from ..data.rows import DataError
from ..ds import dist
from . import checkpoint
from .checkpoint import CheckpointError, OutputDirError

SHARED_FIX = (
    "output_dir must be on storage every node mounts (NFS, Lustre, GPFS, ...; on SLURM the submit directory "
    "usually is), not a node-local disk such as /tmp; a relative output_dir is taken from each node's "
    "working directory"
)
PROBE_PREFIX = ".shared_check_"
# How long a rank looks for rank 0's probe file before saying it does not see it. Shared filesystems
# show a file closed on one client to the next open on another (NFS close-to-open), and the name is new
# (no cached "no such file"); the wait only covers slow metadata servers, and only the failing case pays it.
PROBE_WAIT_S = 5.0


def describe_ranks(ranks: list[int], hosts: list[str]) -> str:
    """``rank 1 on node-b``, ``ranks 8-15 on node-b``, ``ranks 1, 3 on node-a and 9-15 on node-b``."""
    by_host: dict[str, list[int]] = {}
    for r in ranks:
        by_host.setdefault(hosts[r], []).append(r)
    parts = [f"{_spans(rs)} on {host}" for host, rs in by_host.items()]
    return ("rank " if len(ranks) == 1 else "ranks ") + " and ".join(parts)


def _spans(ranks: list[int]) -> str:
    spans: list[list[int]] = []
    for r in sorted(ranks):
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def latest_view(output_dir: Path) -> str | None:
    """The checkpoint name ``output_dir/checkpoints/latest`` holds as this rank sees it (None: no file)."""
    pointer = output_dir / checkpoint.CHECKPOINTS / checkpoint.LATEST
    try:
        return pointer.read_text(encoding="utf-8").strip() if pointer.is_file() else None
    except (OSError, UnicodeError) as err:
        return f"an unreadable file ({err})"


def local_report(output_dir, resume_from: str | None, rank: int) -> dict:
    """What this rank sees: its host, the output_dir check's error, ``latest``, and the resume checkpoint
    (a path or an error). Never raises for what it reports, so every rank reaches the collective."""
    report = {"host": socket.gethostname(), "error": None, "latest": None, "resume": None, "resume_error": None}
    try:
        out = checkpoint.check_output_dir(output_dir, rank)
    except OutputDirError as err:
        report["error"] = str(err)
        return report
    report["latest"] = latest_view(out)
    try:
        path = checkpoint.resume_path(out, resume_from)
    except (CheckpointError, OSError, UnicodeError) as err:
        report["resume_error"] = str(err)
    else:
        report["resume"] = None if path is None else str(path)
    return report


def agree(reports: list[dict], output_dir: Path) -> Path | None:
    """The checkpoint every rank resumes from (None: all start fresh), decided alike on every rank from all
    ranks' :func:`local_report` (rank order); raises OutputDirError / CheckpointError (one line) otherwise."""
    hosts = [r["host"] for r in reports]
    failed = [i for i, r in enumerate(reports) if r["error"]]
    if failed:
        first = reports[failed[0]]["error"]
        if len(failed) == len(reports) and all(reports[i]["error"] == first for i in failed):
            raise OutputDirError(first)  # the same on every rank: nothing to add
        raise OutputDirError(f"{describe_ranks(failed, hosts)}: {first}")
    views = [r["latest"] for r in reports]
    if len(set(views)) > 1:
        seen = []
        for view in dict.fromkeys(views):  # rank 0's view first
            ranks = [i for i, v in enumerate(views) if v == view]
            verb = "sees" if len(ranks) == 1 else "see"
            seen.append(f"{describe_ranks(ranks, hosts)} {verb} {view or 'nothing'}")
        pointer = output_dir / checkpoint.CHECKPOINTS / checkpoint.LATEST
        raise OutputDirError(f"ranks disagree on {pointer}: {', '.join(seen)}; {SHARED_FIX}")
    main = reports[0]
    if main["resume_error"]:
        raise CheckpointError(main["resume_error"])
    if main["resume"] is None:
        return None
    blind = [i for i, r in enumerate(reports) if r["resume"] != main["resume"]]
    if blind:
        why = reports[blind[0]]["resume_error"] or f"it resolves to {reports[blind[0]]['resume']}"
        raise CheckpointError(
            f"{describe_ranks(blind, hosts)} cannot read checkpoint {main['resume']} that rank 0 resumes from "
            f"({why}); a checkpoint must be on storage every node mounts (NFS, Lustre, GPFS, ...)"
        )
    return Path(main["resume"])


def _sees(probe: Path, token: str) -> bool:
    deadline = time.monotonic() + PROBE_WAIT_S
    while True:
        try:
            if probe.read_text(encoding="utf-8") == token:
                return True
        except OSError:
            pass  # not there (yet)
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


def check_shared(out: Path, rank: int) -> None:
    """Refuse an ``output_dir`` that is not the same storage on every rank (collective; skipped at world
    size 1): rank 0 writes a random token, every rank must read it back."""
    if dist.world_size() == 1:
        return
    token = error = None
    if rank == 0:
        token = secrets.token_hex(8)
        try:
            (out / (PROBE_PREFIX + token)).write_text(token, encoding="utf-8")
        except OSError as err:
            error = err.strerror or str(err)
    token, error = dist.broadcast_object((token, error))
    probe = out / (PROBE_PREFIX + token)
    try:
        if error:
            raise OutputDirError(
                f"output_dir {out} is not writable on rank 0 ({error}); pick another output_dir= or fix its permissions"
            )
        seen = dist.all_gather_object((socket.gethostname(), _sees(probe, token)))
    finally:
        if rank == 0:
            probe.unlink(missing_ok=True)
    blind = [i for i, (_, ok) in enumerate(seen) if not ok]
    if blind:
        hosts = [host for host, _ in seen]
        raise OutputDirError(
            f"output_dir {out} is not the same storage on every node: {describe_ranks(blind, hosts)} cannot see "
            f"a file that rank 0 on {hosts[0]} wrote there; {SHARED_FIX}"
        )


def open_output_dir(output_dir, resume_from: str | None, rank: int) -> tuple[Path, Path | None]:
    """Check ``output_dir`` on every rank and agree on what to resume (collective, before any model loads):
    returns ``(output_dir, checkpoint to resume from or None)``, the same on every rank."""
    out = Path(output_dir)
    reports = dist.all_gather_object(local_report(out, resume_from, rank))
    resume = agree(reports, out)
    check_shared(out, rank)
    return out, resume


def data_disagreement(prints: list[dict], hosts: list[str], key: str) -> str | None:
    """The line refusing ranks that read different prompt sets (``prints[r]``: rank r's data fingerprint,
    lifecycle/resume.py), None when every rank read rank 0's: each rank computes every rank's prompts from its own
    copy (data/prompt_order.py), so copies that differ repeat and skip prompts without a word."""
    odd = [r for r, p in enumerate(prints) if (p["rows"], p["sha256"]) != (prints[0]["rows"], prints[0]["sha256"])]
    if not odd:
        return None
    first = prints[odd[0]]
    return (
        f"{key} {prints[0]['source']} is not the same prompt set on every rank: {describe_ranks(odd, hosts)} read "
        f"{first['rows']} prompts (sha256 {first['sha256'][:12]}), rank 0 on {hosts[0]} {prints[0]['rows']} "
        f"(sha256 {prints[0]['sha256'][:12]}); put it on storage every node reads alike, or the same copy on each"
    )


def check_same_data(fingerprint: dict, key: str) -> None:
    """Refuse, on every rank alike, prompt sets that differ between ranks (collective; :func:`data_disagreement`)."""
    seen = dist.all_gather_object((socket.gethostname(), fingerprint))
    refused = data_disagreement([p for _, p in seen], [h for h, _ in seen], key)
    if refused:
        raise DataError(refused)


class OtherRankFailed(ConfigError):
    """The inputs of another rank failed its checks (this rank's passed): the run stops on every rank alike."""


def agree_on_inputs(error: BaseException | None) -> None:
    """Collective, right after the process group starts: every rank learns whether any rank's input checks failed,
    so a node that failed alone (its copy of a path, its driver) stops the job on every node at once instead of
    leaving the others waiting for it at the rendezvous until ``dist_timeout_minutes``. A rank that failed raises
    its own error; the others raise :class:`OtherRankFailed` naming the first that did, with its line."""
    seen = dist.all_gather_object((socket.gethostname(), None if error is None else str(error)))
    if error is not None:
        raise error
    failed = [r for r, (_, line) in enumerate(seen) if line is not None]
    if failed:
        hosts = [host for host, _ in seen]
        first = seen[failed[0]][1].replace("\n", " ")
        raise OtherRankFailed(f"{describe_ranks(failed, hosts)} failed the input checks: {first}")
