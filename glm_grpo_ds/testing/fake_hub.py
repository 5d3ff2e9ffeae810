"""A local stand-in for the Hugging Face Hub endpoints an upload uses, so the push code is tested
offline through huggingface_hub's real ``HfApi`` and HTTP client (tests/unit/test_hub.py,
tests/integration/test_sharing.py).

Served endpoints: ``POST /api/repos/create``, ``GET /api/models/{repo}[/revision/{rev}]``,
``POST /api/models/{repo}/branch/{branch}``, ``POST /api/validate-yaml`` (parses the README's YAML
like the Hub: a ``base_model`` that is not ``namespace/name`` is refused), ``POST
/api/models/{repo}/preupload/{rev}`` (every file "regular": its bytes travel base64-encoded in the
commit) and ``POST /api/models/{repo}/commit/{rev}`` (NDJSON). Requests without an
``Authorization: Bearer`` header get 401, as on the Hub.

    with FakeHub() as hub:                       # http://127.0.0.1:PORT, served by a thread
        HfApi(endpoint=hub.url, token="hf_x").upload_folder(repo_id="me/run", folder_path=...)
        hub.files("me/run")                      # {path: bytes} of the main branch
        hub.repos["me/run"]["private"], hub.commits, hub.tokens
    FakeHub(fail_commits=True)                   # commits answer HTTP 403 (not retried): a failing upload
    FakeHub(fail_commits=lambda paths: ...)      # only commits of these paths fail (settable while serving)
    FakeHub(slow_commits=lambda paths: 30.0)     # commits of these paths take that many seconds (a slow upload)

A subprocess reaches it with ``HF_ENDPOINT=hub.url``.
"""

from __future__ import annotations

import base64
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable
from urllib.parse import unquote

import yaml


class FakeHub:
    def __init__(
        self,
        fail_commits: bool | Callable[[list[str]], bool] = False,
        existing: dict | None = None,
        slow_commits: Callable[[list[str]], float] | None = None,
    ):
        """``existing``: repos that already exist, {repo_id: private}."""
        self.fail_commits = fail_commits
        self.slow_commits = slow_commits
        self.repos: dict[str, dict] = {r: {"private": p, "branches": {"main": {}}} for r, p in (existing or {}).items()}
        self.commits: list[dict] = []  # {repo, revision, message, paths}
        self.tokens: set[str] = set()
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.thread.is_alive():
            self.server.shutdown()
            self.server.server_close()

    def files(self, repo_id: str, revision: str = "main") -> dict[str, bytes]:
        return dict(self.repos[repo_id]["branches"][revision])


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    """The request handler class of ``hub``'s server (one class per hub: the server makes a handler per request)."""
    return type("Handler", (_HubHandler,), {"hub": hub})


class _HubHandler(BaseHTTPRequestHandler):
    """The Hub's endpoints over the state of :attr:`hub` (its repos, commits and tokens)."""

    hub: FakeHub

    def log_message(self, *args) -> None:  # quiet test output
        pass

    def _reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        if "error" in body:  # where huggingface_hub reads the Hub's error message from
            self.send_header("X-Error-Message", body["error"])
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorised(self) -> bool:
        auth = self.headers.get("Authorization", "")
        if not auth.startswith("Bearer "):
            self._reply(401, {"error": "Invalid credentials in Authorization header"})
            return False
        self.hub.tokens.add(auth[len("Bearer ") :])
        return True

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length", 0)))

    def do_GET(self) -> None:
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/?]+))?(?:\?.*)?", self.path)
        if not m or not self._authorised():
            return self._reply(404, {"error": "not found"}) if not m else None
        repo = self.hub.repos.get(m.group(1))
        if repo is None:
            return self._reply(404, {"error": "Repository not found"})
        self._reply(200, {"id": m.group(1), "private": repo["private"], "sha": "0" * 40, "siblings": []})

    def do_POST(self) -> None:
        body = self._body()
        if not self._authorised():
            return
        path = self.path.split("?")[0]
        with self.hub.lock:
            if path == "/api/repos/create":
                return self._create(json.loads(body))
            if path == "/api/validate-yaml":
                return self._validate_yaml(json.loads(body))
            m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/(branch|preupload|commit)/(.+)", path)
            if not m:
                return self._reply(404, {"error": f"no such endpoint {path}"})
            return self._repo_action(m.group(1), m.group(2), unquote(m.group(3)), body)

    def _repo_action(self, repo_id: str, action: str, rev: str, body: bytes) -> None:
        """``POST /api/models/{repo}/{branch|preupload|commit}/{rev}``."""
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            return self._reply(404, {"error": "Repository not found"})
        if action == "branch":
            repo["branches"].setdefault(rev, dict(repo["branches"]["main"]))
            return self._reply(200, {})
        if rev not in repo["branches"]:
            return self._reply(404, {"error": f"Revision not found: {rev}"})
        if action == "preupload":
            files = json.loads(body)["files"]
            modes = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]
            return self._reply(200, {"files": modes})
        return self._commit(repo_id, repo, rev, body)

    def _create(self, payload: dict) -> None:
        hub, repo_id = self.hub, f"{payload['organization']}/{payload['name']}"
        if repo_id in hub.repos:
            return self._reply(409, {"error": "You already created this model repo", "url": f"{hub.url}/{repo_id}"})
        hub.repos[repo_id] = {"private": payload.get("visibility") == "private", "branches": {"main": {}}}
        self._reply(200, {"url": f"{hub.url}/{repo_id}"})

    def _validate_yaml(self, payload: dict) -> None:
        content = payload["content"]
        meta = yaml.safe_load(content.split("---")[1]) if content.startswith("---") else {}
        base = (meta or {}).get("base_model")
        if base is not None and not re.fullmatch(r"[\w.-]+/[\w.-]+", str(base)):
            return self._reply(400, {"error": f'"base_model" with value "{base}" is not valid.'})
        self._reply(200, {"warnings": []})

    def _commit(self, repo_id: str, repo: dict, rev: str, body: bytes) -> None:
        hub = self.hub
        items = [json.loads(line) for line in body.splitlines() if line.strip()]
        header = next(i["value"] for i in items if i["key"] == "header")
        files = {i["value"]["path"]: base64.b64decode(i["value"]["content"]) for i in items if i["key"] == "file"}
        paths = list(files)
        if hub.slow_commits is not None:
            time.sleep(hub.slow_commits(paths))
        fail = hub.fail_commits
        if fail is True or (callable(fail) and fail(paths)):
            return self._reply(403, {"error": "You don't have the rights to write to this repo"})
        repo["branches"][rev].update(files)
        hub.commits.append({"repo": repo_id, "revision": rev, "message": header["summary"], "paths": paths})
        self._reply(200, {"commitUrl": f"{hub.url}/{repo_id}/commit/{'1' * 40}", "commitOid": "1" * 40})
