"""The reward server's web application: any reward behind the HTTP protocol of rewards/remote/protocol.py.

FastAPI on uvicorn, the stack of OpenRLHF's reward server (``openrlhf.cli.serve_rm``) that users of
remote reward models know: pydantic validates requests (422 naming the bad field), ``/docs`` shows the
schema to people writing their own client or server, and asyncio makes the batcher (batcher.py) a queue and
one task. ``glm-grpo reward-server`` (commands/reward_server.py) builds and runs it::

    app = build_app(reward_fn, "pixel_mse", needs, max_batch=32, max_wait_s=0.005, device="cpu", token=None)

Concurrent requests are batched into reward calls of at most ``max_batch`` images of one size, each request
given its own values (batcher.py :class:`Batcher`). A reward that raises fails every request of that call with
HTTP 500 and the exception message; the server goes on. A call that runs out of the device's memory is scored again
in smaller calls; a request holding an image that does not fit alone gets a 500 naming the memory.

What one request may cost is bounded (:class:`ServingLimits`): its body, and its images and targets as decoded
8-bit RGB - counted from their headers before any is decoded, since a PNG of a few hundred KB can decode to GBs -
get HTTP 413 past ``max_request_mb``; the target files kept for the rewards (:class:`TargetFiles`) stay under
``target_cache_mb``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import socket
import tempfile
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from pydantic import BaseModel, Field

from ...runtime.oom import out_of_memory
from ..base import SampleNeed
from .batcher import Batcher
from .protocol import PROTOCOL, decode_image, image_size, rewards_to_json
from .target_files import TargetFiles


@dataclass(frozen=True)
class ServingLimits:
    """What one request may cost the server (``glm-grpo reward-server --max-request-mb / --target-cache-mb``)."""

    max_request_mb: int = 1024  # a request's body, and its images and targets decoded as 8-bit RGB: HTTP 413 past it
    target_cache_mb: int = 4096  # target files kept for the rewards; past it the least recently used idle ones go


class RequestTooLarge(ValueError):
    """A request past :attr:`ServingLimits.max_request_mb` (HTTP 413)."""


class ScoreRequest(BaseModel):
    images: list[str] = Field(description="base64 8-bit RGB PNGs, all of one size")
    prompts: list[str] = Field(description="one prompt per image")
    samples: list[dict[str, Any]] | None = Field(None, description="one dataset row per image")
    target_images: dict[str, str] = Field({}, description="key -> base64 file bytes of a target image")


class ScoreResponse(BaseModel):
    rewards: list[float | None] = Field(description="one value per image; null = undefined")


# Answered without the token, as inference servers with an API key do: load-balancer and cluster probes
# (GET /health) and the API's own description (/docs shows how to send the token); scoring stays protected.
OPEN_PATHS = ("/health", "/docs", "/docs/oauth2-redirect", "/openapi.json", "/redoc")
TOKEN_HELP = (
    "With --token-file, POST /score needs the header `Authorization: Bearer <token>` (the file's content). "
    'Here: Authorize, paste the token alone. curl: -H "Authorization: Bearer $(cat TOKEN_FILE)". '
    "The trainer's remote reward: args.token_file."
)


class BearerAuth:
    """ASGI middleware: every HTTP request without ``Authorization: Bearer <token>`` gets 401, except GETs
    of :data:`OPEN_PATHS`. Constant-time comparison; the token is never logged."""

    def __init__(self, app, token: str):
        self.app, self.expected = app, f"Bearer {token}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and not (scope["method"] == "GET" and scope["path"] in OPEN_PATHS):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                from starlette.responses import JSONResponse

                detail = "wrong bearer token" if given else "missing Authorization: Bearer <token> header"
                response = JSONResponse({"detail": detail}, 401, headers={"WWW-Authenticate": "Bearer"})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def health_body(label: str, need: SampleNeed | None, max_batch: int, token_required: bool = False) -> dict:
    from importlib.metadata import version

    needs = None if need is None else {"field": need.field, "fix": need.fix}
    return {
        "protocol": PROTOCOL,
        "reward": label,
        "version": version("glm-grpo-ds"),
        "needs": needs,
        "max_batch": max_batch,
        "token_required": token_required,  # the client then tests its token on an empty /score at startup
    }


def _bytes(data: str, where: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as err:
        raise ValueError(f"{where} is not base64 ({err})") from None


def _size(raw: bytes, where: str) -> tuple[int, int]:
    try:
        return image_size(raw)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None


def _samples(body, targets: dict[str, bytes], files: TargetFiles) -> list[dict]:
    """The request's samples with ``target_image`` keys replaced by files (:class:`TargetFiles`; a target no sample
    names is not kept); raises ValueError."""
    samples = body.samples if body.samples is not None else [{} for _ in body.prompts]
    paths, out = {}, []
    for i, sample in enumerate(samples):
        sample = dict(sample)
        key = sample.get("target_image")
        if key is not None:
            if not isinstance(key, str) or key not in targets:
                raise ValueError(f"samples[{i}].target_image {key!r} is not a key of target_images")
            if key not in paths:
                paths[key] = files.put(targets[key])
            sample["target_image"] = paths[key]
        out.append(sample)
    return out


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port); ``port`` 0 picks a free one. ValueError on failure."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restarted server gets its port back
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as err:
        raise ValueError(
            f"cannot listen on {host}:{port} ({err.strerror or err}); pick another --port / --host"
        ) from None
    return sock


def decode_request(
    body: ScoreRequest, files: TargetFiles, max_bytes: int | None = None
) -> tuple[torch.Tensor, list[dict]]:
    """A /score request's images ``[N, 3, H, W]`` uint8 (all of one size) and its samples (their target images kept
    in ``files``); ValueError naming what is wrong (the server answers 422), :class:`RequestTooLarge` when its images
    and targets decoded as 8-bit RGB would pass ``max_bytes`` (413; read from their headers, before decoding)."""
    n = len(body.images)
    if len(body.prompts) != n or (body.samples is not None and len(body.samples) != n):
        sizes = f"{n} images, {len(body.prompts)} prompts, {len(body.samples or [])} samples"
        raise ValueError(f"images, prompts and samples must have one entry per image (got {sizes})")
    raw = [_bytes(data, f"images[{i}]") for i, data in enumerate(body.images)]
    sizes = [_size(r, f"images[{i}]") for i, r in enumerate(raw)]
    for i, size in enumerate(sizes):
        if size != sizes[0]:
            raise ValueError(f"images[{i}] is {size[::-1]}, images[0] {sizes[0][::-1]}")
    targets = {key: _bytes(data, f"target_images[{key!r}]") for key, data in body.target_images.items()}
    target_sizes = [_size(r, f"target_images[{key!r}]") for key, r in targets.items()]
    decoded = 3 * sum(w * h for w, h in sizes + target_sizes)
    if max_bytes is not None and decoded > max_bytes:
        raise RequestTooLarge(
            f"the request's {n} images and {len(targets)} targets are {decoded / 2**20:.0f} MiB decoded, over this "
            f"server's --max-request-mb {max_bytes / 2**20:.0f}: send fewer images a request, or raise it"
        )
    samples = _samples(body, targets, files)
    images = [decode_image(r) for r in raw]
    return (torch.stack(images) if images else torch.empty(0, 3, 1, 1, dtype=torch.uint8)), samples


# How often a request waiting for its scores checks that its client is still there.
DISCONNECT_POLL_S = 0.1


async def _unless_gone(scoring, request):
    """``await scoring``, or None once the client has disconnected (a client's timeout): the scoring is cancelled,
    so its jobs still queued are dropped (Batcher.run). A client that retries after a timeout would otherwise queue
    the same batch once per attempt, multiplying the work of a server that was already too slow."""
    task = asyncio.ensure_future(scoring)
    while True:
        done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
        if done:
            return task.result()
        if await request.is_disconnected():
            task.cancel()
            return None


def build_app(
    fn: Callable,
    label: str,
    need: SampleNeed | None,
    max_batch: int,
    max_wait_s: float,
    device,
    token,
    limits: ServingLimits = ServingLimits(),
):
    """The FastAPI application serving reward ``fn`` (named ``label``) on ``device``."""
    from fastapi import FastAPI, HTTPException, Request, Response
    from starlette.concurrency import run_in_threadpool
    from starlette.middleware.body_limit import RequestBodyLimitMiddleware

    max_bytes = limits.max_request_mb * 2**20

    @asynccontextmanager
    async def lifespan(app):
        app.state.batcher = Batcher(fn, label, max_batch, max_wait_s, torch.device(device))
        task = asyncio.create_task(app.state.batcher.run())
        with tempfile.TemporaryDirectory(prefix="glm_grpo_targets_") as target_dir:
            app.state.targets = TargetFiles(Path(target_dir), limits.target_cache_mb * 2**20)
            try:
                yield
            finally:
                task.cancel()
                app.state.batcher.close()

    app = FastAPI(title=f"glm-grpo reward server ({label})", lifespan=lifespan, description=TOKEN_HELP if token else "")
    app.add_middleware(RequestBodyLimitMiddleware, max_body_size=max_bytes)  # 413 before the body is read
    auth = []
    if token:
        from fastapi import Depends
        from fastapi.security import HTTPBearer

        app.add_middleware(BearerAuth, token=token)
        # checked by BearerAuth; declared here so /docs shows the lock and an Authorize button
        auth = [Depends(HTTPBearer(auto_error=False, description=TOKEN_HELP))]

    @app.get("/health")
    def health() -> dict:  # the batcher's max_batch: lowered by a call that ran out of memory
        return health_body(label, need, app.state.batcher.max_batch, token_required=bool(token))

    async def score(body: ScoreRequest, request):
        try:
            images, samples = await run_in_threadpool(decode_request, body, app.state.targets, max_bytes)
        except RequestTooLarge as err:
            raise HTTPException(413, str(err)) from None
        except ValueError as err:
            raise HTTPException(422, str(err)) from None
        if images.shape[0] == 0:
            return {"rewards": []}
        try:
            values = await _unless_gone(app.state.batcher.score(images, body.prompts, samples), request)
            if values is None:  # the client timed out and hung up: its queued images are not scored
                return Response(status_code=499)
        except Exception as err:  # noqa: BLE001 - the reward's own failure goes back to the client
            msg = " ".join(str(err).split()) or type(err).__name__
            if out_of_memory(err) is not None:  # one image alone does not fit (batcher.py)
                raise HTTPException(
                    500,
                    f"reward {label} ran out of the server's device memory on one image ({msg}): serve it on a "
                    "device with more free memory",
                ) from None
            raise HTTPException(500, f"reward {label} raised {type(err).__name__}: {msg}") from None
        return {"rewards": rewards_to_json(values)}

    # this module's annotations are strings, resolved in its globals, where the optional fastapi is not imported
    score.__annotations__["request"] = Request
    app.post("/score", response_model=ScoreResponse, dependencies=auth)(score)
    return app
