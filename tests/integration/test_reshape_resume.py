"""A run resumed on another world size or ZeRO stage (issue #62), under real DeepSpeed on CPU ranks with gloo.

The tiny GLM-Image with LoRA (fp32, torch AdamW) trained uninterrupted on 2 ranks x 1 prompt at ZeRO-2, a checkpoint
every 2 steps, is the reference. A chain of resumes branches from it and continues, each compared with the reference
at the same step: step 2 resumed on 1 rank x 2 prompts (2 -> 1), its step 4 on 2 ranks (1 -> 2), that step 6 at
ZeRO-3 (ZeRO-2 -> ZeRO-3), that step 8 at ZeRO-2 again (ZeRO-3 -> ZeRO-2). Then bitsandbytes 8-bit AdamW and full
fine-tuning across 2 -> 1, controls whose optimizer moments are dropped (for the chain's first move and for both of
those), a one-step-off run's pending rollout (the prompts of each step recorded by its reward), and the refusals.

The tolerance: a world-size or stage change reorders fp32 sums (each rank's gradient reduction, the all-reduce, the
loss's micro-batches) and nothing else: the same prompts, sampling streams and decode noise make the same rollouts.
Measured here (2026-11-29, 2-core CPU): adapters within 4.1e-7 of the reference 2 steps after the first move and
8.3e-7 after the fourth, moments within 2.2e-9 (exp_avg) and 2e-13 (exp_avg_sq); the 8-bit
and full fine-tuning figures beside the world size's own effect: docs/checkpoints.md "Resume on another cluster
shape". ~5 min of one core.
"""

import json
import shutil

import pytest
import torch
from launching import FAST, launch, run_train, train_args  # noqa: E402  (tests/integration/launching.py)
from run_files import jsonl, metrics  # noqa: E402  (tests/run_files.py)
from safetensors.torch import load_file

from glm_grpo_ds.commands import check_run
from glm_grpo_ds.ds import portable
from glm_grpo_ds.observability.records import read_run_record

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

TOL = 1e-5  # adapters and moments after a move and 2 more steps: fp32 reduction order (measured <= 1e-6)
VOLATILE = ("time/", "_per_s", "peak_", "memory/")


def train(nprocs, out, *overrides, ds_config="zero2.json"):
    launch(nprocs, train_args(*overrides, f"output_dir={out}", ds_config=ds_config), launcher=False)
    return out


def branch(source, out, step):
    """``out``: ``source``'s run as it stood when checkpoint ``step`` was written (that checkpoint, config.json and
    the metrics up to it), so a resume there continues what ``source`` stopped: a preempted job requeued."""
    name = f"step_{step:06d}"
    (out / "checkpoints").mkdir(parents=True)
    shutil.copytree(
        source / "checkpoints" / name, out / "checkpoints" / name, ignore=shutil.ignore_patterns("universal")
    )
    (out / "checkpoints" / "latest").write_text(name)
    shutil.copy(source / "config.json", out / "config.json")
    lines = (source / "metrics.jsonl").read_text().splitlines()
    (out / "metrics.jsonl").write_text("".join(line + "\n" for line in lines if json.loads(line)["step"] <= step))
    return out


def ckpt(run, step):
    return run / "checkpoints" / f"step_{step:06d}"


def adapter(run, step):
    return load_file(ckpt(run, step) / "adapter" / "adapter_model.safetensors")


def weights(run, step, tmp):
    """Every trainable parameter's fp32 master weight and Adam moments at checkpoint ``step``, read through DeepSpeed's
    universal conversion (whatever the world size and stage that wrote it): {name: {fp32, exp_avg, exp_avg_sq}}."""
    out = tmp / f"{run.name}_{step}"
    portable.convert(ckpt(run, step) / "ds", out)
    return universal_state(out)


def universal_state(folder):
    """{name: {fp32, exp_avg, exp_avg_sq}} of a universal checkpoint ``folder``."""
    return {
        p.name: {k: torch.load(p / f"{k}.pt", weights_only=True)["param"] for k in ("fp32", "exp_avg", "exp_avg_sq")}
        for p in (folder / "zero").iterdir()
        if p.is_dir()
    }


def max_diff(a, b):
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def state_diff(a, b, key):
    assert a.keys() == b.keys()
    return max((a[n][key] - b[n][key]).abs().max().item() for n in a)


def stable(record):
    return {k: v for k, v in record.items() if not any(tag in k for tag in VOLATILE)}


def drop_moments(run, step):
    """``run`` with checkpoint ``step`` converted for another world size and its Adam moments zeroed there (weights,
    schedule and data position kept): a resume of it is one that lost the optimizer state."""
    at = ckpt(run, step)
    portable.convert(at / "ds", at / portable.UNIVERSAL)
    for moment in (at / portable.UNIVERSAL / "zero").glob("*/exp_avg*.pt"):
        state = torch.load(moment, weights_only=True)
        state["param"] = torch.zeros_like(state["param"])
        torch.save(state, moment)
    return run


@pytest.fixture(scope="module")
def base(tiny_model_dir, data64):
    return [f"model.path={tiny_model_dir}", f"data.train_file={data64}", *FAST, "save_steps=2"]


@pytest.fixture(scope="module")
def chain(base, tmp_path_factory):
    """The reference and the chain of resumes (see the module's docstring): ~4 min on 2 cores."""
    root = tmp_path_factory.mktemp("reshape")
    ref = train(2, root / "reference", *base, "max_steps=10")
    one = train(
        1, branch(ref, root / "one_rank", 2), *base, "max_steps=4", "batch.prompts_per_rank=2", "resume_from=auto"
    )
    two = train(2, branch(one, root / "two_ranks", 4), *base, "max_steps=6", "resume_from=auto")
    z3 = train(2, branch(two, root / "zero3", 6), *base, "max_steps=8", "resume_from=auto", ds_config="zero3.json")
    z2 = train(2, branch(z3, root / "zero2", 8), *base, "max_steps=10", "resume_from=auto")
    return {"reference": ref, "moves": {4: one, 6: two, 8: z3, 10: z2}, "root": root}


def test_each_shapes_checkpoints_are_the_size_their_plan_gives(chain):
    """The disk plan (glm_grpo_ds/memory/disk.py, in each run's memory_plan.json) against the checkpoints the runs
    wrote: LoRA with torch AdamW on 2 ranks and 1 at ZeRO-2, and on 2 at ZeRO-3, within 4 % (each part's bytes by
    hand: tests/unit/test_disk_space.py); the trainer checks the disk's room with it before the first checkpoint."""
    from glm_grpo_ds.lifecycle.disk_space import tree_bytes

    runs = [(2, chain["reference"]), *chain["moves"].items()]
    for step, run in runs:
        planned = json.loads((run / "memory_plan.json").read_text())["disk"]["checkpoint_bytes"]
        written = tree_bytes(run / "checkpoints" / f"step_{step:06d}")
        print(f"{run.name} step {step}: checkpoint {written:,} bytes written, {planned:,} planned")
        assert abs(planned / written - 1) < 0.04, (run.name, planned, written)


def test_a_run_continues_on_half_and_twice_the_ranks_and_across_stages(chain, tmp_path):
    """Each move, 2 steps later: the adapter and the optimizer's moments within TOL of the uninterrupted run's."""
    ref = chain["reference"]
    for step, run in chain["moves"].items():
        diff = max_diff(adapter(ref, step), adapter(run, step))
        print(f"{run.name}: adapter within {diff:.2g} of the uninterrupted run at step {step}")
        assert diff < TOL, (run.name, diff)
    for step in (4, 10):  # 2 -> 1 (ZeRO-2) and 2 ranks ZeRO-3 -> ZeRO-2: the full optimizer state
        a, b = weights(ref, step, tmp_path), weights(chain["moves"][step], step, tmp_path)
        for key in ("fp32", "exp_avg", "exp_avg_sq"):
            print(f"step {step} {key}: within {state_diff(a, b, key):.2g}")
            assert state_diff(a, b, key) < TOL, (step, key)


def test_the_resumed_runs_history_is_continuous(chain):
    """The same prompts in the same order (the same rewards per step), the lr schedule and step count unbroken, the
    shape changes in config.json's segments and the card."""
    ref = metrics(chain["reference"])
    z2 = chain["moves"][10]
    got = metrics(z2)
    assert [r["step"] for r in got] == list(range(1, 11))
    for a, b in zip(ref, got):
        assert a["lr"] == b["lr"] and a["skipped_steps"] == b["skipped_steps"], a["step"]
        assert b["reward_mean"] == pytest.approx(a["reward_mean"], abs=1e-5), a["step"]
        assert b["reward/pixel_mse"] == pytest.approx(a["reward/pixel_mse"], abs=1e-5), a["step"]
    segments = json.loads((z2 / "config.json").read_text())["segments"]
    shapes = [(s["from_step"], s["changed"].get("world_size"), s["changed"].get("zero_stage")) for s in segments]
    assert shapes == [(0, None, None), (2, [2, 1], None), (4, [1, 2], None), (6, None, [2, 3]), (8, None, [3, 2])]
    card = (z2 / "checkpoints" / "step_000010" / "adapter" / "README.md").read_text().splitlines()
    at = {line.split(":")[0]: line for line in card if line.startswith("- from step ")}
    assert "`world_size` 2 -> 1" in at["- from step 3"] and "`batch.prompts_per_rank` 1 -> 2" in at["- from step 3"]
    assert "`zero_stage` 3 -> 2" in at["- from step 9"]
    history = dict((name, detail) for name, _, detail in check_run.history_results(read_run_record(z2)))["history"]
    assert "from step 3: batch.prompts_per_rank 1 -> 2" in history and "zero_stage 3 -> 2" in history
    log = (chain["moves"][4] / "logs" / "rank_0.log").read_text()
    assert "step_000002 was written on 2 rank(s) at ZeRO-2; this run has 1 at ZeRO-2: converting" in log


@pytest.fixture(scope="module")
def dropped(chain, base, tmp_path_factory):
    """The 2 -> 1 resume with the converted checkpoint's Adam moments zeroed (its weights, schedule and data position
    kept): what a resume that lost the optimizer state would train."""
    root = tmp_path_factory.mktemp("dropped")
    run = drop_moments(branch(chain["reference"], root / "dropped", 2), 2)
    return train(1, run, *base, "max_steps=4", "batch.prompts_per_rank=2", "resume_from=auto")


def test_a_resume_without_the_optimizer_state_is_told_apart(chain, dropped):
    """The control: dropping the moments moves the adapter far beyond the tolerance, so the tests above can tell a
    real resume from a restart of the optimizer."""
    diff = max_diff(adapter(chain["reference"], 4), adapter(dropped, 4))
    print(f"moments dropped: adapter {diff:.2g} from the uninterrupted run")
    assert diff > 100 * TOL, diff


@pytest.mark.parametrize("kind", ["adamw_8bit", "full"])
def test_8bit_adamw_and_full_fine_tuning_continue_on_half_the_ranks(kind, base, tmp_path):
    """bitsandbytes 8-bit AdamW (LoRA; 2 ranks at ZeRO-2 -> 1 at ZeRO-3, the demo's stage: ZeRO-3 fills its
    optimizer's groups only during the step, and the move crashed at its first step) and full fine-tuning (fp32
    AdamW, ZeRO-2), 2 ranks -> 1 at step 2, against the uninterrupted 2-rank run at step 4. The move may cost no more
    than the world size alone costs (the same 4 steps
    on 1 rank x 2 prompts from the start: reduction order, and for 8-bit the blocks of 256 each rank's partition is
    cut into), nor more than 5% of what steps 3 and 4 change in the uninterrupted run. 8-bit moments go through fp32
    and are quantized again on the new partition (a block that now starts elsewhere gets another scale: its moments,
    and so its Adam steps, a few % off); full fine-tuning's moments and weights move exactly and differ by reduction
    order only.
    The control: the same move with the moments dropped lands beyond that bound, for the weights and both moments.
    Measured (2-core CPU; each bound over the move, the control over each bound): 8-bit into ZeRO-3 58x / 28x
    (weights), 83x / 69x (exp_avg), 300x / 1200x (exp_avg_sq) (2026-12-02); full fine-tuning 550x / 30x, 46000x / 26x,
    37000x / 60x (2026-11-30).
    Other measurements: docs/checkpoints.md."""
    extra = ["optimizer.name=adamw_8bit"] if kind == "adamw_8bit" else ["lora=null"]
    one = [*base, *extra, "max_steps=4", "batch.prompts_per_rank=2"]
    ref = train(2, tmp_path / "reference", *base, *extra, "max_steps=4")
    stage = "zero3.json" if kind == "adamw_8bit" else "zero2.json"  # of the 1-rank runs
    solo = train(1, tmp_path / "solo", *one, ds_config=stage)
    moved = train(1, branch(ref, tmp_path / "moved", 2), *one, "resume_from=auto", ds_config=stage)
    dropped = train(1, drop_moments(branch(ref, tmp_path / "dropped", 2), 2), *one, "resume_from=auto", ds_config=stage)
    a, b, c, d = (weights(run, 4, tmp_path) for run in (ref, moved, solo, dropped))
    at_2 = universal_state(ckpt(moved, 2) / portable.UNIVERSAL)  # the reference's step 2, converted by the move
    for key in ("fp32", "exp_avg", "exp_avg_sq"):
        scale = max(v[key].abs().max().item() for v in a.values())
        moved_off, solo_off, dropped_off = state_diff(a, b, key), state_diff(a, c, key), state_diff(a, d, key)
        steps_3_4 = state_diff(a, at_2, key)
        bound = min(2 * solo_off, 0.05 * steps_3_4) + 1e-7 * scale
        print(
            f"{kind} {key}: moved {moved_off:.3g}, 1 rank from the start {solo_off:.3g}, steps 3-4 {steps_3_4:.3g}, "
            f"moments dropped {dropped_off:.3g}, largest {scale:.3g}: bound {bound:.3g}"
        )
        assert moved_off <= bound, (key, moved_off, bound)
        assert dropped_off > bound, (key, dropped_off, bound)  # the bound tells a resume from a restart


# pixel_mse (the tiny config's reward, the same values) writing the dataset rows of each rollout it scores, one line
# per call, to ``to``/rank_<r>.jsonl: every step's prompts, which neither metrics.jsonl nor the log names
RECORDER = """
import json
import os
from pathlib import Path

from glm_grpo_ds.rewards.pixel import PixelMSEReward


class Recorded(PixelMSEReward):
    def __call__(self, images, prompts, samples):
        to = Path({to!r})
        to.mkdir(exist_ok=True)
        with open(to / f"rank_{{os.environ['RANK']}}.jsonl", "a") as f:
            f.write(json.dumps(list(dict.fromkeys(s["index"] for s in samples))) + "\\n")
        return super().__call__(images, prompts, samples)


pixel_mse = Recorded()
"""


def scored_rows(run, record):
    """The dataset rows of each rollout ``run`` scored, in order (a step's, drawn ahead or not), every rank's in rank
    order (the sampler's global order): ``record``, what the recording reward wrote, moved into ``run``."""
    record.rename(run / "scored_rows")
    files = sorted((run / "scored_rows").glob("rank_*.jsonl"), key=lambda f: int(f.stem.split("_")[1]))
    return [sum(calls, []) for calls in zip(*(jsonl(f) for f in files), strict=True)]


def test_a_one_step_off_run_samples_its_pending_rollout_again_on_the_new_ranks(base, tmp_path):
    """rollout.one_step_off, 2 ranks -> 1 at step 2: the rollouts the old ranks drew ahead for step 3 are cut for them;
    the same prompts are sampled again on the one rank (said in the log), so step 3 trains on the prompts the
    uninterrupted run trained on at step 3 (its reward: a sample of the same prompts with one-step-newer weights),
    step 4 on its step 4's, and checkpoint 4 holds the same position in the prompts."""
    record = tmp_path / "scored"
    plugin = tmp_path / "recorded.py"
    plugin.write_text(RECORDER.format(to=str(record)))
    off = [
        "rollout.one_step_off=true",
        "grpo.sampler_correction=token_truncate",
        f"rewards=[{{name: '{plugin}:pixel_mse'}}]",
    ]
    ref = train(2, tmp_path / "reference", *base, *off, "max_steps=4")
    ref_rows = scored_rows(ref, record)
    moved = train(1, branch(ref, tmp_path / "moved", 2), *base, *off, "max_steps=4", "batch.prompts_per_rank=2",
                  "resume_from=auto")  # fmt: skip
    log = (moved / "logs" / "rank_0.log").read_text()
    assert "the rollout step_000002 drew ahead for step 3 is sampled again on this run's ranks" in log
    a, b = metrics(ref), metrics(moved)
    assert [r["step"] for r in b] == [1, 2, 3, 4] and len(a) == 4
    assert [r["rollout_overlapped"] for r in b[2:]] == [True, True]  # step 3 from the pending draw, step 4 ahead
    # the prompts scored at steps 1-4 (none ahead of the last), and the sampler's position checkpoint 4 saved
    moved_rows = scored_rows(moved, record)
    sampler = [json.loads((ckpt(run, 4) / "trainer_state.json").read_text())["sampler"] for run in (ref, moved)]
    print(f"prompts scored: uninterrupted {ref_rows}, moved {moved_rows}; samplers at step 4: {sampler}")
    assert len(ref_rows) == 4 and all(len(set(rows)) == 2 for rows in ref_rows), ref_rows
    assert moved_rows == ref_rows[2:]  # steps 3 and 4: the same prompts, in the same order
    assert sampler[0] == sampler[1]
    # the same 2 ranks with 2 prompts each (a warned batch change): the pending draw of 1 per rank is not step 3's
    # (taken, it crashed the step); its prompts come first, sampled anew with the next ones
    wider = train(2, branch(ref, tmp_path / "wider", 2), *base, *off, "max_steps=4", "batch.prompts_per_rank=2",
                  "resume_from=auto")  # fmt: skip
    log = (wider / "logs" / "rank_0.log").read_text()
    assert "drew ahead holds 1 prompts per rank, this run takes 2: its 2 prompts come first in the next steps" in log
    assert [r["step"] for r in metrics(wider)] == [1, 2, 3, 4]
    wider_rows = scored_rows(wider, record)  # step 3 on-policy, step 4 drawn ahead
    assert len(wider_rows) == 2 and wider_rows[0][:2] == ref_rows[2], wider_rows


def test_a_converted_folder_not_made_from_its_checkpoint_is_refused_in_one_line(chain, base, tmp_path):
    """Exit 2, one line, before anything is written (the refused global batch: test_checkpoint_resume.py; a stage
    without ZeRO partitions: test_bad_inputs.py)."""
    run = branch(chain["reference"], tmp_path / "refused", 2)
    (ckpt(run, 2) / portable.UNIVERSAL).mkdir()
    (ckpt(run, 2) / portable.UNIVERSAL / portable.SOURCE).write_text(json.dumps({"other": 1}))
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    proc = run_train(*base, "max_steps=4", "batch.prompts_per_rank=2", "resume_from=auto", f"output_dir={run}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    ours = [line for line in proc.stderr.splitlines() if line.startswith("glm-grpo train:")]
    assert len(ours) == 1 and "was not converted from" in ours[0] and "delete" in ours[0], proc.stderr[-2000:]
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before


def test_mini_batches_train_the_same_run_on_one_and_two_ranks(base, tmp_path):
    """batch.mini_batches 2: each optimizer step trains the same samples (the first, then the second half of each
    group's: update.py mini_batch_order), with the same sampling streams, on 1 rank x 2 prompts as on 2 ranks x 1, so
    2 steps give the same rewards and adapter. Compared by the lora_B weights' relative distance (they start at 0):
    from a fresh start Adam's first steps turn fp32 reduction-order noise in near-zero gradients into whole lr-sized
    steps of single weights, which a norm leaves small: 1.7e-5 measured; with whole prompts as 1 rank's
    mini-batches and each group's halves as 2 ranks' (before mini_batch_order) it was 1.1."""
    extra = ["batch.mini_batches=2", "max_steps=2", "batch.micro_batch_size=2"]
    two = adapter(train(2, tmp_path / "two", *base, *extra, "batch.prompts_per_rank=1"), 2)
    one = adapter(train(1, tmp_path / "one", *base, *extra, "batch.prompts_per_rank=2"), 2)
    b = [k for k in one if "lora_B" in k]
    distance = sum(((two[k] - one[k]) ** 2).sum() for k in b).sqrt() / sum((one[k] ** 2).sum() for k in b).sqrt()
    print(f"lora_B relative distance, 2 ranks x 1 prompt vs 1 rank x 2: {distance:.2g}")
    assert distance < 1e-2, distance
    for x, y in zip(metrics(tmp_path / "two"), metrics(tmp_path / "one"), strict=True):
        assert x["reward_mean"] == pytest.approx(y["reward_mean"], abs=1e-5), x["step"]
