"""``remote``: a reward computed by a reward server (``glm-grpo reward-server`` or any server speaking
the protocol of rewards/remote/protocol.py), for reward models that do not fit beside the policy.

    rewards:
      - {name: remote, weight: 1.0, args: {url: "http://10.0.0.7:8123", timeout_s: 30, retries: 3,
                                           token_file: ~/.glm_grpo_token}}

Every rank sends its own batch (8-bit PNGs: the server scores ``round(image * 255) / 255``). A request
that times out (``timeout_s`` per attempt), cannot connect, breaks off or gets 502 / 503 / 504 is
retried ``retries`` times with urllib3's exponential backoff (the first retry at once, then
``backoff_s`` x 2, x 4, ...; a Retry-After header is respected); after that the batch's rewards are
undefined through the failed-reward path of registry.RewardSet (warned once, counted in
``reward/remote_failed``) and training goes on. A reward that raised on the server (HTTP 500) is not
retried: it is that reward's failure.

At startup (registry.check_reward_specs, before any model loads) the server's ``/health`` must answer
(it needs no token) and an empty ``/score`` must be accepted with the token: the sample field its reward
needs comes from the health answer, so a prompt file lacking it
is refused like for a local reward. A server that is down, refuses the token or speaks another
protocol is a one-line input error.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ...runtime import log
from ..base import TARGET_IMAGE, TEXT_TO_RENDER, SampleNeed
from ..registry import RewardError
from .protocol import PROTOCOL, read_token, request_body, rewards_from_json

# fields whose "present" rule the trainer knows; any other field is present when non-empty
KNOWN_NEEDS = {need.field: need for need in (TARGET_IMAGE, TEXT_TO_RENDER)}


class RemoteRewardError(RuntimeError):
    """A batch the server did not score (after the retries); its samples are undefined."""


@dataclass
class RemoteSettings:
    """The ``args`` of the ``remote`` reward (their defaults live here)."""

    url: str = ""  # http://HOST:PORT of the reward server (required)
    timeout_s: float = 30.0  # per attempt: connecting, and waiting for the answer
    retries: int = 3  # attempts after the first one (connection errors, timeouts, 502/503/504)
    backoff_s: float = 0.5  # exponential backoff factor between attempts
    token_file: str | None = None  # file with the server's bearer token (glm-grpo reward-server --token-file)

    @classmethod
    def parse(cls, args: dict) -> RemoteSettings:
        try:
            s = cls(**args)
        except TypeError:
            valid = ", ".join(asdict(cls()))
            raise RewardError(f"args {sorted(args)}: expected some of {valid}") from None
        if not s.url or not str(s.url).startswith(("http://", "https://")):
            raise RewardError(f"args.url {s.url!r} must be the server's address, e.g. http://127.0.0.1:8000")
        s.url = str(s.url).rstrip("/")
        if not float(s.timeout_s) > 0 or int(s.retries) < 0 or float(s.backoff_s) < 0:
            raise RewardError(f"args timeout_s={s.timeout_s} must be > 0, retries={s.retries} and backoff_s >= 0")
        return s

    def token(self) -> str | None:
        if self.token_file is None:
            return None
        try:
            return read_token(str(self.token_file), "args.token_file")
        except ValueError as err:
            raise RewardError(str(err)) from None


def _session(s: RemoteSettings, token: str | None):
    """A requests session that retries with backoff (urllib3 Retry) and sends the token."""
    import requests
    from requests.adapters import HTTPAdapter
    from urllib3.util.retry import Retry

    retry = Retry(
        total=int(s.retries),
        backoff_factor=float(s.backoff_s),
        status_forcelist=(502, 503, 504),
        allowed_methods=None,  # POST /score too: scoring is idempotent
        raise_on_status=False,  # the last 5xx answer is reported with the server's message
    )
    session = requests.Session()
    session.mount("http://", HTTPAdapter(max_retries=retry))
    session.mount("https://", HTTPAdapter(max_retries=retry))
    if token:
        session.headers["Authorization"] = f"Bearer {token}"
    return session


def _reason(err: Exception) -> str:
    """The root cause of a requests error in a few words (not the whole urllib3 chain)."""
    cause = err.args[0] if err.args else err
    cause = getattr(cause, "reason", cause)  # MaxRetryError -> the last attempt's error
    text = " ".join(str(cause).split())
    if "Connection refused" in text:
        return "connection refused"
    if "timed out" in text.lower():
        return "timed out"
    return f"{type(cause).__name__}: {text[:200]}"


def _detail(response) -> str:
    try:
        return str(response.json().get("detail"))
    except ValueError:
        return " ".join(response.text.split())[:200]


EMPTY_BATCH = {"images": [], "prompts": [], "samples": []}


def _token_required(health_response) -> bool:
    try:
        return bool(health_response.json().get("token_required"))
    except (ValueError, AttributeError):
        return False  # not our server: the checks below say so


def fetch_health(s: RemoteSettings, token: str | None) -> dict:
    """The server's ``/health`` answer, checked; RewardError (one line) otherwise."""
    import requests

    where = f"the reward server at {s.url}"
    try:
        r = _session(s, token).get(f"{s.url}/health", timeout=float(s.timeout_s))
    except requests.RequestException as err:
        raise RewardError(
            f"{where} does not answer ({_reason(err)}, {s.retries} retries); start it (glm-grpo reward-server "
            "--reward NAME --port PORT) or fix args.url"
        ) from None
    checked = r
    if r.status_code == 200 and _token_required(r):
        # /health answers without the token (for cluster probes): an empty batch tests the token now,
        # so a missing or wrong one is an input error at startup, not a failed reward at step 1
        try:
            checked = _session(s, token).post(f"{s.url}/score", json=EMPTY_BATCH, timeout=float(s.timeout_s))
        except requests.RequestException as err:
            raise RewardError(f"{where} answered /health but not /score ({_reason(err)})") from None
    if checked.status_code == 401:
        fix = "args.token_file holds another token than the server's --token-file" if token else "set args.token_file"
        raise RewardError(f"{where} refused the request (401 {_detail(checked)}): {fix}")
    if checked.status_code != 200:
        what = "/health" if checked is r else "an empty /score"
        raise RewardError(f"{where} answered {what} with HTTP {checked.status_code} ({_detail(checked)})")
    try:
        health = r.json()
        reward, protocol = health["reward"], health["protocol"]
    except (ValueError, KeyError, TypeError):
        raise RewardError(f"{where} is not a glm-grpo reward server (its /health has no reward / protocol)") from None
    if protocol != PROTOCOL:
        raise RewardError(f"{where} speaks protocol {protocol}, this trainer {PROTOCOL}; update one of them")
    if not isinstance(reward, str):
        raise RewardError(f"{where} sent a /health whose reward is not a name")
    return health


def need_from_health(health: dict) -> SampleNeed | None:
    """The sample field the served reward needs (its ``needs``), as the trainer checks it."""
    need = health.get("needs")
    if not need:
        return None
    field = str(need["field"])
    if field in KNOWN_NEEDS:
        return KNOWN_NEEDS[field]
    fix = need.get("fix") or f'give the rows a "{field}" field (a .jsonl prompt file), or remove the reward'
    return SampleNeed(field, lambda prompt, sample: sample.get(field) not in (None, ""), fix)


class RemoteReward:
    """The ``remote`` reward (see the module docstring); ``needs`` is the served reward's."""

    def __init__(self, **args):
        self.settings = s = RemoteSettings.parse(args)
        token = s.token()
        self.health = fetch_health(s, token)
        self.needs = need_from_health(self.health)
        self.session = _session(s, token)
        self._files: dict[str, bytes] = {}  # target image path -> bytes (a run reads each file once)
        needs = f", needs {self.needs.field}" if self.needs else ""
        log.info(
            f"glm-grpo: reward remote: {s.url} serves {self.health['reward']} "
            f"(glm-grpo-ds {self.health.get('version', '?')}{needs})"
        )

    @classmethod
    def needs_for(cls, args: dict) -> SampleNeed | None:
        """Asks the server (registry.reward_needs calls this before anything is built)."""
        s = RemoteSettings.parse(dict(args))
        return need_from_health(fetch_health(s, s.token()))

    def _read(self, path) -> bytes:
        stored = getattr(path, "data", None)  # a target image stored in the dataset (data.rows.DatasetImage)
        if isinstance(stored, bytes):
            return stored
        if path not in self._files:
            if len(self._files) >= 1024:
                self._files.clear()
            self._files[path] = Path(path).read_bytes()
        return self._files[path]

    def __call__(self, images: torch.Tensor, prompts: list[str], samples: list[dict]) -> torch.Tensor:
        import requests

        s = self.settings
        body = request_body(images, prompts, samples, self._read)
        try:
            r = self.session.post(f"{s.url}/score", json=body, timeout=float(s.timeout_s))
        except requests.RequestException as err:
            raise RemoteRewardError(
                f"{s.url} did not score the batch ({_reason(err)}, after {s.retries} retries)"
            ) from None
        if r.status_code != 200:
            detail = _detail(r)
            if r.status_code == 413 and "--max-request-mb" not in detail:  # the body limit's own text
                detail += " (past the server's --max-request-mb: raise it, or send fewer images a request)"
            raise RemoteRewardError(f"{s.url}/score answered HTTP {r.status_code}: {detail}")
        try:
            values = rewards_from_json(r.json()["rewards"])
        except (ValueError, KeyError, TypeError) as err:
            raise RemoteRewardError(f"{s.url}/score sent no list of rewards ({type(err).__name__})") from None
        if values.shape[0] != len(prompts):
            raise RemoteRewardError(f"{s.url}/score sent {values.shape[0]} rewards for {len(prompts)} images")
        return values.to(images.device)
