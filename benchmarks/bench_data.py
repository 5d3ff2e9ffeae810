"""Memory of a rank's prompt data as the prompt set grows: load + check a synthetic prompt set, build
the sampler, draw steps, and print the process's RSS at each stage (docs/benchmarks-2026-11-early.md#prompt-data).

    python benchmarks/bench_data.py                                  # parquet + jsonl, 10k and 1M prompts
    python benchmarks/bench_data.py --sizes 10000 1000000 10000000 --formats parquet --steps 100

Each (format, size) runs in a fresh process, twice: the first converts the file into the ``datasets``
Arrow cache (a temporary HF_DATASETS_CACHE under --workdir), the second is what every later run and
every other rank sees. RSS is split into anonymous memory (the heap: Python objects, arrays) and
file-backed pages (the memory-mapped Arrow file: shared between the ranks of a node and reclaimable
by the kernel); "list of rows" is what holding every row as a Python object (the pre-datasets
reader) would add on top.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def rss() -> dict:
    """VmRSS / RssAnon / RssFile / VmHWM of this process in MiB (Linux /proc)."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields


def write_prompts(fmt: str, n: int, path: Path) -> None:
    """n synthetic prompts (~70 characters) with an extra integer column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    chunk = 100_000
    writer = (
        pq.ParquetWriter(path, pa.schema([("prompt", pa.string()), ("seed", pa.int64())])) if fmt == "parquet" else None
    )
    with open(path, "w", encoding="utf-8") if writer is None else open(os.devnull, "w") as out:
        for start in range(0, n, chunk):
            ids = range(start, min(n, start + chunk))
            prompts = [f"a photo of object {i} on a {i % 97} coloured table, style {i % 13}, soft light" for i in ids]
            if writer is not None:
                writer.write_table(pa.table({"prompt": prompts, "seed": list(ids)}))
            else:
                out.writelines(json.dumps({"prompt": p, "seed": i}) + "\n" for p, i in zip(prompts, ids))
    if writer is not None:
        writer.close()


def child(path: str, steps: int, world: int, per_rank: int) -> None:
    """One measurement, printed as a JSON line."""
    import datasets  # noqa: F401 - everything the loader imports is in the baseline, not in "+load"
    import pyarrow.compute  # noqa: F401

    import glm_grpo_ds.config  # noqa: F401
    import glm_grpo_ds.ds.dist  # noqa: F401
    from glm_grpo_ds.data import PromptOrder, load_prompts

    out = {"baseline": rss()}
    t0 = time.perf_counter()
    rows = load_prompts(path)
    out["load_s"], out["loaded"] = time.perf_counter() - t0, rss()
    sampler = PromptOrder(rows, world, 0, per_rank, seed=0)
    out["sampler"] = rss()
    t0 = time.perf_counter()
    for _ in range(steps):
        batch = sampler.next()
    out["step_ms"] = (time.perf_counter() - t0) / steps * 1e3
    out["stepped"], out["last"] = rss(), batch[0].prompt
    every = list(rows)
    out["listed"] = rss()
    out["rows"] = len(every)
    print(json.dumps(out))


def measure(path: Path, a, cache: Path) -> dict:
    env = dict(os.environ, HF_DATASETS_CACHE=str(cache), HF_HUB_OFFLINE="1")
    cmd = [sys.executable, __file__, "--child", str(path), "--steps", str(a.steps), "--world", str(a.world)]
    cmd += ["--per-rank", str(a.per_rank)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise SystemExit(f"bench_data: measuring {path} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 1_000_000])
    p.add_argument("--formats", nargs="+", choices=["parquet", "jsonl"], default=["parquet", "jsonl"])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--world", type=int, default=8, help="ranks the sampler splits each step across")
    p.add_argument("--per-rank", type=int, default=4, help="prompts per rank per step")
    p.add_argument("--workdir", default=None, help="where the files and the Arrow cache go (default: a temp dir)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        child(a.child, a.steps, a.world, a.per_rank)
        return 0
    work = Path(a.workdir or tempfile.mkdtemp(prefix="bench-data-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"{a.steps} steps of {a.world} ranks x {a.per_rank} prompts; MiB of rank 0 (anon = heap, file = mapped)")
    head = "format   prompts     load s (cold/warm)  anon: base  +load  +sampler  +steps  +file  peak  list of rows"
    print(head)
    for fmt in a.formats:
        for n in a.sizes:
            path = work / f"prompts_{n}.{fmt}"
            if not path.exists():
                write_prompts(fmt, n, path)
            cold = measure(path, a, work / "arrow")
            m = measure(path, a, work / "arrow")
            base = m["baseline"]
            grew = {k: m[k]["RssAnon"] - base["RssAnon"] for k in ("loaded", "sampler", "stepped")}
            mapped = m["stepped"]["RssFile"] - base["RssFile"]
            listed = m["listed"]["RssAnon"] - m["stepped"]["RssAnon"]
            print(
                f"{fmt:8s} {n:>10,d}  {cold['load_s']:7.1f} / {m['load_s']:5.1f}     {base['RssAnon']:9.0f}"
                f"  {grew['loaded']:+5.0f}  {grew['sampler']:+8.0f}  {grew['stepped']:+6.0f}  {mapped:+5.0f}"
                f"  {m['stepped']['VmHWM']:4.0f}  {listed:+8.0f}   ({m['step_ms']:.2f} ms/step)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
