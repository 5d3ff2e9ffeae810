"""``glm-grpo reward-server``: serve a reward over HTTP, for the ``remote`` reward of training runs.

    CUDA_VISIBLE_DEVICES=7 glm-grpo reward-server --reward clip --reward-arg model=/models/clip-vit-large-patch14 \
        --port 8123
    glm-grpo reward-server --reward python:my_pkg.rewards:judge --host 0.0.0.0 --port 8123 \
        --token-file ~/.glm_grpo_token --max-batch 16

Serves any built-in or plugin reward (the names of ``rewards: [{name: ...}]``) with the protocol of
glm_grpo_ds/rewards/remote/protocol.py (docs/rewards.md#remote-rewards): ``GET /health``, ``POST /score``.
Concurrent requests (every training rank sends its own batch) are batched into reward calls of up to
``--max-batch`` images (glm_grpo_ds/rewards/remote/serving.py). Bound to 127.0.0.1 unless ``--host`` says
otherwise; with ``--token-file`` every request must carry ``Authorization: Bearer <token>`` (401
otherwise). The first line on stdout says where it serves (``glm-grpo reward-server: serving NAME on
http://HOST:PORT (...)``); Ctrl-C / SIGTERM stop it. Exit status 2: a bad reward, argument, token file or port;
8: the reward's model does not fit the device's free memory (one line each).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from .cli import parser_for

LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass
class ServerConfig:
    """``glm-grpo reward-server`` defaults."""

    host: str = "127.0.0.1"  # loopback only; 0.0.0.0 (or an interface address) to serve other nodes
    port: int = 8000
    max_batch: int = 32  # images per reward call (concurrent requests are merged up to this)
    max_wait_ms: float = 5.0  # how long a call waits for concurrent requests to join it
    device: str = "auto"  # where the images go: cuda when available, else cpu
    log_level: str = "info"  # uvicorn's: info logs one line per request


def parse_args(argv: list[str] | None):
    from ..rewards.remote.serving import ServingLimits

    d, limits = ServerConfig(), ServingLimits()
    p = parser_for("reward-server")
    p.add_argument("--reward", required=True, help="built-in name or python:module:function / file.py:function")
    p.add_argument("--reward-arg", action="append", default=[], help="key=value argument of the reward (repeatable)")
    p.add_argument("--host", default=d.host, help=f"address to listen on (default {d.host}: this machine only)")
    p.add_argument("--port", type=int, default=d.port, help=f"default {d.port}; 0 = any free port")
    p.add_argument("--token-file", help="file holding a secret; requests must send `Authorization: Bearer <it>`")
    p.add_argument(
        "--max-batch",
        type=int,
        default=d.max_batch,
        help=f"images per reward call (default {d.max_batch}); a call that runs out of the device's memory is scored "
        "again in halves, and later calls stay at the largest size then scored",
    )
    p.add_argument(
        "--max-wait-ms",
        type=float,
        default=d.max_wait_ms,
        help=f"wait for concurrent requests to join a call (default {d.max_wait_ms})",
    )
    p.add_argument(
        "--max-request-mb",
        type=int,
        default=limits.max_request_mb,
        help=f"a request's body, and its images and targets decoded as 8-bit RGB, at most (default "
        f"{limits.max_request_mb}); larger ones get HTTP 413",
    )
    p.add_argument(
        "--target-cache-mb",
        type=int,
        default=limits.target_cache_mb,
        help=f"target image files kept for the rewards (default {limits.target_cache_mb}); past it the least "
        "recently used, idle 10 minutes, are removed",
    )
    p.add_argument("--device", default=d.device, help="cpu, cuda, cuda:1, ... (default: cuda when available)")
    p.add_argument(
        "--log-level", default=d.log_level, choices=("debug", "info", "warning", "error"), help="uvicorn's log level"
    )
    return p.parse_args(argv)


def _another_device(phase: str | None) -> str:
    """The reward-server's change for a reward model that does not fit: no flag makes a model smaller."""
    return (
        "serve it on a device with more free memory (--device cuda:N, or CUDA_VISIBLE_DEVICES; nvidia-smi shows what "
        "holds this one)"
    )


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    from ..memory.oom import EXIT_OOM, command_line
    from ..runtime.oom import marking, out_of_memory

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import fastapi  # noqa: F401
        import uvicorn
    except ImportError as err:
        print(f"glm-grpo reward-server: {err.name} is missing: pip install 'glm-grpo-ds[server]'", file=sys.stderr)
        return 2
    try:
        if a.max_batch < 1:
            raise ValueError(f"--max-batch {a.max_batch} must be at least 1")
        if a.max_wait_ms < 0:
            raise ValueError(f"--max-wait-ms {a.max_wait_ms} must be >= 0")
        for flag, value in (("--max-request-mb", a.max_request_mb), ("--target-cache-mb", a.target_cache_mb)):
            if value < 1:
                raise ValueError(f"{flag} {value} must be at least 1")
        import torch

        from ..rewards.remote.protocol import read_token

        token = read_token(a.token_file, "--token-file") if a.token_file else None

        from ..rewards import RewardError, build_reward, reward_needs
        from ..rewards.remote.serving import ServingLimits, bind, build_app
        from .score import parse_reward_arg

        device = ("cuda" if torch.cuda.is_available() else "cpu") if a.device == "auto" else a.device
        torch.device(device)  # a bad --device fails here, not at the first request
        args = dict(parse_reward_arg(x) for x in a.reward_arg)
        try:
            with marking(part=f"loading reward {a.reward} on {device}"):
                need = reward_needs(a.reward, args)
                fn = build_reward(a.reward, args)
        except RewardError as err:
            raise ValueError(str(err)) from None
        sock = bind(a.host, a.port)
    except (ValueError, RuntimeError, FileNotFoundError) as err:
        starved = out_of_memory(err)
        if starved is not None:
            print(command_line("reward-server", starved, _another_device, "nothing is served"), file=sys.stderr)
            return EXIT_OOM
        print(f"glm-grpo reward-server: {err}", file=sys.stderr)
        return 2
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(
        f"glm-grpo reward-server: serving {a.reward} on http://{shown}:{port} (device {device}, max batch "
        f"{a.max_batch}, {'bearer token required' if token else 'no token'}); GET /health, POST /score",
        flush=True,
    )
    if a.host not in LOOPBACK and not token:
        print(
            f"glm-grpo reward-server: warning: listening on {a.host} without --token-file: anyone who reaches this "
            "port can use the reward (and its GPU)",
            file=sys.stderr,
            flush=True,
        )
    limits = ServingLimits(max_request_mb=a.max_request_mb, target_cache_mb=a.target_cache_mb)
    app = build_app(fn, a.reward, need, a.max_batch, a.max_wait_ms / 1000, device, token, limits)
    server = uvicorn.Server(uvicorn.Config(app, log_level=a.log_level, timeout_graceful_shutdown=5))
    server.run(sockets=[sock])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
