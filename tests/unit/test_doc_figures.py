"""Every figure a user plans with, where README.md, docs/*.md or a launch/configs/*.yaml comment quotes it, is the
tool's own (issue #61: the docs said 42.5 GiB where `glm-grpo estimate-memory` said 44.47).

The tool's values come from the functions `glm-grpo estimate-memory` calls, in-process (load_config, model_sizes,
plan, step_time, format_plan, describe; no subprocess), once per planned run. Each quote is a :class:`Quote` in
:data:`QUOTES`: a file, a phrase as a regex whose groups are the quoted numbers, and per group the tool's value. A
number is compared rounded as it is quoted (``44.5`` against 44.47: one decimal); a phrase that no longer matches
its file fails too, so a reworded sentence is brought back here rather than left unchecked. Besides the phrases:
memory-and-speed.md's table of the four plans (every component, peak, largest phase, headroom, host RAM) and its
two pasted outputs (the host RAM lines, the planned time per step) are compared whole.

docs/benchmarks.md is a dated log of investigations: its figures are history and are not checked."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from glm_grpo_ds.commands.estimate_memory import format_plan
from glm_grpo_ds.config import load_config
from glm_grpo_ds.ds.ds_config import read_ds_config
from glm_grpo_ds.memory.plan import GIB, EstimateConfig, grid_tokens, plan
from glm_grpo_ds.memory.sizes import model_sizes
from glm_grpo_ds.memory.step_time import describe, step_time

ROOT = Path(__file__).resolve().parents[2]
NUMBER = re.compile(r"-?\d+(?:\.(\d+))?")


@dataclass(frozen=True)
class Run:
    """One `glm-grpo estimate-memory --config launch/configs/CONFIG --deepspeed ds_configs/DS --num-gpus GPUS
    [OVERRIDES]`."""

    config: str
    ds: str
    gpus: int
    overrides: tuple[str, ...] = ()

    def command(self) -> str:
        extra = "".join(f" {o}" for o in self.overrides)
        return (
            f"glm-grpo estimate-memory --config launch/configs/{self.config} --deepspeed ds_configs/{self.ds} "
            f"--num-gpus {self.gpus}{extra}"
        )


LORA_Z2_8 = Run("glm_image_lora.yaml", "zero2.json", 8)
LORA_Z2_1 = Run("glm_image_lora.yaml", "zero2.json", 1)
LORA_Z3_8 = Run("glm_image_lora.yaml", "zero3.json", 8)
LORA_Z3_8_ADAMW = Run("glm_image_lora.yaml", "zero3.json", 8, ("optimizer.name=adamw",))
LORA_Z3_8_MB2 = Run("glm_image_lora.yaml", "zero3.json", 8, ("batch.micro_batch_size=2",))
LORA_Z2_8_FP8 = Run("glm_image_lora.yaml", "zero2.json", 8, ("decoder.fp8=true",))
LORA_Z2_8_MERGED = Run("glm_image_lora.yaml", "zero2.json", 8, ("rollout.merge_lora=true", "rollout.fuse_lora=false"))
LORA_Z2_8_VQA = Run(
    "glm_image_lora.yaml", "zero2.json", 8, ("rewards=[{name: vqa, args: {model: Qwen/Qwen2.5-VL-7B-Instruct}}]",)
)
LORA_Z2_8_VQA448 = Run(
    "glm_image_lora.yaml",
    "zero2.json",
    8,
    ("rewards=[{name: vqa, args: {model: Qwen/Qwen2.5-VL-7B-Instruct, image_size: 448}}]",),
)
FULL_Z2_8 = Run("glm_image_full.yaml", "zero2.json", 8)
FULL_Z3_8 = Run("glm_image_full.yaml", "zero3.json", 8)
FULL_OFFLOAD_1 = Run("glm_image_full.yaml", "zero3_offload.json", 1)


@functools.lru_cache(maxsize=None)
def _sizes(config: str):
    """Parameter counts of a config's models (the overrides used here change no model or adapter)."""
    return model_sizes(load_config(str(ROOT / "launch/configs" / config)))


@functools.lru_cache(maxsize=None)
def planned(run: Run) -> dict:
    """What estimate-memory computes for ``run``: the plan and the step time (estimate_memory.main's calls)."""
    cfg = load_config(str(ROOT / "launch/configs" / run.config), list(run.overrides))
    est = EstimateConfig(num_gpus=run.gpus)
    p = plan(cfg, read_ds_config(str(ROOT / "ds_configs" / run.ds)), est, _sizes(run.config))
    timed = step_time(
        cfg, p["setup"]["zero_stage"], grid_tokens(cfg.rollout.height, cfg.rollout.width), est.prompt_tokens
    )
    return {"plan": p, "time": timed, "cfg": cfg}


# the tool's values, each a function of nothing (computed when a quote is checked)
def peak(run: Run) -> Callable[[], float]:
    return lambda: planned(run)["plan"]["total_bytes"] / GIB


def part(run: Run, name: str) -> Callable[[], float]:
    return lambda: planned(run)["plan"]["components"][name] / GIB


def disk(run: Run, key: str) -> Callable[[], float]:
    """A figure of the plan's ``disk`` (memory/disk.py), in GB (10^9 bytes, as the checkpoint docs write sizes)."""
    return lambda: planned(run)["plan"]["disk"][key] / 1e9


def host(run: Run, key: str) -> Callable[[], float]:
    return lambda: planned(run)["plan"]["host_node"][key] / GIB


def seconds(run: Run, what: str = "total_s") -> Callable[[], float]:
    return lambda: getattr(planned(run)["time"], what)


def billions(config: str, what: str) -> Callable[[], float]:
    """Parameters in billions: ``ar`` (the whole AR), ``trainable``, ``frozen`` (the AR less the trainable),
    ``decoder`` (DiT + VAE + glyph encoder), ``lora`` (the adapters)."""

    def value() -> float:
        s = _sizes(config)
        counts = {
            "ar": sum(s.ar_base),
            "trainable": s.trainable,
            "frozen": sum(s.ar_base) - s.trainable,
            "decoder": s.decoder,
            "lora": sum(s.lora),
        }
        return counts[what] / 1e9

    return value


AR, DECODER = billions("glm_image_lora.yaml", "ar"), billions("glm_image_lora.yaml", "decoder")


def WRAPPED(phrase: str) -> str:  # noqa: N802 - reads as a marker in QUOTES
    """``phrase`` with each space matching any run of whitespace: a sentence the docs may wrap anywhere."""
    return phrase.replace(" ", r"\s+")


@dataclass(frozen=True)
class Quote:
    """``file`` quotes ``values`` (one per group of ``phrase``, a regex matched with re.S; ``\\s+`` where a line may
    wrap) as worked out by the tool: ``why`` says how."""

    file: str
    phrase: str
    values: tuple[Callable[[], float | str], ...]
    why: str


QUOTES = [
    Quote(
        "docs/rewards.md",
        r"on every GPU \(`reward_models` (\d+\.\d+) GiB\): the plan's peak\s+is (\d+\.\d) GiB",
        (part(LORA_Z2_8_VQA, "reward_models"), peak(LORA_Z2_8_VQA)),
        LORA_Z2_8_VQA.command() + ": the judge's bytes and the peak",
    ),
    Quote(
        "docs/rewards.md",
        r"the language model, (\d+\.\d+) GiB for Qwen2\.5-VL-7B at 8 images of 1024² \(1,369 image tokens each;.*?"
        r"make fewer\), (\d+\.\d+) at 448 px",
        (part(LORA_Z2_8_VQA, "reward_scoring"), part(LORA_Z2_8_VQA448, "reward_scoring")),
        LORA_Z2_8_VQA.command() + " (and with image_size: 448): the judge's scoring forward",
    ),
    # README.md
    Quote("README.md", r"its (\d+\.\d) B autoregressive policy", (AR,), "AR parameters (memory/sizes.py)"),
    Quote("README.md", r"its frozen (\d+\.\d) B decoder", (DECODER,), "DiT + VAE + glyph encoder parameters"),
    Quote(
        "README.md",
        r"a (\d+\.\d) B AR and a (\d+\.\d) B decoder, ~(\d+) GB in bf16",
        (AR, DECODER, lambda: 2 * (AR() + DECODER())),
        "AR and decoder parameters, x 2 bytes",
    ),
    Quote(
        "README.md",
        r"plans \*\*(\d+\.\d) GiB per GPU\*\* for the shipped LoRA config",
        (peak(LORA_Z2_8),),
        LORA_Z2_8.command(),
    ),
    Quote(
        "README.md",
        r"Planned for the shipped LoRA config at its 30 guided DiT steps: ~(\d+) s per step at\s+ZeRO-2",
        (seconds(LORA_Z2_8),),
        "the planned time per step of " + LORA_Z2_8.command(),
    ),
    Quote(
        "README.md",
        r"`decoder\.fp8`: (\d+\.\d) -> (\d+\.\d) GiB of decoder",
        (part(LORA_Z2_8, "decoder"), part(LORA_Z2_8_FP8, "decoder")),
        "the plan's decoder component without and with decoder.fp8=true",
    ),
    # docs/configuration.md
    Quote(
        "docs/configuration.md",
        r"the LoRA config fits ZeRO-2 on one GPU \((\d+\.\d) GiB\)\s+and on 8 \((\d+\.\d) GiB\)",
        (peak(LORA_Z2_1), peak(LORA_Z2_8)),
        f"{LORA_Z2_1.command()}; {LORA_Z2_8.command()}",
    ),
    Quote(
        "docs/configuration.md",
        r"Full fine-tuning of the (\d+\.\d) B AR fits only ZeRO-3 on 8 GPUs \((\d+\.\d) GiB; ZeRO-2"
        r" plans\s+(\d+\.\d)\)",
        (AR, peak(FULL_Z3_8), peak(FULL_Z2_8)),
        f"{FULL_Z3_8.command()}; {FULL_Z2_8.command()}",
    ),
    Quote(
        "docs/configuration.md",
        r"only `zero3_offload\.json` \((\d+\.\d) GiB: .{0,120}a steady (\d+) GiB of it",
        (peak(FULL_OFFLOAD_1), host(FULL_OFFLOAD_1, "steady_bytes")),
        FULL_OFFLOAD_1.command() + ": peak and steady host RAM",
    ),
    Quote(
        "docs/configuration.md",
        r"every LoRA-adapted weight matrix: (\d+\.\d)\s+GiB for GLM-Image with all six projections of its 40 layers"
        r" adapted \((\d+\.\d+) G elements\)",
        (part(LORA_Z2_8_MERGED, "lora_merge_copy"), lambda: sum(_sizes("glm_image_lora.yaml").adapted_base) / 1e9),
        LORA_Z2_8_MERGED.command() + ": lora_merge_copy; the adapted weights' elements",
    ),
    # docs/memory-and-speed.md
    Quote(
        "docs/memory-and-speed.md",
        r"for the AR: (\d+\.\d+) B\s+parameters of which (\d+\.\d+) B language model and head \+ (\d+\.\d+) B vision"
        r"\s+tower and VQ model",
        (AR, billions("glm_image_full.yaml", "trainable"), billions("glm_image_full.yaml", "frozen")),
        "AR parameters; those full fine-tuning trains; the rest",
    ),
    Quote("docs/memory-and-speed.md", r"glyph encoder: (\d+\.\d+) B\)", (DECODER,), "decoder parameters"),
    Quote(
        "docs/memory-and-speed.md",
        r"\(4 B/param/N: (\d+\.\d+) GiB for full fine-tuning at ZeRO-2\)",
        (part(FULL_Z2_8, "fp32_grad_step"),),
        FULL_Z2_8.command() + ": fp32_grad_step",
    ),
    Quote(
        "docs/memory-and-speed.md",
        r"decoder \((\d+\.\d+) B parameters, (\d+\.\d) GiB in bf16\)",
        (DECODER, part(LORA_Z2_8, "decoder")),
        "decoder parameters; the plan's decoder component",
    ),
    Quote(
        "docs/memory-and-speed.md",
        r"\(8 x (\d+\.\d) GiB:\s+ask for (\d+) GiB with the LoRA config at ZeRO-2\)",
        (part(LORA_Z2_8, "ar_weights"), host(LORA_Z2_8, "request_bytes")),
        LORA_Z2_8.command() + ": ar_weights, host RAM request",
    ),
    Quote(
        "docs/memory-and-speed.md",
        r"hence (\d+)G now",
        (host(LORA_Z3_8, "request_bytes"),),
        LORA_Z3_8.command() + ": host RAM request",
    ),
    Quote(
        "docs/memory-and-speed.md",
        r"AR \+ decoder \+ a CLIP reward, ~(\d+) GiB\)",
        (host(LORA_Z3_8, "page_cache_bytes"),),
        LORA_Z3_8.command() + ": page cache",
    ),
    Quote(
        "docs/memory-and-speed.md",
        r"ZeRO-3 trades (\d+\.\d) GiB of resident weights for a (\d+\.\d) GiB transient gather",
        (
            lambda: part(LORA_Z2_8, "ar_weights")() - part(LORA_Z3_8, "ar_weights")(),
            part(LORA_Z3_8, "rollout_gather"),
        ),
        "ar_weights at ZeRO-2 less ZeRO-3; rollout_gather at ZeRO-3 (LoRA, 8 GPUs)",
    ),
    Quote(
        "docs/memory-and-speed.md",
        r"policy and reference, (\d+\.\d) GiB; `glm-grpo\s+estimate-memory` exits 3 on it\) and fits at ZeRO-3 with"
        r" (\d+\.\d) GiB to spare",
        (peak(FULL_Z2_8), lambda: planned(FULL_Z3_8)["plan"]["headroom_bytes"] / GIB),
        f"{FULL_Z2_8.command()}; the headroom of {FULL_Z3_8.command()}",
    ),
    Quote(
        "docs/memory-and-speed.md",
        r"The decoder's (\d+\.\d) GiB is\s+resident",
        (part(LORA_Z2_8, "decoder"),),
        "the plan's decoder component",
    ),
    Quote(
        "docs/memory-and-speed.md",
        r"80 GiB GPU: (\d+\.\d) GiB on the GPU and (\d+) GiB of steady host RAM",
        (peak(FULL_OFFLOAD_1), host(FULL_OFFLOAD_1, "steady_bytes")),
        FULL_OFFLOAD_1.command(),
    ),
    Quote(
        "docs/memory-and-speed.md",
        r"`~(\d+) s \+ the update \(not measured\)` for `glm_image_full\.yaml`",
        (seconds(FULL_Z3_8),),
        "the planned time per step of " + FULL_Z3_8.command(),
    ),
    Quote(
        "docs/memory-and-speed.md",
        r"now plans \*\*~(\d+) s\*\* per step for the shipped LoRA config at ZeRO-2\s+\(~(\d+) s at ZeRO-3; 1 000 steps"
        r" at ZeRO-2: ~(\d+\.\d) days\), the decode (\d+) % of it",
        (
            seconds(LORA_Z2_8),
            seconds(LORA_Z3_8),
            lambda: seconds(LORA_Z2_8)() * 1000 / 86400,
            lambda: 100 * seconds(LORA_Z2_8, "decode_s")() / seconds(LORA_Z2_8)(),
        ),
        "the planned time per step at ZeRO-2 and ZeRO-3 (LoRA, 8 GPUs), x 1000 steps, the decode's share",
    ),
    Quote(
        "docs/memory-and-speed.md",
        r"the planned peak stays rollout-bound \((\d+\.\d) GiB\s+instead of (\d+\.\d) on 8 x 80 GB\)",
        (peak(LORA_Z3_8), peak(LORA_Z3_8_MB2)),
        f"{LORA_Z3_8.command()}; the same with batch.micro_batch_size=2",
    ),
    Quote(
        "docs/memory-and-speed.md",
        r"beside a ~(\d+) s step \(the planned time at ZeRO-3\)",
        (seconds(LORA_Z3_8),),
        "the planned time per step of " + LORA_Z3_8.command(),
    ),
    Quote(
        "docs/memory-and-speed.md",
        r"Peak (\d+\.\d) GiB per GPU \((\w+)-bound\)",
        (peak(LORA_Z2_8), lambda: planned(LORA_Z2_8)["plan"]["peak_phase"]),
        LORA_Z2_8.command() + ": peak and its phase",
    ),
    Quote(
        "docs/memory-and-speed.md",
        r"(\d+) GiB of host RAM per 8-GPU node when the checkpoint must be cast",
        (host(LORA_Z2_8, "loading_peak_bytes"),),
        LORA_Z2_8.command() + ": host RAM peak while loading",
    ),
    Quote(
        "docs/memory-and-speed.md",
        r"saves no GPU memory at peak for LoRA \((\d+\.\d) GiB: .{0,120}host RAM while loading is (\d+\.\d) GiB"
        r" per node",
        (peak(LORA_Z3_8), host(LORA_Z3_8, "loading_peak_bytes")),
        LORA_Z3_8.command() + ": peak, host RAM peak while loading",
    ),
    Quote(
        "docs/memory-and-speed.md",
        r"\((\d+\.\d) GiB at ZeRO-2 does not fit 80 GB, (\d+\.\d) at ZeRO-3\)",
        (peak(FULL_Z2_8), peak(FULL_Z3_8)),
        f"{FULL_Z2_8.command()}; {FULL_Z3_8.command()}",
    ),
    Quote(
        "docs/memory-and-speed.md",
        r"Below ~(\d+) GiB per GPU neither fits",
        (lambda: min(peak(LORA_Z2_8)(), peak(LORA_Z3_8)()),),
        "the smaller LoRA peak on 8 GPUs, ZeRO-2 or ZeRO-3",
    ),
    Quote(
        "docs/memory-and-speed.md",
        r"7-13 s\s+of a ~(\d+) s planned step \(ZeRO-2\)",
        (seconds(LORA_Z2_8),),
        "the planned time per step of " + LORA_Z2_8.command(),
    ),
    # docs/checkpoints.md, docs/design.md
    Quote(
        "docs/checkpoints.md",
        WRAPPED(r"frozen AR is (\d+\.\d+) B parameters, (\d+\.\d) GB in bf16"),
        (AR, lambda: 2 * AR()),
        "AR parameters, x 2 bytes",
    ),
    Quote(
        "docs/checkpoints.md",
        r"adapter is (\d+\.\d) M parameters",
        (lambda: 1000 * billions("glm_image_lora.yaml", "lora")(),),
        "the LoRA config's adapter parameters",
    ),
    Quote(
        "docs/checkpoints.md",
        WRAPPED(
            r"leaves out the (\d+\.\d+) B frozen parameters of the vision tower and VQ model; its fp32 master and AdamW"
            r" moments of (\d+\.\d+) B trainable"
        ),
        (billions("glm_image_full.yaml", "frozen"), billions("glm_image_full.yaml", "trainable")),
        "full fine-tuning's frozen and trainable AR parameters",
    ),
    Quote(
        "docs/checkpoints.md",
        WRAPPED(
            r"\*\*(\d+\.\d) GB per checkpoint\*\* for LoRA r=64 with 8-bit AdamW, (\d+\.\d) GB with "
            r"`optimizer\.name=adamw` \(ZeRO-3\); `glm_image_lora\.yaml` \(`save_total_limit: 3`\) holds up to "
            r"(\d+\.\d) GB in `output_dir` at ZeRO-2"
        ),
        (disk(LORA_Z2_8, "checkpoint_bytes"), disk(LORA_Z3_8_ADAMW, "checkpoint_bytes"), disk(LORA_Z2_8, "run_bytes")),
        f"{LORA_Z2_8.command()} --json: disk; {LORA_Z3_8_ADAMW.command()} --json: disk",
    ),
    Quote(
        "docs/checkpoints.md",
        WRAPPED(
            r"remain: (\d+\.\d) GB per checkpoint at ZeRO-3 \(`glm_image_full\.yaml`\), and `final_model/` is"
            r" (\d+\.\d) GB"
        ),
        (disk(FULL_Z3_8, "checkpoint_bytes"), disk(FULL_Z3_8, "final_bytes")),
        f"{FULL_Z3_8.command()} --json: disk",
    ),
    Quote(
        "docs/checkpoints.md",
        r"GLM-Image's (\d+\.\d) B AR expect ~(\d+) GB of host RAM",
        (AR, lambda: 4 * (AR() + billions("glm_image_lora.yaml", "lora")())),
        "AR parameters; one fp32 copy of the AR plus the adapter",
    ),
    Quote("docs/design.md", r"so the (\d+\.\d) B model", (AR,), "AR parameters"),
    # launch/configs/*.yaml comments
    Quote(
        "launch/configs/glm_image_lora.yaml",
        r"# with checkpointing the planned peak at ZeRO-3 on 8 GPUs stays rollout-bound \((\d+\.\d) GiB at 8, (\d+\.\d)"
        r" at 2\)",
        (peak(LORA_Z3_8), peak(LORA_Z3_8_MB2)),
        f"{LORA_Z3_8.command()}; the same with batch.micro_batch_size=2",
    ),
]


def rounded_as_quoted(quoted: str, value: float | str) -> str:
    """``value`` as ``quoted`` writes it: a string as it is, a number with as many decimals as the quote."""
    if isinstance(value, str):
        return value
    decimals = NUMBER.fullmatch(quoted).group(1)
    return f"{value:.{len(decimals) if decimals else 0}f}"


def mismatches(quote: Quote, text: str) -> list[str]:
    """What is wrong with ``quote`` in ``text``: each quoted number that is not the tool's, or the phrase missing."""
    found = list(re.finditer(quote.phrase, text, re.S))
    if not found:
        return [f"{quote.file}: no phrase matches {quote.phrase!r} any more; put the figure back or update QUOTES"]
    wrong = []
    for match in found:
        for quoted, value in zip(match.groups(), quote.values):
            want = rounded_as_quoted(quoted, value())
            if quoted != want:
                phrase = " ".join(match.group(0).split())
                wrong.append(f"{quote.file}: '{phrase}' quotes {quoted}, the tool says {want} ({quote.why})")
    return wrong


@pytest.mark.parametrize("quote", QUOTES, ids=lambda q: f"{q.file}:{q.phrase[:40]}")
def test_each_quoted_figure_is_the_tools(quote):
    assert re.compile(quote.phrase).groups == len(quote.values), "one value per group"
    text = (ROOT / quote.file).read_text(encoding="utf-8")
    assert not mismatches(quote, text), "\n".join(mismatches(quote, text))


def test_a_changed_figure_fails_naming_the_file_the_phrase_and_the_tools_value():
    """A figure edited by hand (44.5 -> 42.5, as the docs had it) is reported with the tool's value."""
    quote = next(q for q in QUOTES if "plans \\*\\*" in q.phrase)
    text = (ROOT / quote.file).read_text(encoding="utf-8")
    assert not mismatches(quote, text)
    assert mismatches(quote, text.replace("plans **44.5 GiB", "plans **42.5 GiB")) == [
        "README.md: 'plans **42.5 GiB per GPU** for the shipped LoRA config' quotes 42.5, the tool says 44.5 "
        f"({LORA_Z2_8.command()})"
    ]
    assert "no phrase matches" in mismatches(quote, text.replace("plans **44.5 GiB", "plans about 44 GiB"))[0]


TABLE_HEAD = "| GiB per GPU | LoRA r=64, 8-bit, ZeRO-2 | LoRA r=64, 8-bit, ZeRO-3 |"
TABLE_RUNS = (LORA_Z2_8, LORA_Z3_8, FULL_Z2_8, FULL_Z3_8)  # its columns, in order


def _table(text: str) -> dict[str, list[str]]:
    """memory-and-speed.md's plan table: {the row's first word (a component's name, `**peak**`, ...): its cells}."""
    start = text.index(TABLE_HEAD)
    rows = {}
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0].split()[0].strip("*`")] = [c.strip("*").strip() for c in cells[1:]]
    return rows


def test_the_plan_table_is_the_tools():
    """docs/memory-and-speed.md's table of the four plans: every component (and only those), the peak, the largest
    phase, the headroom and the host RAM, per column, as estimate-memory prints them."""
    text = (ROOT / "docs/memory-and-speed.md").read_text(encoding="utf-8")
    for run in TABLE_RUNS:  # the commands above the table are the columns' runs
        assert run.command() in text
    rows = _table(text)
    plans = [planned(run)["plan"] for run in TABLE_RUNS]
    want = {name: [f"{p['components'][name] / GIB:.2f}" for p in plans] for name in plans[0]["components"]}
    want["peak"] = [f"{p['total_bytes'] / GIB:.1f}" for p in plans]
    want["largest"] = [p["peak_phase"] for p in plans]
    want["headroom"] = [f"{p['headroom_bytes'] / GIB:.1f}" for p in plans]
    host_ram = [p["host_node"] for p in plans]
    want["host"] = [f"{h['loading_peak_bytes'] / GIB:.1f} / {h['request_bytes'] / GIB:.0f}" for h in host_ram]
    have = {name: [c.removesuffix(" *") for c in cells] for name, cells in rows.items()}
    wrong = [
        f"{name}: the table says {have.get(name)}, the tool {cells}"
        for name, cells in want.items()
        if have.get(name) != cells
    ]
    extra = sorted(set(have) - set(want))
    assert not wrong and not extra, (
        "docs/memory-and-speed.md's plan table (columns: "
        + "; ".join(r.command() for r in TABLE_RUNS)
        + "):\n"
        + "\n".join(wrong + [f"{name}: not a component of the plan" for name in extra])
    )


def test_the_pasted_outputs_are_the_tools():
    """memory-and-speed.md's pasted host RAM lines (LoRA, ZeRO-2: launch/slurm.sbatch's default, 8 GPUs) and planned
    time per step (LoRA, ZeRO-2, 8 GPUs) are what estimate-memory prints for those runs (the time line wrapped:
    compared word by word)."""
    text = (ROOT / "docs/memory-and-speed.md").read_text(encoding="utf-8")
    blocks = [b for lang, b in re.findall(r"^```(\w*)\n(.*?)^```", text, re.S | re.M) if not lang]
    host_block = next(b for b in blocks if b.startswith("host RAM per node"))
    printed = [line.strip() for line in format_plan(planned(LORA_Z2_8)["plan"]).splitlines()]
    for line in host_block.splitlines():
        assert line in printed, f"docs/memory-and-speed.md: {line!r} is not what {LORA_Z2_8.command()} prints"
    time_block = next(b for b in blocks if b.startswith("planned time per step"))
    line = describe(planned(LORA_Z2_8)["time"])
    assert time_block.split() == line.split(), (
        f"docs/memory-and-speed.md's planned time per step is not what {LORA_Z2_8.command()} prints:\n{line}"
    )
