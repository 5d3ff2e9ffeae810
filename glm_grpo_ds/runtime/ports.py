"""The rendezvous port of a one-node launch: the launcher's usual 29500 when it is free, else a free one, so a
second run on a shared node (launch/train.sh with other GPUs of CUDA_VISIBLE_DEVICES, a second `make demo`) starts
instead of dying on torch's ``EADDRINUSE`` at the first collective. Several nodes must agree on one port:
launch/slurm.sbatch picks it once, in its batch shell on the rendezvous node, and hands it to every node;
launch/train_multinode.sh, whose nodes start on their own, keeps a fixed one.

    python -m glm_grpo_ds.runtime.ports 29500 --for launch/train.sh   # prints 29500, or a free port and a note
"""

from __future__ import annotations

import argparse
import random
import socket
import sys
from pathlib import Path

# Linux's default ephemeral range, for where /proc is not readable (macOS uses 49152-65535, also above it)
_EPHEMERAL_DEFAULT = (32768, 60999)
_LOWEST = 20000  # below: well-known services' ports (8080, 9090, ...) that may start later on the node


def ephemeral_range() -> tuple[int, int]:
    """The ports the kernel hands out to outgoing connections and ``bind(0)`` (``ip_local_port_range``)."""
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return _EPHEMERAL_DEFAULT


def free_port() -> int:
    """A free TCP port for a process group's rendezvous, below the kernel's ephemeral range.

    A port from ``bind(0)`` is ephemeral: between this call and the launcher's rank 0 listening on it (seconds:
    the launcher imports torch first) any process's outgoing connection may take it, and gloo's ranks open
    many (CI lost a bench run that way: EADDRINUSE on an ephemeral port). Below the range only another
    listener can take it, so pick one at random there (os entropy: forked test workers share ``random``'s
    state) that is free now.
    """
    eph_lo, _ = ephemeral_range()
    top = eph_lo - 1 if eph_lo - 1 > _LOWEST + 1000 else 32767
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randint(_LOWEST, top)
        if is_free(port):
            return port
    raise RuntimeError(f"no free TCP port in {_LOWEST}-{top} after 200 tries; set MASTER_PORT to choose one")


def is_free(port: int) -> bool:
    """True when a TCP server could listen on ``port`` on every interface, as torch's TCPStore does on rank 0."""
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def rendezvous_port(preferred: int) -> int:
    """``preferred`` when it is free, else a free port."""
    return preferred if is_free(preferred) else free_port()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m glm_grpo_ds.runtime.ports", description=__doc__.split("\n\n")[0])
    p.add_argument("preferred", type=int, help="the port to use when it is free (the deepspeed launcher's: 29500)")
    p.add_argument("--for", dest="who", default="glm-grpo", help="the script named in the note on stderr")
    a = p.parse_args(argv)
    port = rendezvous_port(a.preferred)
    if port != a.preferred:
        print(
            f"{a.who}: port {a.preferred} is taken (another run on this node?): rendezvous on port {port} "
            "(set MASTER_PORT to choose)",
            file=sys.stderr,
        )
    print(port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
