"""The rendezvous port of a one-node launch: the launcher's usual 29500 when it is free, else a free one, so a
second run on a shared node (launch/train.sh with other GPUs of CUDA_VISIBLE_DEVICES, a second `make demo`) starts
instead of dying on torch's ``EADDRINUSE`` at the first collective. Several nodes must agree on one port, so
launch/train_multinode.sh and launch/slurm.sbatch keep a fixed one.

    python -m glm_grpo_ds.runtime.ports 29500 --for launch/train.sh   # prints 29500, or a free port and a note
"""

from __future__ import annotations

import argparse
import socket
import sys


def free_port() -> int:
    """A free TCP port on the loopback interface (for a process group's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
