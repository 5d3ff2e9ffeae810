"""`python ...` runs for the tests, forked from one parent that imported the heavy libraries once.

A training run or a CPU rank started as a new `python` spends ~8 s of the 2-core test machine importing torch,
torchvision, transformers, diffusers, peft, bitsandbytes and DeepSpeed before it does anything, and the suite
starts about a hundred of them. :func:`popen` hands such a command to a server (one per pytest worker, started on
first use) that imported those libraries once and forks: the child is its own process, with its own pid,
environment, working directory, stdin / stdout / stderr and exit status; it runs the module (``-m``) or script
as `python` would (``runpy``, as ``__main__``) and imports glm_grpo_ds itself. What it shares with a fresh
`python` is everything but the libraries' import-time state, so a command starts as a fresh `python` instead when
that state could differ:

- its environment differs from the server's in anything but the launcher's per-rank variables (HF_ENDPOINT,
  HF_HUB_CACHE, MALLOC_* and the like are read at import or at process start);
- it is not ``python [-u] -m MODULE ...`` or ``python [-u] SCRIPT ...``;
- ``GLM_GRPO_TESTS_FRESH=1`` (every command fresh: the suite as it ran before the server, to compare).

The tests of import-time behaviour (the quiet consoles of tests/integration/test_console.py and test_quiet_tools.py)
and of the launcher and signals (test_robustness.py, test_multinode.py, launch/*.sh) start real processes.

    proc = forkserver.popen([sys.executable, "-u", "-m", "glm_grpo_ds.train", ...], env, cwd, stdout, stderr)
    proc.wait(timeout)   # a subprocess.Popen-like object: pid, poll, wait, returncode, terminate, kill
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# never read at import: the launcher's per-rank variables (tests/integration/launching.spawn_ranks), read when the
# run starts its process group; pytest's name of the running test; what torch sets in the test process itself
# once it ran a model there (so a run's env copied before or after differs in them)
PER_RUN_KEYS = {
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_SIZE", "MASTER_ADDR", "MASTER_PORT", "CROSS_RANK", "CROSS_SIZE",
    "CUDA_VISIBLE_DEVICES", "PYTEST_CURRENT_TEST", "PYTORCH_NVML_BASED_CUDA_CHECK", "TORCHINDUCTOR_CACHE_DIR",
}  # fmt: skip
START_TIMEOUT_S = 180

_server: dict = {}  # this process's server: "proc", "path"


# ----------------------------------------------------------------------------- client
class Forked:
    """A forked run: what the tests use of ``subprocess.Popen``."""

    def __init__(self, conn: socket.socket, pid: int, args):
        self.conn, self.pid, self.args, self.returncode = conn, pid, args, None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.conn.setblocking(False)
            try:
                data = self.conn.recv(64)
            except BlockingIOError:
                return None
            finally:
                self.conn.setblocking(True)
            self._done(data)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.conn.settimeout(timeout)
            try:
                data = self.conn.recv(64)
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout) from None
            self._done(data)
        return self.returncode

    def _done(self, data: bytes) -> None:
        status = json.loads(data.decode()) if data else -signal.SIGKILL  # the server went away
        self.returncode = int(status)
        self.conn.close()

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:  # it ended and the server reaped it; its status is on its way (as Popen)
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _split(cmd: list[str]) -> tuple[bool, list[str]] | None:
    """``(unbuffered, [-m MODULE | SCRIPT, args...])`` of a ``python`` command the server can run, else None."""
    if not cmd or os.path.realpath(cmd[0]) != os.path.realpath(sys.executable):
        return None
    rest, unbuffered = list(cmd[1:]), False
    if rest[:1] == ["-u"]:
        rest, unbuffered = rest[1:], True
    if not rest or (rest[0].startswith("-") and rest[0] != "-m") or (rest[0] == "-m" and len(rest) < 2):
        return None
    return unbuffered, rest


def _differing(env: dict) -> list[str]:
    """The variables in which ``env`` differs from the server's, but for :data:`PER_RUN_KEYS`."""
    return sorted(k for k in (env.keys() | BASE_ENV.keys()) - PER_RUN_KEYS if env.get(k) != BASE_ENV.get(k))


def _base_env() -> dict:
    """The environment of the server, and of every run it forks (tests/integration/launching.ENV), taken as the
    test modules are collected, so what a test changes in os.environ later does not move it."""
    root = Path(__file__).resolve().parents[1]
    return dict(os.environ, PYTHONPATH=str(root), HF_HUB_OFFLINE="1", DS_ACCELERATOR="cpu")


BASE_ENV = _base_env()


def _stop(proc: subprocess.Popen, directory: str) -> None:
    """At the pytest worker's exit: the server ends, its socket and log go (a failure's log is in the test's
    own output: a run's stderr is its own)."""
    proc.kill()
    proc.wait()
    shutil.rmtree(directory, ignore_errors=True)


def _connect() -> socket.socket:
    if not _server or _server["proc"].poll() is not None:
        directory = tempfile.mkdtemp(prefix="glm-grpo-forkserver-")
        path = os.path.join(directory, "socket")
        env = BASE_ENV
        log = Path(directory) / "server.log"  # what the imports print
        with log.open("w") as sink:
            proc = subprocess.Popen(
                [sys.executable, __file__, path], env=env, stdin=subprocess.DEVNULL, stdout=sink, stderr=sink
            )
        _server.update(proc=proc, path=path)
        atexit.register(_stop, proc, directory)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not os.path.exists(path):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text()[-2000:]
                raise RuntimeError(f"the test fork server did not start (exit {proc.poll()}):\n{tail}")
            time.sleep(0.05)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(_server["path"])
    return conn


def popen(cmd: list[str], env: dict, cwd, stdout, stderr):
    """``subprocess.Popen(cmd, env=env, cwd=cwd, stdin=DEVNULL, stdout=stdout, stderr=stderr)``, forked from the
    server when it can be (module docstring); ``stdout`` / ``stderr``: open files."""
    split, diff = _split([str(c) for c in cmd]), _differing(env)
    if os.environ.get("FORKSERVER_DEBUG"):
        with open(os.environ["FORKSERVER_DEBUG"], "a") as f:
            f.write(f"{os.getpid()} split={split is not None} diff={diff} cmd={' '.join(map(str, cmd))[:150]}\n")
    if split is None or diff or os.environ.get("GLM_GRPO_TESTS_FRESH") == "1":
        return subprocess.Popen(cmd, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr)
    unbuffered, rest = split
    conn = _connect()
    request = json.dumps({"argv": rest, "env": env, "cwd": str(cwd), "unbuffered": unbuffered}).encode()
    message = len(request).to_bytes(8, "big") + request
    with open(os.devnull, "rb") as devnull:
        sent = socket.send_fds(conn, [message], [devnull.fileno(), stdout.fileno(), stderr.fileno()])
    conn.sendall(message[sent:])
    pid = int.from_bytes(_read_exactly(conn, 8), "big")
    return Forked(conn, pid, cmd)


def run(cmd: list[str], env: dict, cwd, timeout: float) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)`` by :func:`popen`."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = popen(cmd, env, cwd, out, err)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(cmd, code, out.read(), err.read())


def _read_exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise RuntimeError("the test fork server closed the connection")
        data += chunk
    return data


# ----------------------------------------------------------------------------- server
def _preload() -> None:
    """The libraries every run imports (what a fresh `python` spends its first ~8 s on)."""
    import matplotlib

    matplotlib.use("Agg")
    import bitsandbytes  # noqa: F401
    import deepspeed  # noqa: F401
    import diffusers
    import peft  # noqa: F401
    import torch  # noqa: F401
    import torchvision  # noqa: F401
    import transformers

    diffusers.GlmImagePipeline  # noqa: B018  (lazy modules: the attribute imports them)
    transformers.GlmImageForConditionalGeneration  # noqa: B018
    transformers.GlmImageProcessor  # noqa: B018
    import matplotlib.pyplot  # noqa: F401
    import scipy.stats  # noqa: F401

    _warm_up()


def _warm_up() -> None:
    """What every run did again after the imports above (~0.35 s of a ~2.5 s one-process run, measured on the
    2-core EPYC): the modules a run imports later (DeepSpeed's op builder loads torch's cpp_extension and with it
    setuptools; its engine the Muon optimizer; diffusers' pipeline loading onnxruntime), the run card's first
    matplotlib figure (font and text-layout caches), and the ABC caches those imports' registrations cleared
    (every conv layer's ``isinstance(kernel_size, Iterable)`` rebuilt them in each run)."""
    import collections.abc
    import importlib
    import io

    import matplotlib.pyplot as plt

    imported_later = ("torch.utils.cpp_extension", "deepspeed.runtime.zero.muon.muon_optimizer")
    imported_later += ("diffusers.pipelines.onnx_utils",)
    for name in imported_later:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError:  # an older library without it (the floor's): its runs do not import it either
            pass
    fig, ax = plt.subplots(2, 1, figsize=(4, 3))
    ax[0].plot([0, 1], [0, 1], label="x")
    ax[0].legend(fontsize="small")
    ax[1].set_xlabel("step")
    ax[1].grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(io.BytesIO(), format="png", dpi=100)
    plt.close(fig)
    isinstance(1, collections.abc.Iterable)


def _child(request: dict, fds: list[int], closing: list) -> None:
    """In the forked child: become the requested `python` run, then exit with its status."""
    import runpy
    import traceback

    for sock in closing:
        sock.close()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    if request["unbuffered"]:
        import io

        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True, errors="backslashreplace")
    argv, code = request["argv"], 0
    try:
        if argv[0] == "-m":
            sys.argv, sys.path[0] = [argv[1], *argv[2:]], os.getcwd()
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv, sys.path[0] = list(argv), os.path.dirname(os.path.realpath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as end:
        if end.code is None or isinstance(end.code, int):
            code = end.code or 0
        else:
            print(end.code, file=sys.stderr)
            code = 1
    except BaseException:  # what `python` does with an uncaught exception: the traceback, status 1
        traceback.print_exc()
        code = 1
    finally:
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(code)


def serve(path: str) -> None:
    """Accept requests on the Unix socket ``path``; fork one child per request; send each its pid, then its exit
    status when it ends. Single-threaded, so every fork copies a process with one thread."""
    _preload()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".tmp")
    os.rename(path + ".tmp", path)  # the client waits for the name: it exists once we listen
    listener.listen(16)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    children: dict[int, socket.socket] = {}
    while True:
        for _key, _ in selector.select(timeout=0.05):
            conn, _ = listener.accept()
            data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)  # the descriptors come with the first bytes
            while len(data) < 8 or len(data) < 8 + int.from_bytes(data[:8], "big"):
                data += _read_exactly(conn, 1 if len(data) < 8 else 8 + int.from_bytes(data[:8], "big") - len(data))
            pid = os.fork()
            if pid == 0:
                _child(json.loads(data[8:]), fds, [selector, listener, conn, *children.values()])
            for fd in fds:
                os.close(fd)
            conn.sendall(pid.to_bytes(8, "big"))
            children[pid] = conn
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = children.pop(pid)
            try:
                conn.sendall(json.dumps(os.waitstatus_to_exitcode(status)).encode())
            except OSError:  # the client went away
                pass
            conn.close()


if __name__ == "__main__":
    serve(sys.argv[1])
