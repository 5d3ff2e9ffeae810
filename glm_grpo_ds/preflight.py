"""``glm-grpo train --check``: everything a training job needs, checked with the job's own arguments before it
queues, on a login node without GPUs, in seconds: no model loads, no process group opens, nothing is written but
a probe file in ``output_dir`` (removed at once).

    glm-grpo train --check --config launch/configs/glm_image_lora.yaml --deepspeed ds_configs/zero2.json \\
        --num-gpus 8 --num-nodes 2 data.train_file=/data/prompts.jsonl
    python -m glm_grpo_ds.train --check --hostfile hostfile ...     # the nodes and GPUs read from the hostfile

It checks, each independently so that one pass shows every problem: the config (every unknown key at once), the
hostfile, the rewards (names, args, model files, libraries), ``lora.init_from``, the prompt data (every row) and
what the rewards need of it, the model files (a local directory or the Hugging Face cache: its processor, every
prompt's token ids, ``lora.target_modules`` against its layers), the DeepSpeed config filled for this world size,
``output_dir`` and what the run would resume (or refuse), and the memory plan at this world size. One line per
check (``ok`` / ``note`` / ``FAIL``), then the verdict. Exit 0 when the job would start, 2 on a bad input, 3 when
the only problem is memory (the line names the fastest shipped stage that fits). launch/slurm.sbatch,
launch/train_multinode.sh and launch/train.sh run it before they start the ranks.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

from .config import ConfigError, load_config
from .config.notes import unused_settings
from .data import FROM_DATA, DataError, check_source, load_prompts
from .data.prompt_order import check_enough
from .ds.ds_config import DeepSpeedConfigError, fill_ds_config, offloads, read_ds_config, zero_stage
from .lifecycle import checkpoint, disk_space, resume
from .lifecycle.run import decide_start
from .memory.basis import EstimateConfig
from .memory.plan import GIB, plan
from .memory.sizes import model_sizes
from .memory.stages import fastest_that_fits
from .model.adapters import check_init_adapter, check_target_modules, text_layer_linear_names
from .model.glm_image import load_processor, read_ar_config, resolve_dtype, resolve_sampling
from .model.random_weights import is_random
from .model.source import RANDOM_NOTE, cached_model_dir, check_local_model
from .model.token_ids import check_token_ids, embedding_rows
from .rewards import RewardError, check_reward_inputs, check_reward_specs
from .runtime.hostfile import HostfileError, read_hostfile, summary
from .testing.random_model import materialize

# What a bad input raises, in the checks and in a run's startup alike (train.py adds what only a rank can meet):
# one line each, never a traceback (anything else is a bug, with its traceback).
INPUT_ERRORS = (
    ConfigError,
    DataError,
    DeepSpeedConfigError,
    checkpoint.CheckpointError,
    checkpoint.OutputDirError,
    RewardError,
    FileNotFoundError,
)
# each becomes a FAIL line of the check; a finished run is one too (the job would do nothing)
CHECK_ERRORS = (*INPUT_ERRORS, HostfileError, resume.NothingToDo)
EXIT_BAD_INPUT, EXIT_OVER_BUDGET = 2, 3


@dataclass
class Report:
    """The check's lines, in order, and its verdict."""

    lines: list[tuple[str, str]] = field(default_factory=list)  # (ok | note | FAIL, text)
    over_budget: bool = False

    def add(self, kind: str, text: str) -> None:
        self.lines.append((kind, text))

    def failed_on(self, prefix: str) -> bool:
        return any(kind == "FAIL" and text.startswith(prefix) for kind, text in self.lines)

    @property
    def failed(self) -> int:
        return sum(kind == "FAIL" for kind, _ in self.lines)

    def exit_code(self) -> int:
        if self.failed == 0:
            return 0
        return EXIT_OVER_BUDGET if self.over_budget and self.failed == 1 else EXIT_BAD_INPUT


def _checked(report: Report, what: str, check, named_by: tuple[str, ...] = ()) -> object:
    """``check()``'s result (its ``ok`` line is the caller's), or None with a FAIL line naming ``what`` (unless the
    error starts with it or with one of ``named_by``, other names of the same thing)."""
    try:
        return check()
    except CHECK_ERRORS as err:
        text = " ".join(str(err).split("\n")) or type(err).__name__
        if not any(text in seen for kind, seen in report.lines if kind == "FAIL"):  # e.g. the plan's own check
            report.add("FAIL", text if text.startswith((what, *named_by)) else f"{what}: {text}")
        return None


def cluster_shape(num_gpus, num_nodes, hostfile: str | None, gpu_memory_gb: float | None, report):
    """The cluster the job asks for, as the memory plan takes it (:class:`EstimateConfig`): the hostfile's hosts and
    slots when given (the first ``num_nodes`` of them when given, as the launcher takes them; nodes of different
    slot counts: their sum is the world, as DeepSpeed's, and the largest node sizes the host RAM), else
    ``num_gpus`` x ``num_nodes`` (defaults 8 x 1 and the GPU's memory, estimate-memory's)."""
    d = EstimateConfig()
    gpu_memory_gb = gpu_memory_gb or d.gpu_memory_gb
    if hostfile:
        hosts = _checked(report, f"hostfile {hostfile}", lambda: read_hostfile(hostfile))
        if hosts:
            if num_nodes is not None and num_nodes > len(hosts):
                report.add("FAIL", f"--num-nodes {num_nodes} but hostfile {hostfile} lists {len(hosts)} node(s)")
            hosts = hosts[:num_nodes] if num_nodes else hosts
            slots = [n for _, n in hosts]
            if num_gpus and num_gpus > min(slots):  # deepspeed --num_gpus N starts N ranks per node, slots or not
                few = next(host for host, n in hosts if n == min(slots))
                report.add(
                    "FAIL",
                    f"--num-gpus {num_gpus} but hostfile {hostfile} gives {few} slots={min(slots)}: the launcher would "
                    f"start {num_gpus} ranks there; give --num-gpus {min(slots)} or leave it out (the slots decide)",
                )
            elif num_gpus and num_gpus < max(slots):
                report.add("note", f"--num-gpus {num_gpus}: {num_gpus} of each node's slots in hostfile {hostfile}")
            ranks = None if num_gpus or len(set(slots)) == 1 else sum(slots)  # --num-gpus: every node's
            if ranks is not None:
                report.add(
                    "note", f"hostfile {hostfile}: nodes with different GPU counts; host RAM planned at the largest"
                )
            report.add("ok", f"hostfile {hostfile}: {summary(hosts)}")
            return EstimateConfig(num_gpus or max(slots), len(hosts), gpu_memory_gb, ranks=ranks)
    return EstimateConfig(num_gpus or d.num_gpus, num_nodes or d.num_nodes, gpu_memory_gb)


def _data(cfg, report: Report) -> dict:
    """The training (and eval) prompts, every row read once, and what the rewards need of them, as the ranks' start
    checks them: ``{"data.train_file": rows, "eval.file": rows}``, the sources that could be read."""
    ev = cfg.eval
    read = {"data.train_file": lambda: _read(cfg.data.train_file, "data.train_file", cfg)}
    if ev.file:
        read["eval.file"] = lambda: _read(ev.file, "eval.file", cfg, ev.split, ev.revision, ev.subset)
    files = {"data.train_file": cfg.data.train_file, "eval.file": ev.file}
    sources = {}
    for key, rows in ((key, _checked(report, key, how)) for key, how in read.items()):
        if rows is None:
            continue
        sources[key] = rows
        report.add("ok", f"{key} {files[key]}: {len(rows):,} prompts")
        _checked(report, "rewards", partial(check_reward_inputs, cfg.rewards, rows, key, files[key]))
    return sources


def _read(path, key: str, cfg, split=FROM_DATA, revision=FROM_DATA, subset=FROM_DATA):
    """The checked rows of a prompt source, as the trainer's startup reads them (data/__init__.py)."""
    check_source(path, key, cfg.data, revision, subset=subset)
    return load_prompts(path, key, cfg.data, split, revision, subset=subset)


def _model(cfg, sources: dict, report: Report) -> dict | None:
    """The model's files where they are on this machine (a directory or the Hugging Face cache; nothing is
    downloaded): its processor, every prompt's token ids, the target modules. The AR's text config, or None."""
    name = cfg.model.path
    if _checked(report, "model.path", lambda: materialize(name) or True) is None:  # a bad random: name
        return None
    local = cached_model_dir(name, cfg.model.revision) if name else None
    if local is None:
        # a bad local path fails here; a Hub id not in this machine's cache is downloaded by rank 0 at start
        if _checked(report, "model.path", lambda: check_local_model(name, cfg.model.revision) or True) is None:
            return None
        from huggingface_hub import constants
        from transformers import GlmImageConfig

        if constants.is_offline_mode():  # what model/source.py follows: no download at start either
            report.add(
                "FAIL", f"model.path {name}: not in the Hugging Face cache and HF_HUB_OFFLINE=1; `hf download {name}`"
            )
            return None
        report.add(
            "note",
            f"model.path {name}: not in this machine's Hugging Face cache: rank 0 downloads it at start "
            f"(`hf download {name}` now, with the job's HF_HOME, saves the allocation's time)",
        )
        text = GlmImageConfig().text_config.to_dict()  # the real GLM-Image's layers
    else:
        text = read_ar_config(local)["text_config"]
    if cfg.lora is not None:
        _checked(
            report,
            "lora.target_modules",
            lambda: check_target_modules(cfg.lora.target_modules, text_layer_linear_names(text)),
        )
    if local is None:
        return text
    if sources:
        size = dict(height=cfg.rollout.height, width=cfg.rollout.width)
        processor = load_processor(local)
        for key, rows in sources.items():
            check = partial(check_token_ids, processor, embedding_rows(local), local, rows, key, **size)
            _checked(report, key, check)
    where = "a pipeline directory" if Path(str(name)).expanduser().exists() else f"in the Hugging Face cache: {local}"
    if is_random(name):
        where = f"configs in {local}; {RANDOM_NOTE}"
    report.add("ok", f"model.path {name}: {where}")
    return text


def _deepspeed(cfg, ds_path: str, est: EstimateConfig, text: dict | None, report: Report) -> dict | None:
    """The DeepSpeed config read and filled for this world size, as the ranks will (its contradictions with the
    training config refused). The raw config, or None."""
    raw = _checked(report, f"DeepSpeed config {ds_path}", lambda: read_ds_config(ds_path), (str(ds_path),))
    if raw is None:
        return None
    hidden = (text or {}).get("hidden_size", 4096)
    dtype = resolve_dtype(cfg.model.dtype, on_gpu=est.device == "cuda")
    filled = _checked(report, ds_path, lambda: fill_ds_config(raw, cfg, est.world, hidden, dtype, ds_path))
    if filled is not None:
        report.add("ok", f"DeepSpeed config {ds_path}: ZeRO-{zero_stage(filled)}, filled for {est.world} ranks")
    return raw


def _output_dir(cfg, est: EstimateConfig, raw: dict | None, rows, report: Report) -> None:
    """``output_dir`` writable (nothing created), and what the job would do there: resume a checkpoint that fits
    this world size and stage, start fresh, or refuse (an earlier run, a finished one)."""
    out = Path(cfg.output_dir)
    if _checked(report, "output_dir", lambda: checkpoint.check_output_dir(out, 0, create=False)) is None:
        return
    before = report.failed
    path = _checked(report, "resume_from", lambda: checkpoint.resume_path(out, cfg.resume_from))
    if report.failed > before:
        return
    stage = zero_stage(raw or {})
    if path is not None:
        data = resume.data_fingerprint(cfg.data.train_file, rows) if rows is not None else {}
        start = _checked(report, "resume_from", lambda: decide_start(out, path, cfg, est.world, stage, data, 0))
        if start is not None and start.written_on is not None:
            world, stage = start.written_on
            report.add(
                "ok",
                f"output_dir {out}: resumes from {path} (step {start.step}), written on {world} rank(s) at "
                f"ZeRO-{stage}: its DeepSpeed state is converted once to a universal checkpoint beside it "
                "(docs/checkpoints.md)",
            )
        elif start is not None:
            report.add("ok", f"output_dir {out}: resumes from {path} (step {start.step})")
        return
    if cfg.overwrite_output_dir and checkpoint.earlier_run(out):
        report.add("note", f"output_dir {out}: overwrite_output_dir=true deletes the earlier run in it at start")
        return
    # start_fresh without overwrite only refuses or returns: nothing is deleted
    if _checked(report, "output_dir", lambda: checkpoint.start_fresh(out, False, 0) or True):
        report.add("ok", f"output_dir {out}: a fresh start")


def _memory(cfg, ds_path: str, raw: dict, est: EstimateConfig, report: Report) -> None:
    """The memory plan of this run at this world size; over budget: FAIL naming the fastest stage that fits."""
    sizes = _checked(report, "memory plan", lambda: model_sizes(cfg))
    planned = _checked(report, "memory plan", lambda: plan(cfg, raw, est, sizes)) if sizes is not None else None
    if planned is None:
        return
    _disk(cfg, planned["disk"], report)
    total, gpu = planned["total_bytes"] / GIB, planned["gpu_memory_bytes"] / GIB
    host, per = planned["host_node"]["request_bytes"] // GIB, _unit(est)
    if planned["headroom_bytes"] >= 0:
        report.add("ok", f"memory plan: {total:.1f} of {gpu:.0f} GiB per {per}; host RAM per node: ask for {host} GiB")
        return
    fastest = fastest_that_fits(cfg, ds_path, planned, est, sizes)
    report.over_budget = True
    report.add("FAIL", f"memory plan: {total:.1f} GiB per {per} does not fit in {gpu:.0f} GiB; {fastest['line']}")


def _disk(cfg, disk: dict, report: Report) -> None:
    """What the run writes to ``output_dir`` (memory/disk.py) against its file system's free space, less what its
    checkpoints hold already (a resume's): FAIL when not even one checkpoint and the final weights fit (the run
    could save nothing), a note when the run's most at once does not (it would stop at a later checkpoint)."""
    if report.failed_on(f"output_dir {cfg.output_dir} "):  # not a folder it can write: no file system to weigh
        return
    free, need = disk_space.run_room(Path(cfg.output_dir), disk["run_bytes"])
    line, has = disk_space.disk_line(disk), f"its file system has {disk_space.size_text(free)} free"
    if free < disk_space.least_room(disk):
        report.add("FAIL", f"output_dir disk: {line}; {has}: free space there")
    elif free < need:
        report.add(
            "note",
            f"output_dir disk: {line}; {has}: the run stops before the "
            "checkpoint that does not fit (exit 7) unless space is freed; save_total_limit keeps fewer",
        )
    else:
        report.add("ok", f"output_dir disk: {line}; {disk_space.size_text(free)} free")


def _unit(est: EstimateConfig) -> str:
    """What a rank runs on, in the check's lines: a GPU, or a CPU rank (``--device cpu``)."""
    return "GPU" if est.device == "cuda" else "CPU rank"


def check(cfg, ds_path: str, est: EstimateConfig, report: Report) -> Report:
    """Every check of the job, in order (see the module docstring), added to ``report``; none loads a model or
    opens a process group."""
    shape = (
        f"{est.num_nodes} node(s) x {est.num_gpus} {_unit(est)}(s)" if est.ranks is None else f"{est.num_nodes} node(s)"
    )
    report.add("ok", f"config: {shape} = {est.world} ranks")
    for line in unused_settings(cfg):  # accepted, not acted on by this run (config/notes.py)
        report.add("note", line)
    _checked(report, "rewards", lambda: check_reward_specs(cfg.rewards, cfg.grpo.diversity_features))
    if cfg.lora is not None and cfg.lora.init_from:
        _checked(report, "lora.init_from", lambda: check_init_adapter(cfg.lora))
    sources = _data(cfg, report)
    rows = sources.get("data.train_file")
    if rows is not None:
        _checked(report, "data.train_file", lambda: check_enough(len(rows), est.world, cfg.batch.prompts_per_rank))
    text = _model(cfg, sources, report)
    before = report.failed
    raw = _deepspeed(cfg, ds_path, est, text, report)
    filled = raw is not None and report.failed == before  # else the plan, which fills it too, fails the same way
    if raw is not None and offloads(raw.get("zero_optimization") or {}, "offload_optimizer"):
        from .ds.process_group import cpu_adam_problem

        problem = cpu_adam_problem()  # the offloaded optimizer's op, which every rank builds at start
        if problem:
            report.add("FAIL", f"{ds_path}: {problem} (on the machine this check runs on)")
        else:
            report.add("ok", f"{ds_path}: DeepSpeed's cpu_adam op for the offloaded optimizer loads here")
    _output_dir(_as_the_run_records(cfg, report), est, raw, rows, report)
    if filled:
        _memory(cfg, ds_path, raw, est, report)
    return report


def _as_the_run_records(cfg, report: Report):
    """``cfg`` with grpo.sampling's unset knobs the model's own, as the run fills them in before it compares a
    checkpoint's settings with its own (startup.py): unfilled, a resume's check listed `temperature 1.0 -> null`
    among its changes. As it is when the model's files are not on this machine (they are read at start), or when its
    generation config cannot be read or holds what sampling refuses (a FAIL: the run would stop there too)."""
    local = cached_model_dir(cfg.model.path, cfg.model.revision) if cfg.model.path else None
    if local is None:
        return cfg
    sampling = _checked(report, "grpo.sampling", lambda: resolve_sampling(cfg.grpo.sampling, local))
    return cfg if sampling is None else replace(cfg, grpo=replace(cfg.grpo, sampling=sampling))


def print_report(report: Report, stream=None) -> None:
    """The lines, then the verdict: ``the job would start`` or how many problems stop it."""
    stream = sys.stdout if stream is None else stream
    for kind, text in report.lines:
        print(f"  {kind:<4}  {text}", file=stream)
    if report.failed:
        print(f"glm-grpo train --check: {report.failed} problem(s): the job would not start", file=stream)
    else:
        print("glm-grpo train --check: the job would start", file=stream)


def main(args) -> int:
    """``glm-grpo train --check`` with the parsed command line of ``glm-grpo train`` (config/arguments.py)."""
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as err:
        lines = str(err).splitlines()
        print("glm-grpo train --check: " + "\n  ".join(lines), file=sys.stderr)
        return EXIT_BAD_INPUT
    report = Report()
    est = cluster_shape(args.num_gpus, args.num_nodes, args.hostfile, args.gpu_memory_gb, report)
    est.device = args.device or est.device  # CPU ranks: model.dtype auto is fp32 (what the DeepSpeed config must say)
    if args.num_gpus is not None and args.num_gpus < 1 or args.num_nodes is not None and args.num_nodes < 1:
        report.add("FAIL", "--num-gpus and --num-nodes must be >= 1")
    check(cfg, args.deepspeed, est, report)
    print(f"glm-grpo train --check: {args.config or 'the defaults'} with {args.deepspeed}")
    print_report(report)
    return report.exit_code()
